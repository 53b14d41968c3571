"""One way to start a local Fluxon cluster from Python: real daemons on this host, started and
stopped by `fluxon cluster up/down` from a config written for you.

    with LocalCluster(owners=2, metrics=True) as c:
        client = fluxon.KvClient(c.client_config(0))
        ...

`config` is the cluster config as a dict (the keys of the YAML, docs/operations.md); what it leaves
out is filled in: a unique `cluster_name`, a private `run_dir` (removed by `down()`), the master's
and each owner's ports (free ones below the kernel's ephemeral range, so that a daemon killed on
purpose finds its port again), `node_id`s, and each owner's memory (`dram`, `grant`). With
`masters:` (the HA mode) `fluxon cluster up` also starts a private etcd for it. When `up()` fails,
or the `with` block raises, the tail of every daemon's log is printed. The workload, the tools and
the tests build their clusters with it (the tests' fixture starts each daemon as a child process of
its own, to stop and signal it one by one)."""

from __future__ import annotations

import copy
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

__all__ = ["LocalCluster", "Daemon", "free_port", "find_fluxon_bin", "to_yaml"]


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a daemon killed and restarted on its
    port must not find it taken by some client's outgoing connection meanwhile."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rnd = random.Random()
    for _ in range(200):
        port = rnd.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_fluxon_bin() -> str:
    """The `fluxon` CLI: $FLUXON_BIN, the one installed with this package, this tree's build, PATH."""
    here = Path(__file__).resolve().parent
    cands = [os.environ.get("FLUXON_BIN", ""), str(here / "bin" / "fluxon")]
    if os.environ.get("FLUXON_BUILD_DIR"):
        cands.append(str(Path(os.environ["FLUXON_BUILD_DIR"]) / "tools" / "fluxon"))
    cands += [str(here.parent.parent / "tools" / "fluxon"), shutil.which("fluxon") or ""]
    for c in cands:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("the fluxon CLI was not found: set FLUXON_BIN (or build it: tools/build.sh)")


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return str(v)
    s = str(v)
    plain = s and all(c.isalnum() or c in "._/-:@+" for c in s) and s.lower() not in ("true", "false", "null", "yes", "no")
    return s if plain else "'" + s.replace("'", "''") + "'"


def to_yaml(v: Any, indent: int = 0) -> str:
    """A config dict as YAML (block mappings, block lists of mappings, flow lists of scalars)."""
    pad = " " * indent
    if isinstance(v, dict):
        out = []
        for k, x in v.items():
            if (isinstance(x, dict) and x) or (isinstance(x, list) and any(isinstance(e, dict) for e in x)):
                out.append(f"{pad}{k}:\n{to_yaml(x, indent + 2).rstrip(chr(10))}")
            elif isinstance(x, list):
                out.append(f"{pad}{k}: [{', '.join(_scalar(e) for e in x)}]")
            elif isinstance(x, dict):
                out.append(f"{pad}{k}: {{}}")
            else:
                out.append(f"{pad}{k}: {_scalar(x)}")
        return "\n".join(out) + "\n"
    if isinstance(v, list):
        out = []
        for e in v:
            body = to_yaml(e, indent + 2) if isinstance(e, dict) else f"{' ' * (indent + 2)}{_scalar(e)}\n"
            out.append(f"{pad}- {body.lstrip()}")
        return "".join(out)
    return f"{pad}{_scalar(v)}\n"


class Daemon:
    """One daemon of a LocalCluster (`master`, `master-N`, `owner-N`, `etcd`), by its pid file: what
    a test does to a process (signals, waiting for it to end). Not a child of this process:
    `fluxon cluster up` starts daemons in sessions of their own."""

    def __init__(self, cluster: "LocalCluster", name: str):
        self.cluster, self.name = cluster, name

    @property
    def pid(self) -> int:
        try:
            return int((self.cluster.run_dir / f"{self.name}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    def poll(self) -> Optional[int]:
        """None while it runs, else 0 (its exit status is its parent's to know)."""
        pid = self.pid
        if pid <= 0:
            return 0
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return 0
        return 0 if state in ("Z", "X") else None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: Optional[float] = None) -> int:
        end = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if end is not None and time.time() > end:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.01)
        return 0


class LocalCluster:
    def __init__(self, config: Optional[dict] = None, *, owners: int = 1, dram: str = "256MiB",
                 grant: str = "16MiB", metrics: bool = False, name: Optional[str] = None,
                 fluxon_bin: Optional[str] = None, quiet: bool = True):
        self.bin = fluxon_bin or find_fluxon_bin()
        self.quiet = quiet
        cfg = copy.deepcopy(config or {})
        cfg.setdefault("cluster_name", name or f"lc{os.getpid()}x{free_port()}")
        self._own_run_dir = "run_dir" not in cfg
        if self._own_run_dir:
            cfg["run_dir"] = tempfile.mkdtemp(prefix=f"fluxon-{cfg['cluster_name']}-")
        self.run_dir = Path(cfg["run_dir"])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._auto_ports = []  # (mapping, key) of every port this class chose: chosen again if taken
        if "masters" in cfg:
            for m in cfg["masters"]:
                self._port(m, "port")
                self._port(m, "metrics_port", metrics)
            etcd = cfg.setdefault("etcd", {})
            if "endpoints" not in etcd:
                etcd["endpoints"] = ["http://127.0.0.1:%d" % free_port()]
        else:
            m = cfg.setdefault("master", {})
            self._port(m, "port")
            self._port(m, "metrics_port", metrics)
        cfg.setdefault("owners", [{} for _ in range(owners)])
        cfg["owners"] = [{"node_id": o.get("node_id", i + 1), **o} for i, o in enumerate(cfg["owners"])]
        for o in cfg["owners"]:
            self._port(o, "port")
            self._port(o, "metrics_port", metrics)
            o.setdefault("contribute_to_cluster_pool_size", {"dram": dram})
            o.setdefault("local_reserve_grant_bytes", grant)
        first = ("cluster_name", "run_dir", "auth", "etcd", "master", "masters", "owners")
        self.settings = {**{k: cfg[k] for k in first if k in cfg}, **{k: v for k, v in cfg.items() if k not in first}}
        self.name = cfg["cluster_name"]
        self.config = self.run_dir / "cluster.yaml"  # the file (`fluxon ... --config` it); settings: the dict
        self.save()
        self.running = False
        # The daemons, by their pid files (what a test signals and waits for).
        self.master = self.daemon("master-0" if "masters" in self.settings else "master")
        self.owners = [self.daemon(f"owner-{o['node_id']}") for o in self.settings["owners"]]

    def _port(self, mapping: dict, key: str, want: bool = True) -> None:
        if key in mapping:
            return
        mapping[key] = free_port() if want else 0
        if want:
            self._auto_ports.append((mapping, key))

    def repick_ports(self) -> None:
        """Every port this class chose, chosen again (one was taken meanwhile); the logs go too."""
        for mapping, key in self._auto_ports:
            mapping[key] = free_port()
        for log in self.run_dir.glob("*.log"):
            log.unlink()
        self.save()

    def save(self) -> None:
        """Writes `settings` to the config file (after changing them: a daemon started next reads them)."""
        self.config.write_text(to_yaml(self.settings))

    # -- the cluster -------------------------------------------------------------------------------
    def _cli(self, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.bin, *args], capture_output=True, text=True, timeout=timeout)

    def up(self) -> "LocalCluster":
        """Starts every daemon not running (all of them at first; after a kill, the killed ones)."""
        for attempt in range(3):
            r = self._cli("cluster", "up", str(self.config))
            if r.returncode == 0:
                self.running = True
                return self
            taken = "is taken by another process" in r.stderr or "cannot listen" in self.log_tail()
            if not taken or self.running or not self._auto_ports or attempt == 2:
                self.down(keep_run_dir=True)
                raise RuntimeError(f"fluxon cluster up {self.config} failed ({r.returncode}): "
                                   f"{r.stdout}{r.stderr}\n{self.log_tail()}")
            # A port chosen here was taken meanwhile (another process's): every chosen port anew.
            self._cli("cluster", "down", str(self.config))
            self.repick_ports()
        return self

    start = up

    def down(self, keep_run_dir: bool = False) -> None:
        """Stops every daemon (owners first; their segments go with them) and, unless kept, removes
        the run_dir this class made."""
        if self.config.exists():
            self._cli("cluster", "down", str(self.config), timeout=300)
        self.running = False
        if self._own_run_dir and not keep_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    stop = down

    def __enter__(self) -> "LocalCluster":
        return self.up()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and exc_type is not KeyboardInterrupt:
            sys.stderr.write(self.log_tail())
        self.down()

    def status(self) -> str:
        return self._cli("cluster", "status", str(self.config)).stdout

    def log_tail(self, tail: int = 3000) -> str:
        """The last `tail` characters of every daemon's log."""
        out = []
        for p in sorted(self.run_dir.glob("*.log")):
            text = p.read_text(errors="replace")
            out.append(f"--- {p.name} (last {min(len(text), tail)} of {len(text)} characters)\n{text[-tail:]}")
        return "\n".join(out) + ("\n" if out else "")

    # -- its daemons and addresses -----------------------------------------------------------------
    def daemon(self, name: str) -> Daemon:
        """`master` (`master-N` with masters:), `owner-N` (by node_id), `etcd`."""
        return Daemon(self, name)

    @property
    def master_port(self) -> int:
        return (self.settings["masters"][0] if "masters" in self.settings else self.settings["master"])["port"]

    @property
    def metrics_port(self) -> int:
        """The master's metrics port (0: none)."""
        return (self.settings["masters"][0] if "masters" in self.settings else self.settings["master"])["metrics_port"]

    @property
    def owner_ports(self) -> list:
        return [o["port"] for o in self.settings["owners"]]

    @property
    def owner_metrics(self) -> list:
        return [o.get("metrics_port", 0) for o in self.settings["owners"]]

    def owner_address(self, i: int = 0) -> str:
        return f"127.0.0.1:{self.owner_ports[i]}"

    def client_config(self, i: int = 0, **client) -> dict:
        """A client config (a dict, for fluxon.KvClient) of the i-th owner; `client` adds keys to
        its `client:` mapping (channel, rpc_timeout_ms, max_wait_ms...)."""
        c = {"cluster_name": self.name, "client": {"owner_address": self.owner_address(i), **client}}
        if "auth" in self.settings:
            c["auth"] = dict(self.settings["auth"])
        return c

    def client_config_file(self, i: int = 0, **client) -> str:
        """The same as a YAML file in the run_dir (what an SGLang worker names as fluxon_config)."""
        path = self.run_dir / f"client-{i}.yaml"
        path.write_text(to_yaml(self.client_config(i, **client)))
        return str(path)
