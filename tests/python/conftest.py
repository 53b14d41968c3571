"""Fixtures: the built `fluxon` package and binary, and real daemon clusters on loopback."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FLUXON_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(BUILD / "python"))
FLUXON_BIN = str(BUILD / "tools" / "fluxon")
# How external test clients reach their owner: auto (the shared-memory channel on this host, the
# product's default) or caf (tools/test.sh runs the invariant tests once more over CAF).
CHANNEL = os.environ.get("FLUXON_TEST_CHANNEL", "auto")

import fluxon  # noqa: E402
from fluxon.testing import LocalCluster, free_port as _free_port  # noqa: E402


def _segments() -> set:
    return {f for f in os.listdir("/dev/shm") if f.startswith("fluxon.")}


_SEGMENTS_BEFORE = _segments()


def pytest_sessionfinish(session, exitstatus):
    """The tests leave no shared-memory segment behind, even those that kill owners on purpose
    (guardians unlink a killed owner's segment within moments: they get 10 s)."""
    end = time.time() + 10
    while (left := _segments() - _SEGMENTS_BEFORE) and time.time() < end:
        time.sleep(0.1)
    if left:
        print(f"\nFAILED: the tests left segments in /dev/shm: {sorted(left)}", file=sys.stderr)
        session.exitstatus = 1


def free_port() -> int:
    """A free port below the kernel's ephemeral range (fluxon.testing's): a daemon a test kills and
    restarts on its port must not find it taken by a client's outgoing connection."""
    return _free_port()


def wait_port(port: int, proc=None, timeout=15.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"daemon exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open")


def pause(proc, timeout=10.0) -> None:
    """SIGSTOP, and wait until the kernel shows the process stopped: the signal is delivered
    asynchronously, and a request sent at once could still be answered (on another core)."""
    proc.send_signal(signal.SIGSTOP)
    end = time.time() + timeout
    while time.time() < end:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.001)
    raise TimeoutError(f"process {proc.pid} did not stop")


def _page(port: int) -> str:
    import urllib.request
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def sample(page: str, name: str):
    """The value of the unlabelled sample `name` on a Prometheus text page (None if absent)."""
    for line in page.splitlines():
        if line.split(" ")[0] == name:
            return float(line.split()[-1])
    return None


def labelled(page: str, name: str, **labels) -> float:
    """The value of sample `name` whose labels include `labels`, from a Prometheus text page."""
    for line in page.splitlines():
        if not line.startswith(name + "{"):
            continue
        got = dict(kv.split("=", 1) for kv in line[len(name) + 1:line.index("}")].split(","))
        if all(got.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not in the page")


def scrape(port: int, timeout=20.0) -> str:
    """A /metrics page refreshed after this call began: the daemons refresh theirs from their state once a
    second and count it (fluxon_{owner,master}_metrics_refreshes_total, written last), so everything the
    daemon did before the call is on the page. A fixed sleep is not enough on a loaded machine."""
    def refreshes(page):
        return sample(page, "fluxon_owner_metrics_refreshes_total") or \
            sample(page, "fluxon_master_metrics_refreshes_total") or 0
    seen = refreshes(_page(port))
    end = time.time() + timeout
    while time.time() < end:
        time.sleep(0.05)
        page = _page(port)
        if refreshes(page) > seen:
            return page
    raise TimeoutError(f"the /metrics page on port {port} was not refreshed in {timeout} s")


def metric(port: int, name: str):
    """The unlabelled sample `name` from a page refreshed after this call began (None if absent)."""
    return sample(scrape(port), name)


def wait_metric(port: int, name: str, want, timeout=20.0):
    """Scrapes until the sample `name` equals want (a value another daemon settles asynchronously, e.g.
    the master's count after an owner's GetDone); returns the last value seen for the caller's assert."""
    end = time.time() + timeout
    got = metric(port, name)
    while got != want and time.time() < end:
        got = metric(port, name)
    return got


class Cluster(LocalCluster):
    """A master and owners as real processes, built by fluxon.testing.LocalCluster (the config, its
    ports, the client configs) and started here, each daemon a child process of the test (stopped,
    killed and paused one by one, its exit seen)."""

    def __init__(self, tmp: Path, name: str, owners: int = 1, owner_extra="", metrics: bool = False,
                 dram: str = "256MiB", master_extra: str = "", key_file: str = None):
        """owner_extra: YAML keys added to every owner, or a list of them, one per owner;
        master_extra: keys added to the master's mapping ("k: v, k: v"); key_file: the cluster key
        (auth: {key_file}) of the daemons and, by default, of the clients."""
        import yaml
        self.key_file = key_file
        settings = {"cluster_name": name, "run_dir": str(tmp),
                    "master": yaml.safe_load("{" + master_extra + "}") if master_extra else {}, "owners": []}
        if key_file:
            settings["auth"] = {"key_file": key_file}
        for i in range(owners):
            extra = owner_extra[i] if isinstance(owner_extra, list) else owner_extra
            settings["owners"].append(dict(yaml.safe_load(extra) or {}) if extra.strip() else {})
        super().__init__(settings, dram=dram, grant="16MiB", metrics=metrics, fluxon_bin=FLUXON_BIN)
        self.logs = tmp
        self.master = None
        self.owners = [None] * owners

    def _spawn(self, args, log):
        return subprocess.Popen([FLUXON_BIN, *args], stdout=open(log, "ab"), stderr=subprocess.STDOUT)

    def start_master(self):
        self.master = self._spawn(["master", "--config", str(self.config)], self.logs / "master.log")
        wait_port(self.master_port, self.master)

    def start_owner(self, i: int = 0):
        self.owners[i] = self._spawn(["owner", "--config", str(self.config), "--node-id", str(i + 1)],
                                     self.logs / f"owner-{i + 1}.log")
        wait_port(self.owner_ports[i], self.owners[i])

    def stop_owner(self, i: int = 0, sig=signal.SIGTERM):
        p = self.owners[i]
        if p and p.poll() is None:
            p.send_signal(sig)
            p.wait(timeout=10)
        self.owners[i] = None

    def start(self):
        # A port free_port() found may be taken (an outgoing connection's ephemeral port) before the
        # daemon binds it: then the whole cluster starts again on fresh ports.
        for attempt in range(3):
            try:
                self.start_master()
                for i in range(len(self.owners)):
                    self.start_owner(i)
                return self
            except RuntimeError:
                logs = "".join(p.read_text(errors="replace") for p in self.logs.glob("*.log"))
                self.stop()
                if "cannot listen" not in logs or attempt == 2:
                    raise
                self.repick_ports()

    up = start

    def stop(self):
        for i in range(len(self.owners)):
            self.stop_owner(i)
        if self.master and self.master.poll() is None:
            self.master.send_signal(signal.SIGTERM)
            self.master.wait(timeout=10)

    down = stop

    def client_config_file(self, i: int = 0) -> str:
        """The client config a user writes for an SGLang worker of owner i (a YAML file)."""
        path = self.logs / f"client-{self.name}-{i}.yaml"
        path.write_text(f"cluster_name: {self.name}\nclient: {{owner_address: 127.0.0.1:{self.owner_ports[i]}, "
                        f"channel: {CHANNEL}}}\n" + (f"auth: {{key_file: {self.key_file}}}\n" if self.key_file else ""))
        return str(path)

    def client_config(self, i: int = 0, key_file="cluster", channel=None) -> dict:
        """key_file: the cluster's (default), another path, or None (a client without auth)."""
        c = {"cluster_name": self.name, "client": {"owner_address": f"127.0.0.1:{self.owner_ports[i]}",
                                                   "rpc_timeout_ms": 10000, "channel": channel or CHANNEL}}
        key = self.key_file if key_file == "cluster" else key_file
        if key:
            c["auth"] = {"key_file": str(key)}
        return c


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path, f"pyt{os.getpid()}x{free_port()}").start()
    yield c
    c.stop()


@pytest.fixture(scope="session")
def shared_cluster(tmp_path_factory):
    """One daemon cluster for the API tests in external mode (each test opens its own session)."""
    c = Cluster(tmp_path_factory.mktemp("shared"), f"pys{os.getpid()}").start()
    yield c
    c.stop()


@pytest.fixture(params=["embedded", "external"])
def client(request):
    """The same API tests run against an embedded store and against an owner daemon."""
    if request.param == "embedded":
        c = fluxon.KvClient({"owners": [{"contribute_to_cluster_pool_size": {"dram": "256MiB"},
                                         "local_reserve_grant_bytes": "16MiB"}]})
    else:
        c = fluxon.KvClient(request.getfixturevalue("shared_cluster").client_config())
    yield c
    c.close()
