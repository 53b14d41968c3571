"""The cluster key (docs/security.md) with real daemons: a cluster whose config names
auth: {key_file} serves clients that prove the key - locally, over the shared-memory channel, and
remotely, its data plane serving only the ranges the master granted - and refuses everything else
with fluxon.PermissionDenied, counted, the daemons unharmed."""

import ctypes
import hashlib
import hmac
import json
import mmap
import os
import random
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

import fluxon
from conftest import FLUXON_BIN, Cluster, free_port, labelled, sample, scrape

DATA_MAGIC = 0x50445846  # "FXDP"
AUTH_MAGIC = 0x41445846  # "FXDA"
PERMISSION_DENIED = 4    # DataStatus::kPermissionDenied


def keygen(path: Path) -> Path:
    out = subprocess.run([FLUXON_BIN, "keygen", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return path


def key_bytes(path: Path) -> bytes:
    text = path.read_text().split()
    assert text[0] == "fluxon-key-v1"
    return bytes.fromhex(text[1])


def mac(key: bytes, label: str, *parts: bytes) -> bytes:
    """runtime/auth.cpp's AuthKey::mac: HMAC-SHA256 over length-prefixed parts."""
    data = b"".join(struct.pack("<I", len(p)) + p for p in (label.encode(), *parts))
    return hmac.new(key, data, hashlib.sha256).digest()


def grant(key: bytes, node: int, gen: int, source_gen: int, offset: int, length: int, expires: int) -> bytes:
    m = mac(key, "fluxon-grant-v1", *(struct.pack("<Q", v) for v in (node, gen, source_gen, offset, length, expires)))
    return struct.pack("<Q", expires) + m[:16]


def recv_exact(s: socket.socket, n: int) -> bytes:
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        if not chunk:
            raise ConnectionError(f"closed after {len(b)} of {n} bytes")
        b += chunk
    return b


class DataPeer:
    """A hand-made reader of an owner's data port, speaking the keyed protocol (transport.hpp)."""

    def __init__(self, port: int):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        magic, version, self.challenge = struct.unpack("<II16s", recv_exact(self.s, 24))
        assert magic == AUTH_MAGIC and version == 1

    def hello(self, key: bytes, node: int, gen: int, replay: bytes = None):
        """Sends a hello (or `replay`, one recorded elsewhere): (status, the hello sent)."""
        if replay is None:
            nonce = os.urandom(16)
            who = struct.pack("<IQ", node, gen)
            proof = mac(key, "fluxon-auth-v1 client", b"data", self.challenge, nonce, who)
            replay = struct.pack("<IIQ16s32s", AUTH_MAGIC, node, gen, nonce, proof)
        self.s.sendall(replay)
        magic, status, _ = struct.unpack("<II32s", recv_exact(self.s, 40))
        assert magic == AUTH_MAGIC
        return status, replay

    def read(self, source_gen: int, ranges, grants):
        """One request: (status, the bytes)."""
        self.s.sendall(struct.pack("<IIQII", DATA_MAGIC, 1, source_gen, len(ranges), 0)
                       + b"".join(struct.pack("<QQ", o, n) for o, n in ranges) + b"".join(grants))
        magic, status, total = struct.unpack("<IIQ", recv_exact(self.s, 16))
        assert magic == DATA_MAGIC
        return status, recv_exact(self.s, total) if status == 0 else b""

    def close(self):
        self.s.close()


def segment_generation(cluster: str, node: int) -> int:
    names = [n for n in os.listdir("/dev/shm") if n.startswith(f"fluxon.{cluster}.{node}.")]
    assert len(names) == 1, names
    return int(names[0].rsplit(".", 1)[1])


def put(c, keys, size, seed):
    rnd = random.Random(seed)
    vals = {k: rnd.randbytes(size) for k in keys}
    p = c.local_fast_put_start(keys, size)
    for k, ptr in zip(keys, fluxon.plan_pointers(p)):
        ctypes.memmove(ptr, vals[k], size)
    c.local_fast_put_commit(p).result(20)
    return vals


def read(c, keys, size):
    h, r = c.get_start(keys)
    assert r.transferable_len == len(keys), r
    rp = c.get_transfer(h)
    out = [ctypes.string_at(p, size) for p in fluxon.plan_pointers(rp)]
    c.release_views(rp)
    return out


@pytest.fixture
def keyed(tmp_path):
    key = keygen(tmp_path / "cluster.key")
    dports = [free_port(), free_port()]
    c = Cluster(tmp_path, f"auth{os.getpid()}x{free_port()}", owners=2, metrics=True, key_file=str(key),
                owner_extra=[f"data_port: {p}\ndata_timeout_ms: 2000" for p in dports])
    c.data_ports = dports
    c.start()
    yield c
    c.stop()


def test_keygen_writes_a_0600_key_and_never_overwrites_one(tmp_path):
    k = keygen(tmp_path / "k")
    assert (k.stat().st_mode & 0o777) == 0o600
    assert len(key_bytes(k)) == 32
    again = subprocess.run([FLUXON_BIN, "keygen", str(k)], capture_output=True, text=True, timeout=30)
    assert again.returncode != 0 and "never overwritten" in again.stderr


def test_auth_clients_with_the_key_read_locally_and_remotely_over_granted_ranges(keyed):
    a = fluxon.KvClient(keyed.client_config(0))
    b = fluxon.KvClient(keyed.client_config(1))
    keys = [f"ak{i}" for i in range(16)]
    vals = put(a, keys, 16 << 10, 1)
    assert read(a, keys, 16 << 10) == [vals[k] for k in keys]          # local
    assert read(b, keys, 16 << 10) == [vals[k] for k in keys]          # remote: a granted fetch
    o1, o2 = scrape(keyed.owner_metrics[0]), scrape(keyed.owner_metrics[1])
    assert sample(o1, "fluxon_owner_data_served_bytes_total") == 16 * (16 << 10)
    assert labelled(o1, "fluxon_owner_auth_refused_total", what="data_range") == 0
    assert sample(o2, "fluxon_owner_auth_handshakes_total") >= 1
    m = scrape(keyed.metrics_port)
    assert sample(m, "fluxon_master_auth_handshakes_total") >= 2   # both owners proved the key
    assert sample(m, "fluxon_master_auth_failed_handshakes_total") == 0
    a.close()
    b.close()


def test_auth_no_key_or_a_wrong_key_is_refused_with_permission_denied_and_the_owner_is_unharmed(keyed, tmp_path):
    wrong = keygen(tmp_path / "wrong.key")
    with pytest.raises(fluxon.PermissionDenied, match="requires the cluster key"):
        fluxon.KvClient(keyed.client_config(0, key_file=None))
    with pytest.raises(fluxon.PermissionDenied, match="refused this process's key"):
        fluxon.KvClient(keyed.client_config(0, key_file=wrong))
    # What the owner's port answers a peer that skips the handshake: a request refused, by name,
    # and its own messages never reach it from outside.
    out = subprocess.run([FLUXON_BIN, "auth", "check", f"127.0.0.1:{keyed.owner_ports[0]}", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["auth"] == "on"
    assert seen["unproven_request"].startswith("PermissionDenied: the owner refused a request"), seen
    assert seen["internal_message"].startswith("dropped"), seen
    o = scrape(keyed.owner_metrics[0])
    assert labelled(o, "fluxon_owner_auth_failed_handshakes_total", channel="caf") == 1   # the wrong key
    assert labelled(o, "fluxon_owner_auth_refused_total", what="request") == 1           # the unproven Hello
    assert sample(o, "fluxon_owner_gate_dropped_total") == 1
    # Unharmed: a client with the key works, with nothing left of the refused ones.
    c = fluxon.KvClient(keyed.client_config(0))
    vals = put(c, ["after"], 4096, 3)
    assert read(c, ["after"], 4096) == [vals["after"]]
    assert c.stats()["owner_sessions"] == 1
    c.close()


def test_auth_a_replayed_handshake_is_refused_on_the_control_port_and_the_data_port(keyed):
    out = subprocess.run([FLUXON_BIN, "auth", "check", f"127.0.0.1:{keyed.owner_ports[0]}", "--key", keyed.key_file,
                          "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["key_proof"] == "accepted" and seen["replayed_proof"] == "refused", seen
    key = key_bytes(Path(keyed.key_file))
    first = DataPeer(keyed.data_ports[0])
    status, recorded = first.hello(key, 9, 1)
    assert status == 0
    second = DataPeer(keyed.data_ports[0])
    assert second.challenge != first.challenge
    status, _ = second.hello(key, 9, 1, replay=recorded)
    assert status == PERMISSION_DENIED
    with pytest.raises((ConnectionError, OSError)):
        second.read(0, [(0, 16)], [bytes(24)])
    first.close()
    second.close()
    o = scrape(keyed.owner_metrics[0])
    assert labelled(o, "fluxon_owner_auth_failed_handshakes_total", channel="data") == 1
    assert labelled(o, "fluxon_owner_auth_failed_handshakes_total", channel="caf") == 1


def test_auth_a_valid_reader_gets_only_the_ranges_the_master_granted_it(keyed):
    a = fluxon.KvClient(keyed.client_config(0))
    vals = put(a, ["g0", "g1"], 4096, 5)
    gen = segment_generation(keyed.name, 1)
    key = key_bytes(Path(keyed.key_file))
    peer = DataPeer(keyed.data_ports[0])
    assert peer.hello(key, 2, 77)[0] == 0      # it holds the key: the connection is its
    # No grant (zeros), and a grant of another requester: refused, nothing sent.
    assert peer.read(gen, [(0, 4096)], [bytes(24)]) == (PERMISSION_DENIED, b"")
    far = 2**62
    assert peer.read(gen, [(0, 4096)], [grant(key, 3, 77, gen, 0, 4096, far)]) == (PERMISSION_DENIED, b"")
    # The master's own grant to owner 2 for the key's slot: a remote get through owner 2 shows
    # where it is (owner 1 served that range); the same range granted to this peer reads the bytes.
    b = fluxon.KvClient(keyed.client_config(1))
    assert read(b, ["g0"], 4096) == [vals["g0"]]
    with open(Path("/dev/shm") / f"fluxon.{keyed.name}.1.{gen}", "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            offset = m.find(vals["g0"])
    assert offset >= 0
    ok = peer.read(gen, [(offset, 4096)], [grant(key, 2, 77, gen, offset, 4096, far)])
    assert ok == (0, vals["g0"])
    # One byte more than granted: refused.
    assert peer.read(gen, [(offset, 4097)], [grant(key, 2, 77, gen, offset, 4096, far)]) == (PERMISSION_DENIED, b"")
    peer.close()
    o = scrape(keyed.owner_metrics[0])
    assert labelled(o, "fluxon_owner_auth_refused_total", what="data_range") == 3
    a.close()
    b.close()


def test_auth_a_key_rotated_by_restart_locks_out_the_old_key(keyed, tmp_path):
    old = tmp_path / "old.key"
    old.write_bytes(Path(keyed.key_file).read_bytes())
    old.chmod(0o600)
    c = fluxon.KvClient(keyed.client_config(0))
    put(c, ["before"], 4096, 7)
    c.close()
    keyed.stop()
    os.unlink(keyed.key_file)
    keygen(Path(keyed.key_file))
    keyed.start()
    with pytest.raises(fluxon.PermissionDenied):
        fluxon.KvClient(keyed.client_config(0, key_file=old))
    with pytest.raises(fluxon.PermissionDenied):
        fluxon.KvClient(keyed.client_config(1, key_file=old))
    fresh = fluxon.KvClient(keyed.client_config(0))
    vals = put(fresh, ["after"], 4096, 8)
    assert read(fresh, ["after"], 4096) == [vals["after"]]
    fresh.close()


def test_auth_an_owner_with_another_key_never_joins_the_master(tmp_path):
    key = keygen(tmp_path / "cluster.key")
    other = keygen(tmp_path / "other.key")
    c = Cluster(tmp_path, f"authj{os.getpid()}x{free_port()}", owners=1, metrics=True, key_file=str(key))
    c.start_master()
    # The owner's config names another key: it starts, cannot register, says why, and retries.
    c.config.write_text(c.config.read_text().replace(str(key), str(other)))
    try:
        c.start_owner(0)
        deadline = time.time() + 20
        log = tmp_path / "owner-1.log"
        while "refused this process's key" not in log.read_text(errors="replace"):
            assert time.time() < deadline, log.read_text()
            time.sleep(0.2)
        m = scrape(c.metrics_port)
        assert sample(m, "fluxon_master_auth_failed_handshakes_total") >= 1
        assert sample(m, "fluxon_master_owners") == 0
    finally:
        c.stop()


def test_without_auth_a_non_loopback_listen_address_is_refused_by_name(tmp_path):
    cfg = tmp_path / "open.yaml"
    cfg.write_text("cluster_name: open\nmaster: {listen_host: 0.0.0.0}\n"
                   "owners: [{node_id: 1, contribute_to_cluster_pool_size: {dram: 64MiB}, "
                   "local_reserve_grant_bytes: 16MiB}]\n")
    out = subprocess.run([FLUXON_BIN, "master", "--config", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "master.listen_host: '0.0.0.0' is not a loopback address" in out.stderr
    # A relative key_file is the config file's neighbour.
    keygen(tmp_path / "k.key")
    cfg.write_text(cfg.read_text() + "auth: {key_file: k.key}\n")
    out = subprocess.run([FLUXON_BIN, "config", "check", str(cfg)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"key_file: {tmp_path}/k.key" in out.stdout
