"""Real processes: master and owner daemons, external clients in other processes, faults."""

import ctypes
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time

import pytest

import fluxon
from conftest import ROOT, BUILD, FLUXON_BIN, Cluster, free_port, labelled, metric, pause, sample, scrape, wait_metric, wait_port


def test_external_client_maps_the_owner_segment(cluster):
    c = fluxon.KvClient(cluster.client_config())
    seg = c.wait_local_segments_ready()[0]
    assert seg["segment_label"] == "external_owner:0"
    assert seg["node_id"] == 1
    shm = [f for f in os.listdir("/dev/shm") if f.startswith(f"fluxon.{cluster.name}.1.")]
    assert len(shm) == 1
    st = os.stat("/dev/shm/" + shm[0])
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert shm[0].endswith(str(seg["generation"]))
    p = c.local_fast_put_start(["x0", "x1"], 8192)
    ptrs = fluxon.plan_pointers(p)
    ctypes.memmove(ptrs[0], b"hello-owner" * 10, 110)
    ctypes.memmove(ptrs[1], b"second-value", 12)
    c.local_fast_put_commit(p).result(10)
    # The bytes are in the owner's segment itself, at the offset the plan named.
    with open("/dev/shm/" + shm[0], "rb") as f:
        f.seek(ptrs[0] - seg["write_ptr"])
        assert f.read(110) == b"hello-owner" * 10
    # A second external client in another process reads them back through a get plan.
    code = textwrap.dedent(f"""
        import sys, ctypes
        sys.path.insert(0, {str(BUILD / 'python')!r})
        import fluxon
        c = fluxon.KvClient({cluster.client_config()!r})
        h, r = c.get_start(["x0", "x1", "x2"])
        rp = c.get_transfer(h)
        ptrs = fluxon.plan_pointers(rp)
        print(r.transferable_len, ctypes.string_at(ptrs[0], 110).decode(), ctypes.string_at(ptrs[1], 12).decode())
        c.release_views(rp)
        c.close()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "hello-owner" * 10, "second-value"]
    s = c.stats()
    assert s["owner_sessions"] == 1  # the other process's session is gone
    c.close()


def test_segment_removed_when_owner_stops(cluster):
    prefix = f"fluxon.{cluster.name}.1."
    assert any(f.startswith(prefix) for f in os.listdir("/dev/shm"))
    cluster.stop_owner(0)
    assert not any(f.startswith(prefix) for f in os.listdir("/dev/shm"))


def test_a_killed_owners_segment_is_removed_by_its_guardian(cluster):
    """SIGKILL gives the owner no chance to unlink its segment: the guardian it left does, at once,
    without waiting for the node's next owner (nothing stays taken in /dev/shm)."""
    prefix = f"fluxon.{cluster.name}.1."
    assert [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]
    cluster.stop_owner(0, signal.SIGKILL)
    end = time.time() + 5
    while [f for f in os.listdir("/dev/shm") if f.startswith(prefix)] and time.time() < end:
        time.sleep(0.01)
    assert not [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]


def test_stale_segment_of_a_killed_owner_is_removed_on_restart(cluster):
    """Where no guardian removed it (it was killed too), the node's next owner removes a stale
    segment: one whose creator's lock is free."""
    prefix = f"fluxon.{cluster.name}.1."
    cluster.stop_owner(0)
    stale = f"/dev/shm/{prefix}12345"
    with open(stale, "wb") as f:
        f.truncate(1 << 20)
    try:
        cluster.start_owner(0)
        now = [f for f in os.listdir("/dev/shm") if f.startswith(prefix)]
        assert len(now) == 1 and now[0] != f"{prefix}12345"
    finally:
        if os.path.exists(stale):
            os.unlink(stale)


def _guardian_of(owner_pid: int) -> int:
    """The guardian an owner left: a process of the same command line in a session of its own."""
    with open(f"/proc/{owner_pid}/cmdline", "rb") as f:
        cmd = f.read()
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != owner_pid:
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if f.read() == cmd:
                        return int(d)
            except OSError:
                pass
    raise AssertionError("no guardian found")


def _plant_segment(name: str) -> str:
    path = f"/dev/shm/{name}"
    with open(path, "wb") as f:
        f.truncate(1 << 20)
    return path


def test_cleanup_removes_dead_owners_segments_only_of_its_cluster(cluster):
    """An owner killed together with its guardian leaves its segment: `fluxon cluster cleanup` removes
    it, keeps the live owner's, and never touches another cluster's, even one whose name starts with
    this one's; `fluxon cluster down` sweeps too."""
    other = [_plant_segment(f"fluxon.{cluster.name}.b.1.5"),  # cluster "<name>.b"
             _plant_segment(f"fluxon.{cluster.name}x.1.5"),  # cluster "<name>x"
             _plant_segment(f"fluxon.{cluster.name}.1.5.tmp")]  # not a segment name
    try:
        run = lambda *a: subprocess.run([FLUXON_BIN, *a], capture_output=True, text=True, timeout=60)
        segs = lambda: [f for f in os.listdir("/dev/shm") if re.fullmatch(rf"fluxon\.{cluster.name}\.1\.\d+", f)]
        owner = cluster.owners[0]
        (live,) = segs()
        guardian = _guardian_of(owner.pid)
        os.kill(guardian, signal.SIGKILL)
        cluster.stop_owner(0, signal.SIGKILL)
        time.sleep(0.2)
        assert os.path.exists(f"/dev/shm/{live}")  # nobody left to remove it
        cluster.start_owner(0)  # a new owner of the cluster: its start sweeps the dead one
        assert not os.path.exists(f"/dev/shm/{live}")
        assert "removed the segment of a dead owner" in (cluster.logs / "owner-1.log").read_text()
        (live,) = segs()
        dead = _plant_segment(f"fluxon.{cluster.name}.7.123")  # a dead owner of another node
        out = run("cluster", "cleanup", str(cluster.config))
        assert out.returncode == 0, out.stderr
        assert f"removed    /dev/shm/fluxon.{cluster.name}.7.123" in out.stdout, out.stdout
        assert f"kept       /dev/shm/{live}" in out.stdout, out.stdout
        assert "1 dead segment(s) removed" in out.stdout and "1 live kept" in out.stdout, out.stdout
        assert not os.path.exists(dead) and os.path.exists(f"/dev/shm/{live}")
        assert all(os.path.exists(p) for p in other)
        c = fluxon.KvClient(cluster.client_config())  # the live owner is unharmed
        p = c.local_fast_put_start(["after-cleanup"], 4096)
        ctypes.memset(fluxon.plan_pointers(p)[0], 5, 4096)
        c.local_fast_put_commit(p).result(10)
        h, r = c.get_start(["after-cleanup"])
        rp = c.get_transfer(h)
        assert r.all_hit and ctypes.string_at(fluxon.plan_pointers(rp)[0], 4096) == b"\x05" * 4096
        c.release_views(rp)
        c.close()
        dead = _plant_segment(f"fluxon.{cluster.name}.8.9")
        down = run("cluster", "down", str(cluster.config))  # the pytest cluster has no pid files
        assert down.returncode == 0 and f"removed    /dev/shm/fluxon.{cluster.name}.8.9" in down.stdout, down.stdout
        assert not os.path.exists(dead) and os.path.exists(f"/dev/shm/{live}")
        assert all(os.path.exists(p) for p in other)
    finally:
        for p in other:
            if os.path.exists(p):
                os.unlink(p)


def test_owner_restart_gives_generation_mismatch_never_stale_memory(cluster):
    c = fluxon.KvClient(cluster.client_config())
    gen0 = c.wait_local_segments_ready()[0]["generation"]
    ks = ["g0", "g1"]
    p = c.local_fast_put_start(ks, 4096)
    ctypes.memset(fluxon.plan_pointers(p)[0], 1, 4096)
    c.local_fast_put_commit(p).result(10)
    h, _ = c.get_start(ks)
    open_plan = c.local_fast_put_start(["g2"], 4096)
    cluster.stop_owner(0, signal.SIGKILL)
    cluster.start_owner(0)
    with pytest.raises(fluxon.GenerationMismatch):
        c.get_start(ks)
    with pytest.raises(fluxon.GenerationMismatch):
        c.get_transfer(h)
    with pytest.raises(fluxon.GenerationMismatch):
        c.local_fast_put_commit(open_plan)
    with pytest.raises(fluxon.GenerationMismatch):
        c.local_fast_put_start(["g3"], 4096)
    seg = c.wait_local_segments_ready()[0]
    assert seg["generation"] != gen0
    h2, r2 = c.get_start(ks)
    assert r2.transferable_len == 0  # the old memory is gone, not served stale
    c.cancel_get_transfer(h2)
    c.local_fast_put_commit(c.local_fast_put_start(ks, 4096)).result(10)
    c.close()


def test_malformed_messages_are_rejected_and_the_daemon_survives(cluster):
    c = fluxon.KvClient(cluster.client_config())
    for junk in (b"", b"\x00" * 3, b"\xff" * 64, os.urandom(4096), b"\x10\x00\x00\x00" + b"\x00" * 12):
        with pytest.raises(fluxon.MalformedMessage):
            c._c._send_raw_for_test(junk)
    # garbage on the TCP ports of the owner and the master (not even the CAF protocol)
    for port in (cluster.owner_ports[0], cluster.master_port):
        for junk in (os.urandom(1000), b"GET / HTTP/1.0\r\n\r\n", b"\x00" * 100000):
            with socket.create_connection(("127.0.0.1", port)) as s:
                try:
                    s.sendall(junk)
                except OSError:
                    pass
    time.sleep(0.3)
    assert cluster.owners[0].poll() is None and cluster.master.poll() is None
    c.local_fast_put_commit(c.local_fast_put_start(["after-junk"], 4096)).result(10)
    h, r = c.get_start(["after-junk"])
    assert r.all_hit
    c.cancel_get_transfer(h)
    c.close()


def test_dead_client_process_releases_its_holdings(cluster):
    c = fluxon.KvClient(cluster.client_config())
    c.local_fast_put_commit(c.local_fast_put_start(["d0", "d1"], 4096)).result(10)
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(BUILD / 'python')!r})
        import fluxon
        c = fluxon.KvClient({cluster.client_config()!r})
        h, r = c.get_start(["d0", "d1"])
        c.local_fast_put_start(["d2"], 4096)
        print("held", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    s = c.stats()
    assert s["holders"] == 2 and s["slots_prepared"] == 1
    p.kill()
    p.wait()
    for _ in range(100):
        s = c.stats()
        if s["holders"] == 0 and s["slots_prepared"] == 0:
            break
        time.sleep(0.05)
    assert s["holders"] == 0 and s["slots_prepared"] == 0 and s["owner_active_get_handles"] == 0
    c.close()


def test_metrics_endpoints(tmp_path):
    cluster = Cluster(tmp_path, f"metrics{free_port()}", metrics=True).start()
    try:
        check_metrics(cluster)
    finally:
        cluster.stop()


def check_metrics(cluster):
    c = fluxon.KvClient(cluster.client_config())
    c.local_fast_put_commit(c.local_fast_put_start(["m0", "m1", "m2"], 4096)).result(10)
    h, _ = c.get_start(["m0", "zz"])
    c.cancel_get_transfer(h)
    with pytest.raises(fluxon.MalformedMessage):
        c._c._send_raw_for_test(b"\xff" * 32)
    assert c.exists_prefix(["m0", "m1"]).prefix_len == 2
    c.local_fast_put_commit(c.local_fast_put_start(["gone:x"], 4096)).result(10)
    assert c.remove_prefix("gone:") == 1
    owner = scrape(cluster.owner_metrics[0])
    # Every counter of the one declaration is exported (runtime/include/fluxon/owner/owner_counters.hpp).
    import re
    table = (ROOT / "runtime/include/fluxon/owner/owner_counters.hpp").read_text()
    families = set(re.findall(r'X\(\w+, "(fluxon_owner_\w+)"', table))
    assert len(families) > 60
    for fam in families:
        assert f"# TYPE {fam} counter" in owner, fam
    assert "fluxon_owner_exists_total 1" in owner
    assert "fluxon_owner_removed_by_prefix_total 1" in owner
    mtable = (ROOT / "runtime/include/fluxon/master/master_counters.hpp").read_text()
    mfamilies = set(re.findall(r'X\(\w+, "(fluxon_master_\w+)"', mtable))
    assert len(mfamilies) > 40
    assert 'fluxon_owner_slots{state="committed"} 3' in owner
    assert "fluxon_owner_put_start_total 2" in owner
    assert "fluxon_owner_get_start_total 1" in owner
    assert "fluxon_owner_get_hit_keys_total 1" in owner
    assert "fluxon_owner_errors_total" in owner
    master = scrape(cluster.metrics_port)
    for fam in mfamilies:
        assert f"# TYPE {fam} counter" in master, fam
    assert "fluxon_master_routes 3" in master
    assert "fluxon_master_put_done_total" in master
    c.close()


def test_metrics_can_be_disabled(tmp_path):
    cl = Cluster(tmp_path, f"nometrics{free_port()}", metrics=False).start()
    try:
        assert cl.metrics_port == 0
        c = fluxon.KvClient(cl.client_config())
        c.close()
    finally:
        cl.stop()


def test_cli_cluster_up_status_down_and_demo(tmp_path):
    cl = Cluster(tmp_path, f"cli{free_port()}", owners=2, metrics=False)
    run = lambda *a: subprocess.run([FLUXON_BIN, *a], capture_output=True, text=True, timeout=120)
    up = run("cluster", "up", str(cl.config))
    assert up.returncode == 0, up.stderr
    st = run("cluster", "status", str(cl.config))
    assert st.returncode == 0 and st.stdout.count("running") == 3, st.stdout
    client_cfg = tmp_path / "client.yaml"
    client_cfg.write_text(f"cluster_name: {cl.name}\nclient: {{owner_address: 127.0.0.1:{cl.owner_ports[1]}}}\n")
    demo = run("demo", "--config", str(client_cfg))
    assert demo.returncode == 0 and "demo: ok" in demo.stdout, demo.stdout + demo.stderr
    assert "external_owner:0" in demo.stdout
    down = run("cluster", "down", str(cl.config))
    assert down.returncode == 0
    st2 = run("cluster", "status", str(cl.config))
    assert st2.returncode != 0 and "running" not in st2.stdout.replace("not", "")
    assert not any(f.startswith(f"fluxon.{cl.name}.") for f in os.listdir("/dev/shm"))


def test_embedded_demo():
    out = subprocess.run([FLUXON_BIN, "demo"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "demo: ok" in out.stdout and "cpu:0" in out.stdout
    # A summary a person reads (every line short), every figure on request.
    assert "owner: 12 keys put, 16 read (12 hits)" in out.stdout, out.stdout
    assert max(len(l) for l in out.stdout.splitlines()) < 200 and "stats:" not in out.stdout
    full = subprocess.run([FLUXON_BIN, "demo", "--stats"], capture_output=True, text=True, timeout=60)
    assert full.returncode == 0 and " put_keys_total=12 " in full.stdout and "evicted_keys_total=0" in full.stdout


def test_bad_config_names_the_field(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("owners: [{local_reserve_hard_timeout_ms: 5, local_reserve_soft_wait_ms: 10}]\n")
    out = subprocess.run([FLUXON_BIN, "owner", "--config", str(f)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "local_reserve_hard_timeout_ms" in out.stderr
    with pytest.raises(fluxon.InvalidArgument, match="owner-only"):
        fluxon.KvClient({"client": {"owner_address": "127.0.0.1:1", "get_handle_ttl_ms": 5}})
    with pytest.raises(fluxon.Closed):
        fluxon.KvClient({"owner_address": f"127.0.0.1:{free_port()}"})


def test_local_reserve_timeout_names_its_stage(tmp_path):
    cl = Cluster(tmp_path, f"rto{free_port()}", metrics=False,
                 owner_extra="local_reserve_hard_timeout_ms: 300\nlocal_reserve_soft_wait_ms: 10").start()
    try:
        c = fluxon.KvClient(cl.client_config())
        p = c.local_fast_put_start([f"f{i}" for i in range(16)], 16 << 20)  # the whole pool
        t = time.time()
        with pytest.raises(fluxon.LocalReserveTimeout) as e:
            c.local_fast_put_start(["one-more"], 16 << 20)
        assert e.value.stage == "refill" and time.time() - t >= 0.25
        c.put_abort(p)
        c.local_fast_put_commit(c.local_fast_put_start(["one-more"], 16 << 20)).result(10)
        c.close()
    finally:
        cl.stop()


def test_handle_ttl_in_a_real_owner(tmp_path):
    cl = Cluster(tmp_path, f"ttl{free_port()}", metrics=False, owner_extra="get_handle_ttl_ms: 400").start()
    try:
        c = fluxon.KvClient(cl.client_config())
        c.local_fast_put_commit(c.local_fast_put_start(["t0"], 4096)).result(10)
        h, _ = c.get_start(["t0"])
        assert c.stats()["holders"] == 1
        time.sleep(0.6)
        assert c.stats()["holders"] == 0  # the owner released the forgotten handle
        with pytest.raises(fluxon.Timeout):
            c.get_transfer(h)  # and the client never hands out its addresses
        c.close()
    finally:
        cl.stop()


def test_master_restart_owner_resyncs_and_puts_complete(tmp_path):
    """Kill the master: local puts and gets go on (V1), their futures wait; a new master gets every
    live route back from the owner, and the futures complete (T1)."""
    cl = Cluster(tmp_path, f"mr{free_port()}", metrics=True).start()
    try:
        c = fluxon.KvClient(cl.client_config())
        c.local_fast_put_commit(c.local_fast_put_start([f"before{i}" for i in range(5)], 4096)).result(10)
        cl.master.kill()
        cl.master.wait()
        fut = c.local_fast_put_commit(c.local_fast_put_start([f"during{i}" for i in range(3)], 4096))
        h, r = c.get_start([f"during{i}" for i in range(3)])
        assert r.all_hit  # V1: local reads never wait for the master
        c.cancel_get_transfer(h)
        assert not fut.wait(0.5)  # the routes cannot be live without a master
        cl.start_master()
        fut.result(20)
        for _ in range(20):
            if "fluxon_master_routes 8" in scrape(cl.metrics_port):
                break
        assert "fluxon_master_routes 8" in scrape(cl.metrics_port)
        assert "fluxon_owner_resync_routes_total 5" in scrape(cl.owner_metrics[0])
        c.close()
    finally:
        cl.stop()


def test_t1_fault_points_with_real_processes_under_dropped_duplicated_delayed_master_requests(tmp_path):
    """The owner drops, duplicates and delays its PutDone/RemoveRoutes requests (seeded): every
    batch still ends with one route and one slot per key, and every future completes once."""
    cl = Cluster(tmp_path, f"fi{free_port()}", metrics=True, owner_extra=(
        "publish_retry_ms: 50\n"
        "fault_injection: {seed: 7, drop: 0.4, duplicate: 0.4, max_delay_ms: 30}")).start()
    try:
        c = fluxon.KvClient(cl.client_config())
        futs = []
        for b in range(20):
            p = c.local_fast_put_start([f"fi{b}-{i}" for i in range(8)], 4096,
                                       fluxon.PutOptionalArgs(atomic_group_lens=[4, 4]))
            futs.append(c.local_fast_put_commit(p))
        for f in futs:
            f.result(30)
        # overwrite some keys: route removals go through the same faults
        p = c.local_fast_put_start([f"fi0-{i}" for i in range(8)], 4096,
                                   fluxon.PutOptionalArgs(reject_if_exist_same_key=False))
        c.local_fast_put_commit(p).result(30)
        for _ in range(100):
            s = c.stats()
            if s["publish_jobs"] == 0:
                break
            time.sleep(0.05)
        assert s["slots_committed"] == 160 and s["routes"] == 160 and s["slots_pending_local_visible"] == 0
        assert "fluxon_master_routes 160" in scrape(cl.metrics_port)
        owner = scrape(cl.owner_metrics[0])
        assert "fluxon_owner_publish_retry_total 0" not in owner  # the faults did bite
        # The fault point the simulation drives (tests/sim/driver_test.cpp) fired here, counted by name.
        fired = {f: labelled(owner, "fluxon_owner_faults_injected_total", point="master_request", fault=f)
                 for f in ("dropped", "duplicated", "delayed")}
        assert all(n > 0 for n in fired.values()), fired
        c.close()
    finally:
        cl.stop()
    assert "fault injection: seed=7 master requests drop=0.40" in (tmp_path / "owner-1.log").read_text()


def test_reclaim_under_injected_master_faults_in_real_processes(tmp_path):
    """Capacity eviction through the fenced reclaim while the owner daemon drops, duplicates and
    delays its master requests (Fence, Commit, Abort, PutDone alike): every hit reads the bytes its
    put wrote, and at rest S4 holds to the byte (evicted = committed + restored + obsolete, nothing
    pending), no transaction is left at the owner and no fence at the master."""
    cl = Cluster(tmp_path, f"rcf{free_port()}", metrics=True, owner_extra=(
        "publish_retry_ms: 50\n"
        "eviction_free_watermark: 0.2\n"
        "fault_injection: {seed: 11, drop: 0.3, duplicate: 0.3, max_delay_ms: 20}")).start()
    try:
        c = fluxon.KvClient(cl.client_config())
        size = 1 << 20  # 256 slots; 50 batches of 8 overflow them

        def value(k):
            return (k.encode() * 64)[:64]

        hits = 0
        for b in range(50):
            keys = [f"r{b}-{i}" for i in range(8)]
            p = c.local_fast_put_start(keys, size, fluxon.PutOptionalArgs(atomic_group_lens=[4, 4]))
            for ptr, k in zip(fluxon.plan_pointers(p), keys):
                ctypes.memmove(ptr, value(k), 64)
            c.local_fast_put_commit(p).result(30)
            probe = list(dict.fromkeys(f"r{max(0, b - d)}-{i}" for d in (0, 3, 30) for i in (0, 5)))
            h, r = c.get_start(probe)
            if r.transferable_len:
                rp = c.get_transfer(h)
                for ptr, k in zip(fluxon.plan_pointers(rp), probe[:r.transferable_len]):
                    assert ctypes.string_at(ptr, 64) == value(k), k  # never a freed or reused slot
                hits += r.transferable_len
                c.release_views(rp)
            else:
                c.cancel_get_transfer(h)
            time.sleep(0.02)
        assert hits > 0
        port = cl.owner_metrics[0]
        end = time.time() + 15
        while time.time() < end:
            s = c.stats()
            if s["pending_eviction_reclaim_bytes"] == 0 and s["reclaims"] == 0 and s["publish_jobs"] == 0:
                break
            time.sleep(0.1)
        assert s["pending_eviction_reclaim_bytes"] == 0 and s["reclaims"] == 0
        page = scrape(port)
        evicted = sample(page, "fluxon_owner_evicted_bytes_total")
        assert evicted > 0
        ended = sum(labelled(page, "fluxon_owner_reclaim_bytes_total", end=e)
                    for e in ("committed", "restored", "obsolete"))
        assert ended == evicted
        assert labelled(page, "fluxon_owner_faults_injected_total", point="master_request", fault="dropped") > 0
        assert sample(page, "fluxon_owner_reclaim_resent_total") > 0  # the faults reached the reclaims
        master = scrape(cl.metrics_port)
        assert "fluxon_master_reclaim_fences 0" in master and "fluxon_master_reclaims 0" in master
        c.close()
    finally:
        cl.stop()


def test_pressure_evicts_ahead_of_claims_in_a_real_owner(tmp_path):
    """A full owner keeps eviction_free_watermark of its slots free by evicting cold cohorts from its
    pressure step (a round at most every eviction_interval_ms: the watermark covers what puts take
    in between), so puts do not wait for evictions; at rest every eviction is settled (S4)."""
    cluster = Cluster(tmp_path, f"press{free_port()}", metrics=True,
                      owner_extra="eviction_free_watermark: 0.2").start()
    try:
        c = fluxon.KvClient(cluster.client_config())
        size = 1 << 20  # 256 MiB of 1 MiB slots: 256 slots; 50 puts of 8 overflow it
        for b in range(50):
            keys = [f"p{b}-{i}" for i in range(8)]
            c.local_fast_put_commit(c.local_fast_put_start(keys, size)).result(20)
            time.sleep(0.05)  # 32 slots a 200 ms round apart: the watermark (51) keeps ahead
        # At rest: the last round restored the watermark and every transaction ended.
        end = time.time() + 15
        while time.time() < end:
            s = c.stats()
            if s["reclaims"] == 0 and s["pending_eviction_reclaim_bytes"] == 0 and s["slots_free"] >= 0.2 * 256 - 8:
                break
            time.sleep(0.1)
        page = scrape(cluster.owner_metrics[0])
        evicted = sample(page, "fluxon_owner_evicted_keys_total")
        assert evicted >= 50 * 8 - 256
        assert sample(page, "fluxon_owner_pressure_evictions_total") > 0
        assert sample(page, "fluxon_owner_reserve_waits_total") == 0
        # S4: every selected key's reclaim ended, and the bytes with it; nothing pending.
        ended = sum(labelled(page, "fluxon_owner_reclaim_keys_total", end=e)
                    for e in ("committed", "restored", "obsolete"))
        assert ended == evicted
        ended_bytes = sum(labelled(page, "fluxon_owner_reclaim_bytes_total", end=e)
                          for e in ("committed", "restored", "obsolete"))
        assert ended_bytes == sample(page, "fluxon_owner_evicted_bytes_total")
        assert sample(page, "fluxon_owner_pending_eviction_reclaim_bytes") == 0
        assert sample(page, "fluxon_owner_reclaims") == 0
        assert sample(page, 'fluxon_owner_slots{state="free"}') >= 0.2 * 256 - 8
        # The newest pages are still there, byte for byte readable.
        h, r = c.get_start([f"p49-{i}" for i in range(8)])
        assert r.transferable_len == 8
        c.cancel_get_transfer(h)
        c.close()
    finally:
        cluster.stop()


def test_a_stalled_owner_leaves_no_orphan_plan_behind_a_timed_out_put(cluster):
    """The owner stops answering (SIGSTOP) while a put_start is on its way; the client gives up after
    max_wait_ms + 1 s. The owner then hands out the plan to nobody: the client gave that session up,
    so the owner releases it and the key is not "inflight" forever."""
    c = fluxon.KvClient(cluster.client_config(), max_wait_ms=300)
    c.wait_local_segments_ready()
    pause(cluster.owners[0])
    try:
        with pytest.raises(fluxon.Timeout):
            c.local_fast_put_start(["orphan"], 4096)
    finally:
        cluster.owners[0].send_signal(signal.SIGCONT)
    deadline = time.time() + 10
    while True:
        try:
            plan = c.local_fast_put_start(["orphan"], 4096)
            break
        except fluxon.KeyConflict:
            assert time.time() < deadline, "the late plan of the abandoned session is never released"
            time.sleep(0.1)
    c.local_fast_put_commit(plan).result(10)
    assert c.exists_prefix(["orphan"]).prefix_len == 1
    c.close()


def test_config_check_prints_the_resolved_config_or_the_first_error_with_its_field(tmp_path):
    good = ROOT / "configs" / "reference-3host.yaml"
    r = subprocess.run([FLUXON_BIN, "config", "check", str(good)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "restrict_to_remote_only_node_roles: true" in r.stdout
    assert "replica_writeback_hot_capacity_ratio: 0.75" in r.stdout
    # What it prints is a config file of its own: checked again, the same text.
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(r.stdout)
    again = subprocess.run([FLUXON_BIN, "config", "check", str(resolved)], capture_output=True, text=True, timeout=30)
    assert again.returncode == 0 and again.stdout == r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("master: {replica_task_placement: {restrict_to_remote_only_node_roles: false}}\n"
                   "owners: [{replica_writeback_hot_capacity_ratio: 0.75}, {node_id: 2}]\n")
    r = subprocess.run([FLUXON_BIN, "config", "check", str(bad)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert "owners[0].replica_writeback_hot_capacity_ratio: needs master.replica_task_placement" in r.stderr


def test_wait_ready_returns_once_the_expected_capacity_is_faulted_in(tmp_path):
    """An owner with owner_local_reserve_expected_capacity carves its grants at start and faults them
    in off its thread; wait_ready() returns once all are in (the gauges say so, on /metrics too),
    and SGLang's backend waits for it before serving. A dynamic owner is ready at once."""
    c = Cluster(tmp_path, f"rdy{os.getpid()}x{free_port()}", owners=2, metrics=True, dram="512MiB",
                owner_extra=["owner_local_reserve_expected_capacity: {value_len: 1MiB, payload_capacity_bytes: 240MiB}",
                             ""]).start()
    try:
        a = fluxon.KvClient(c.client_config(0))
        st = a.wait_ready(60)
        assert st["warmup_bytes"] == 15 * (16 << 20)  # 16 slots of 1 MiB a 16 MiB grant: 15 grants
        assert st["warmed_bytes"] == st["warmup_bytes"]
        page = scrape(c.owner_metrics[0])
        assert sample(page, "fluxon_owner_warmed_bytes") == sample(page, "fluxon_owner_warmup_bytes") == 15 * (16 << 20)
        b = fluxon.KvClient(c.client_config(1))
        st = b.wait_ready(0)  # dynamic mode: nothing to wait for
        assert st["warmup_bytes"] == 0 and st["warmed_bytes"] == 0
        with pytest.raises(fluxon.InvalidArgument):
            a.wait_ready(-1)
        a.close()
        b.close()
    finally:
        c.stop()


def test_idle_grants_are_given_back_and_their_memory_released(tmp_path):
    """Dynamic mode: grants whose every slot stayed free for idle_grant_shrink_ms go back whole —
    the gauge says so and the shared-memory file's blocks are freed (its pages given back to the
    system); a later put carves again."""
    import glob
    name = f"shr{os.getpid()}x{free_port()}"
    c = Cluster(tmp_path, name, metrics=True, owner_extra="idle_grant_shrink_ms: 400").start()
    try:
        a = fluxon.KvClient(c.client_config())
        keys = [f"shr-{i}" for i in range(64)]
        p = a.local_fast_put_start(keys, 1 << 20)
        for ptr in fluxon.plan_pointers(p):
            ctypes.memset(ptr, 7, 1 << 20)
        a.local_fast_put_commit(p).result(20)
        (seg,) = glob.glob(f"/dev/shm/fluxon.{name}.1.*")
        used = os.stat(seg).st_blocks * 512
        assert used >= 64 << 20
        assert metric(c.owner_metrics[0], "fluxon_owner_grants") == 4  # 16 slots of 1 MiB a 16 MiB grant
        assert a.remove_prefix("shr-") == 64
        wait_metric(c.owner_metrics[0], "fluxon_owner_grants", 0)
        assert metric(c.owner_metrics[0], "fluxon_owner_grants_shrunk_total") == 4
        assert os.stat(seg).st_blocks * 512 <= used - (64 << 20)
        p = a.local_fast_put_start(keys[:1], 1 << 20)  # the capacity is still there
        a.local_fast_put_commit(p).result(20)
        a.close()
    finally:
        c.stop()


@pytest.mark.parametrize("order", ["prefix_depth", "tier"])
def test_prefix_depth_eviction_keeps_every_sessions_prefix_in_a_real_owner(tmp_path, order):
    """eviction_order: prefix_depth in a real owner: four sessions written one after the other with
    their content depths overflow it; capacity eviction takes the deepest pages, so every earlier
    session keeps an equal prefix a restore can use (exists_prefix), nothing orphaned, and never a page
    a put on its way continues (the session being written keeps its chain). The tier order (the
    default, the control) eats the oldest session first, tail first."""
    cluster = Cluster(tmp_path, f"depth{free_port()}", dram="16MiB", metrics=True,
                      owner_extra=f"eviction_free_watermark: 0\neviction_order: {order}" +
                      ("\neviction_stale_turnover: 2" if order == "prefix_depth" else "")).start()
    try:
        c = fluxon.KvClient(cluster.client_config())
        size = 64 << 10                          # 16 MiB of 64 KiB slots: 256
        per = 96                                 # 4 x 96 pages: 128 more than there is room for
        sessions = [[f"s{s}-{d}" for d in range(per)] for s in range(4)]
        for keys in sessions:
            for at in range(0, per, 16):        # a turn: 16 pages continuing the history
                batch = keys[at:at + 16]
                opts = fluxon.PutOptionalArgs(radix_parent_keys=[keys[at - 1] if at else ""] + batch[:-1],
                                              content_depths=list(range(at, at + 16)))
                c.local_fast_put_commit(c.local_fast_put_start(batch, size, opts)).result(20)
        end = time.time() + 15
        while time.time() < end and (c.stats()["reclaims"] or c.stats()["pending_eviction_reclaim_bytes"]):
            time.sleep(0.05)
        assert sample(scrape(cluster.owner_metrics[0]), "fluxon_owner_evicted_keys_total") >= 4 * per - 256
        kept = [c.exists_prefix(keys).prefix_len for keys in sessions]
        # Nothing orphaned: what stays of a session is exactly its prefix.
        for keys, k in zip(sessions, kept):
            assert not any(c.exists_prefix([key]).prefix_len for key in keys[k:])
        assert kept[3] == per, kept  # the last session's pages were continued while it wrote them
        if order == "prefix_depth":
            # A fixed horizon of 2 segments (32 MiB: more than the 24 MiB written, nothing went stale),
            # as the owner reports it.
            assert sample(scrape(cluster.owner_metrics[0]), "fluxon_owner_eviction_stale_bytes") == 32 << 20
            # The deepest went, whoever wrote them: the earlier sessions keep equal prefixes.
            assert min(kept[:3]) >= 40 and max(kept[:3]) - min(kept[:3]) <= 2, kept
        else:
            assert kept[0] < 40 and kept[0] < kept[2] - 16, kept  # the control: the oldest lost most
        c.close()
    finally:
        cluster.stop()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_daemon_logs_are_one_format_text_or_json_for_collectors(fmt, monkeypatch):
    """Every line a daemon writes is one event: time, level, component, message (text), or one JSON
    object with those keys (FLUXON_LOG_FORMAT=json, as `--log-format json` sets it)."""
    import json as _json
    import re as _re
    from fluxon.testing import LocalCluster
    monkeypatch.setenv("FLUXON_LOG_FORMAT", fmt)
    with LocalCluster(owners=1, fluxon_bin=FLUXON_BIN) as c:
        c.master.terminate()  # a stop writes its line too
        c.master.wait(10)
        logs = {p.name: p.read_text() for p in c.run_dir.glob("*.log")}
    assert set(logs) == {"master.log", "owner-1.log"}
    lines = [l for text in logs.values() for l in text.splitlines()]
    assert len(lines) >= 6, logs
    for line in lines:
        if fmt == "json":
            ev = _json.loads(line)
            assert set(ev) >= {"ts", "level", "component", "msg"} and ev["component"] in ("master", "owner"), line
            assert _re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ev["ts"]) and ev["level"] in ("info", "warn", "error")
        else:
            assert _re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO |WARN |ERROR) fluxon (master|owner): \S", line), line
    assert any("listening on" in l for l in lines) and any("stopping" in l for l in logs["master.log"].splitlines())


def test_log_format_flag_refuses_what_it_does_not_know():
    out = subprocess.run([FLUXON_BIN, "master", "--config", "x.yaml", "--log-format", "xml"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and "log format: 'xml' is neither text nor json" in out.stderr
