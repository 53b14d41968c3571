"""`fluxon bench`: the figures its JSON promises, and a bench that starts its own cluster takes it
down again - when it passes and when a call fails."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

from conftest import FLUXON_BIN, free_port

# The keys `fluxon bench FILE --json` promises (docs/measured.md, issue 28's table).
PROMISED = ["tcp_rtt_p50_us", "futex_rtt_p50_us", "caf_rtt_p50_us", "memcpy_gbps", "data_put_gbps",
            "data_get_gbps", "segment_page_bytes", "remote_get_gbps", "raw_tcp_gbps", "remote_get_p50_us_b1"]
PER_BATCH = ["local_get_p50_us_b", "local_get_p99_us_b", "put_p50_us_b", "put_keys_per_s_b", "get_keys_per_s_b"]


def _config(tree, owner1_pool):
    run_dir = os.path.join(tree, "run")
    path = os.path.join(tree, "bench.yaml")
    with open(path, "w") as f:
        f.write(f"""cluster_name: bench-test-{os.getpid()}
run_dir: {run_dir}
master: {{port: {free_port()}}}
owners:
  - node_id: 1
    port: {free_port()}
    contribute_to_cluster_pool_size: {{dram: {owner1_pool}}}
    local_reserve_grant_bytes: 64MiB
  - node_id: 2
    port: {free_port()}
    contribute_to_cluster_pool_size: {{dram: 512MiB}}
    local_reserve_grant_bytes: 64MiB
""")
    return path, run_dir


def _daemons_of(path):
    """Live processes started with this config file (the bench's master and owners name it)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if path.encode() in args and b"bench" not in args and state != "Z":
            out.append(int(pid))
    return out


def _stop_leftovers(path):
    """A failing test still leaves nothing: daemons it finds alive get SIGTERM (they free their segments)."""
    for pid in _daemons_of(path):
        os.kill(pid, signal.SIGTERM)
    end = time.time() + 10
    while _daemons_of(path) and time.time() < end:
        time.sleep(0.1)
    for pid in _daemons_of(path):
        os.kill(pid, signal.SIGKILL)


def _run(path, *args):
    return subprocess.run([FLUXON_BIN, "bench", path, "--iters", "20", "--batch", "1", "--batch", "64",
                           "--get-rounds", "1", *args], capture_output=True, text=True, timeout=600)


def test_bench_json_holds_every_promised_figure_and_leaves_nothing():
    tree = tempfile.mkdtemp(prefix="fluxon-bench-test-")
    path, run_dir = _config(tree, "1GiB")
    try:
        r = _run(path, "--json")
        assert r.returncode == 0, r.stderr[-3000:]
        fig = json.loads(r.stdout)
        for key in PROMISED + [k + b for k in PER_BATCH for b in ("1", "64")]:
            assert key in fig, f"{key} missing from {sorted(fig)}"
            assert fig[key] > 0, f"{key} = {fig[key]}"
        assert not os.path.exists(run_dir), "a passing bench removes the run_dir of the cluster it started"
        assert _daemons_of(path) == []
    finally:
        _stop_leftovers(path)
        shutil.rmtree(tree, ignore_errors=True)


def test_a_failed_bench_still_takes_its_cluster_down():
    # Owner 1 holds 192 MiB: the data-path phase asks for 64 x 4 MiB and is refused. The bench says
    # which call failed, exits 1, stops the daemons it started and keeps their logs.
    tree = tempfile.mkdtemp(prefix="fluxon-bench-test-")
    path, run_dir = _config(tree, "192MiB")
    try:
        r = _run(path)
        assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
        assert "bench: c.local_fast_put_start" in r.stderr, r.stderr[-2000:]
        assert f"the daemons' logs are in {run_dir}" in r.stderr
        assert os.path.isdir(run_dir)
        assert [n for n in os.listdir(run_dir) if n.endswith(".log")], os.listdir(run_dir)
        assert _daemons_of(path) == [], "daemons outlived the failed bench"
    finally:
        _stop_leftovers(path)
        shutil.rmtree(tree, ignore_errors=True)
