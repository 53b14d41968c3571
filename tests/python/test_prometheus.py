"""A real Prometheus (Debian's) scraping a real cluster through the scrape config that `fluxon cluster
prometheus-config` prints: the series come in, rates move while clients work, `promtool check metrics`
finds nothing to say of any /metrics page, and every query of the Grafana dashboard
(tools/grafana/fluxon.json) names exported series and evaluates."""

import ctypes
import json
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

import fluxon
from conftest import FLUXON_BIN, ROOT, Cluster, free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
DASHBOARD = ROOT / "tools" / "grafana" / "fluxon.json"

# Skipped only outside CI when Prometheus is missing (`tools/install-deps.sh --tests` installs it,
# as the test command does): in CI its absence fails.
pytestmark = pytest.mark.skipif((PROMETHEUS is None or PROMTOOL is None) and not os.environ.get("CI"),
                                reason="no prometheus: tools/install-deps.sh --tests")


def http(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def query(port, expr):
    doc = json.loads(http(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    assert doc["status"] == "success", (expr, doc)
    return doc["data"]["result"]


def wait_query(port, expr, pred, timeout=30.0):
    end = time.time() + timeout
    got = None
    while time.time() < end:
        got = query(port, expr)
        if pred(got):
            return got
        time.sleep(0.25)
    raise AssertionError(f"{expr}: never satisfied; last {got}")


@pytest.fixture
def prom(tmp_path):
    assert PROMETHEUS and PROMTOOL, "prometheus is not installed (tools/install-deps.sh --tests)"
    c = Cluster(tmp_path, f"prom{os.getpid()}x{free_port()}", owners=2, metrics=True).start()
    cfg = tmp_path / "prometheus.yml"
    out = subprocess.run([FLUXON_BIN, "cluster", "prometheus-config", str(c.config), "--interval", "1s"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    cfg.write_text(out.stdout)
    check = subprocess.run([PROMTOOL, "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    data = tmp_path / "tsdb"
    p = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={data}",
                          f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                         stdout=open(tmp_path / "prometheus.log", "wb"), stderr=subprocess.STDOUT)
    try:
        end = time.time() + 60
        while True:
            assert p.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                if "Ready" in http(f"http://127.0.0.1:{port}/-/ready", timeout=1):
                    break
            except OSError:
                pass
            assert time.time() < end, "prometheus did not get ready in 60 s"
            time.sleep(0.2)
        yield c, port
    finally:
        p.terminate()
        p.wait(timeout=30)
        shutil.rmtree(data, ignore_errors=True)
        c.stop()


def test_prometheus_scrapes_every_daemon_and_sees_rates_move_during_a_workload(prom):
    c, port = prom
    up = wait_query(port, "up", lambda r: len(r) == 3 and all(x["value"][1] == "1" for x in r))
    assert {(x["metric"]["job"], x["metric"].get("node")) for x in up} == \
        {("fluxon_master", None), ("fluxon_owner", "1"), ("fluxon_owner", "2")}
    assert all(x["metric"]["cluster"] == c.name for x in up)
    # Clients at work for a few seconds: puts through owner 1, reads of them through both owners.
    stop = threading.Event()
    errors = []

    def work():
        a = fluxon.KvClient(c.client_config(0))
        b = fluxon.KvClient(c.client_config(1))
        try:
            a.wait_local_segments_ready()
            b.wait_local_segments_ready()
            n = 0
            while not stop.is_set():
                keys = [f"w:{n}:{i}" for i in range(32)]
                p = a.local_fast_put_start(keys, 4096)
                for addr in fluxon.plan_pointers(p):
                    ctypes.memset(addr, 3, 4096)
                a.local_fast_put_commit(p).result(10)
                for cl in (a, b):
                    h, r = cl.get_start(keys)
                    cl.release_views(cl.get_transfer(h))
                n += 1
                time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)
        finally:
            a.close()
            b.close()

    t = threading.Thread(target=work)
    t.start()
    try:
        put = wait_query(port, 'rate(fluxon_owner_put_keys_total{node="1"}[3s])',
                         lambda r: r and float(r[0]["value"][1]) > 0)
        published = wait_query(port, "rate(fluxon_master_routes_published_total[3s])",
                               lambda r: r and float(r[0]["value"][1]) > 0)
        served = wait_query(port, 'increase(fluxon_owner_data_served_bytes_total{node="1"}[10s])',
                            lambda r: r and float(r[0]["value"][1]) > 0)
    finally:
        stop.set()
        t.join(timeout=30)
    assert not errors, errors
    assert float(put[0]["value"][1]) > 0 and float(published[0]["value"][1]) > 0 and float(served[0]["value"][1]) > 0
    # The routes the master holds, as Prometheus read them, are the keys written.
    routes = wait_query(port, "fluxon_master_routes", lambda r: r and float(r[0]["value"][1]) > 0)
    assert float(routes[0]["value"][1]) % 32 == 0


def test_every_metrics_page_passes_promtool_and_every_dashboard_query_names_exported_series(prom):
    c, port = prom
    pages = [http(f"http://127.0.0.1:{c.metrics_port}/metrics")] + \
        [http(f"http://127.0.0.1:{p}/metrics") for p in c.owner_metrics]
    for page in pages:
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0 and lint.stdout.strip() == "" and lint.stderr.strip() == "", \
            lint.stdout + lint.stderr
    exported = set(re.findall(r"^# TYPE (\S+) ", "\n".join(pages), re.M))
    assert len(exported) > 100
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 15
    wait_query(port, "up", lambda r: len(r) == 3)
    time.sleep(2.5)  # two scrapes in: a range of 10s has samples to rate
    for e in exprs:
        names = set(re.findall(r"\bfluxon_[a-z0-9_]+", e))
        assert names and names <= exported, (e, names - exported)
        q = e.replace("$cluster", c.name).replace("$__rate_interval", "10s")
        result = query(port, q)  # evaluates (status success), and finds the cluster's series
        assert result, f"no series for {q}"
    var = dash["templating"]["list"][1]["definition"]
    assert var == "label_values(fluxon_master_routes, cluster)"
    assert c.name in {x["metric"]["cluster"] for x in query(port, "fluxon_master_routes")}
