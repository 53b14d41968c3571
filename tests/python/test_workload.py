"""The agent workload end to end (small): two TP rank processes, a real collective, a private
daemon cluster, restores verified byte for byte; and the --json output."""

import json
import re
import shutil
import subprocess
from pathlib import Path

from conftest import FLUXON_BIN


def run(*args):
    return subprocess.run([FLUXON_BIN, "workload", *args], capture_output=True, text=True, timeout=300)


def test_workload_tp2_write_back_json():
    out = run("--sessions", "12", "--turns", "4", "--gpu-pages", "160", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    assert len(rep["ranks"]) == 2
    t0, t1 = rep["ranks"][0]["totals"], rep["ranks"][1]["totals"]
    assert t0["requests"] == t1["requests"] == 48
    assert t0["verify_failures"] == t1["verify_failures"] == 0
    assert t0["l2"] > 0 and t0["backup_bytes"] > 0 and t0["restore_bytes"] > 0  # L2 served restores
    assert t0["l1"] == t1["l1"] and t0["l2"] == t1["l2"]  # the ranks agreed on every prefix
    assert rep["ranks"][0]["owner_stats"]["holders"] == 0


def test_workload_write_through_wait_complete_text():
    out = run("--sessions", "8", "--turns", "3", "--gpu-pages", "128", "--write-policy", "write_through",
              "--prefetch-policy", "wait_complete", "--tp", "1")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "restored pages verified byte for byte: all ok" in out.stdout
    assert "total:" in out.stdout and "put_start" in out.stdout


def test_workload_under_capacity_pressure_evicts_and_stays_correct():
    """A segment far smaller than the working set: evictions keep puts going, every restore is
    still byte-exact, nothing fails."""
    out = run("--sessions", "16", "--turns", "5", "--gpu-pages", "200", "--item-bytes", "256", "--owner-dram", "4MiB",
              "--tp", "1",
              "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rank = json.loads(out.stdout)["ranks"][0]
    t, ctr, st = rank["totals"], rank["counters"], rank["owner_stats"]
    assert t["verify_failures"] == 0
    assert ctr["backup_failed"] == 0 and ctr["backup_write_failed"] == 0 and ctr["restore_failed"] == 0
    assert t["backup_bytes"] > 4 * 2**20  # more was written back than the segment holds
    assert st["slots_committed"] + st["slots_free"] <= 4 * 2**20 // (64 * 256)


def test_workload_reports_a_failed_rank_instead_of_hanging():
    out = run("--sessions", "4", "--turns", "3", "--gpu-pages", "8", "--tp", "2")
    assert out.returncode != 0
    assert "needs more pages" in out.stderr or "exited" in out.stderr
    # A failed run keeps its private cluster's logs and says where (a run that succeeds leaves nothing).
    m = re.search(r"workload: the daemons' logs are in (\S+)", out.stderr)
    assert m and Path(m.group(1)).is_dir() and (Path(m.group(1)) / "master.log").exists(), out.stderr[-2000:]
    shutil.rmtree(m.group(1))


def test_workload_two_instances_hit_l3_when_sessions_migrate():
    """Two serving instances (TP 2 each, an owner each); the router moves sessions between them: a
    moved session's history is fetched from the other owner (L3), byte-exact, and every rank of an
    instance agrees on every prefix."""
    out = run("--sessions", "16", "--turns", "4", "--gpu-pages", "128", "--instances", "2", "--migrate", "0.5",
              "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    assert len(rep["ranks"]) == 4
    t = rep["totals"]
    assert t["requests"] == 64
    assert t["l3"] > 0 and t["l2"] > 0 and t["remote_restores"] > 0
    assert all(r["totals"]["verify_failures"] == 0 for r in rep["ranks"])
    for inst in (0, 1):
        a, b = [r["totals"] for r in rep["ranks"] if r["instance"] == inst]
        # Same prefix on both ranks; where each rank's copy came from (L2 or L3) may differ.
        assert (a["l1"], a["l2"] + a["l3"]) == (b["l1"], b["l2"] + b["l3"])
    assert all(r["owner_stats"]["holders"] == 0 and r["owner_stats"]["slots_pending"] == 0 for r in rep["ranks"])


def test_workload_with_a_remote_cache_owner_makes_replicas():
    """Backups admitted for replicas (eager) are pulled by the CPU-only owner: the master counts a
    replica task per published key, every one assigned to the remote_cache owner."""
    out = run("--sessions", "12", "--turns", "4", "--gpu-pages", "160", "--instances", "2", "--remote-cache", "1",
              "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    m = rep["master"]
    assert m["replica_tasks_assigned_total"] > 0 and m["replica_tasks_no_target_total"] == 0
    assert m["replicas"] >= m["routes"] + m["replica_tasks_assigned_total"] * 0.9  # the copies are there
    assert m["inflight_gets"] == 0
    assert all(r["totals"]["verify_failures"] == 0 for r in rep["ranks"])


def test_workload_compare_split_and_unified_on_one_trace():
    """--compare: the same seeded trace through split (each rank's host LRU + a store that keeps its own
    copies) and unified (Fluxon owners in the prefix-depth order + a CPU owner, inclusive write-back:
    the written-back copies are evicted first) at one capacity; the same L1 in both (identical hits
    there), every restore verified, S4 reconciled; split keeps duplicate copies (physical > single-copy
    bytes), unified fewer."""
    # A 1 MiB trace: the owners' own free watermark (0.02), not the comparison's 10% of 128 slots.
    out = run("--sessions", "12", "--turns", "4", "--gpu-pages", "128", "--compare", "split,unified",
              "--capacity", "50", "--grant", "256KiB", "--prefill-tok-s", "0", "--eviction-free-watermark", "0.02",
              "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    sp, un = rep["rows"]
    assert (sp["mode"], un["mode"]) == ("split", "unified")
    assert sp["capacity_bytes"] == un["capacity_bytes"] and sp["l3_bytes"] == un["l3_bytes"]
    assert sp["l1"] == un["l1"]  # one trace, one L1: what the tiers below do cannot change L1 hits
    for r in (sp, un):
        assert r["errors"] == 0 and r["reconciled"]
        assert r["l2"] > 0 and r["l3"] > 0
    assert sp["host_pool_evictions"] > 0  # the host pool was under pressure
    assert sp["demoted_keys"] == 0 and sp["writeback_tasks"] == 0
    assert un["writeback_tasks"] > 0 and un["demoted_keys"] == 0  # --writeback-demote off (the default here)
    # The bound: one per capacity point, above what either mode hit.
    assert sp["min_bound"] == un["min_bound"] and max(sp["total"], un["total"]) <= sp["min_bound"]
    assert sp["physical_bytes"] > sp["logical_bytes"]  # split: the store's copies of what L2 holds
    assert un["physical_bytes"] / un["logical_bytes"] < sp["physical_bytes"] / sp["logical_bytes"]


def test_workload_compare_with_demotion_drops_the_source_copies():
    """--writeback-demote on --eviction-order tier (the owners' defaults): what unified writes back
    leaves the instance owner once the CPU owner holds it (single-copy demotion)."""
    out = run("--sessions", "12", "--turns", "4", "--gpu-pages", "128", "--compare", "unified",
              "--capacity", "50", "--grant", "256KiB", "--prefill-tok-s", "0", "--writeback-demote", "on",
              "--eviction-order", "tier", "--hot-share", "0.9", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    (un,) = json.loads(out.stdout)["rows"]
    assert un["errors"] == 0 and un["reconciled"]
    assert un["writeback_tasks"] > 0 and un["demoted_keys"] > 0


def test_workload_compare_refuses_what_it_sets_itself():
    out = run("--compare", "split,unified", "--remote-cache", "1")
    assert out.returncode != 0 and "--compare sets the cluster itself" in out.stderr
    out = run("--compare", "split,both")
    assert out.returncode != 0 and "--compare takes split, unified" in out.stderr
    out = run("--compare", "split", "--capacity", "0.001", "--sessions", "2", "--turns", "1")
    assert out.returncode != 0 and "less than one grant" in out.stderr


def _trace(sessions=24, turns=6):
    import argparse
    from fluxon.workload import trace_pages
    a = argparse.Namespace(sessions=sessions, turns=turns, seed=7, instances=1, migrate=0.0, system_prompts=4,
                           system_tokens=1024, user_tokens=384, output_tokens=128, page_tokens=64)
    return trace_pages(a)


def _lru_pct(pages, tokens, cap, recent_first=False):
    """LRU (or MRU: the page read last goes) over every read, as MIN counts them."""
    from collections import OrderedDict
    held, hits = OrderedDict(), 0
    for req in pages:
        for h in req:
            if h in held:
                hits += 1
                held.move_to_end(h)
                continue
            if cap and len(held) >= cap:
                held.popitem(last=recent_first)
            if cap:
                held[h] = True
    return 100.0 * hits * 64 / tokens


def test_workload_min_bound_is_above_every_order_and_exact_when_all_fits():
    """--compare's bound: Belady's MIN over the trace's page reads. No order hits more (LRU and MRU,
    counting every read as MIN does); it grows with the capacity; with room for every page it misses
    only first sights."""
    from fluxon.workload import min_bound_pct
    pages, tokens = _trace()
    distinct = len({h for req in pages for h in req})
    reads = sum(len(r) for r in pages)
    prev = -1.0
    for frac in (0.05, 0.25, 0.5, 1.0):
        cap = int(distinct * frac)
        bound = min_bound_pct(pages, tokens, 64, cap)
        assert bound >= _lru_pct(pages, tokens, cap) - 1e-9
        assert bound >= _lru_pct(pages, tokens, cap, recent_first=True) - 1e-9
        assert bound >= prev
        prev = bound
    assert min_bound_pct(pages, tokens, 64, distinct) == 100.0 * (reads - distinct) * 64 / tokens
    assert min_bound_pct(pages, tokens, 64, 0) == 0.0
    # MIN beats LRU by a margin on this cyclic trace (sessions re-read a round later): LRU keeps what
    # is read again last.
    cap = distinct // 4
    assert min_bound_pct(pages, tokens, 64, cap) > _lru_pct(pages, tokens, cap) + 10


def test_workload_min_bound_is_the_optimum_of_small_traces():
    """MIN is the most hits any cache of that size gets: equal to an exhaustive search over every
    choice (admit or not, which page goes) on small random traces."""
    import random
    from functools import lru_cache
    from fluxon.workload import min_bound_pct
    rng = random.Random(3)
    for _ in range(60):
        seq = [rng.choice("abcde") for _ in range(rng.randint(4, 14))]
        cap = rng.randint(1, 3)

        @lru_cache(maxsize=None)
        def best(i, held):
            if i == len(seq):
                return 0
            h = seq[i]
            if h in held:
                return 1 + best(i + 1, held)
            options = [best(i + 1, held)]  # not admitted
            if len(held) < cap:
                options.append(best(i + 1, held | {h}))
            else:
                options += [best(i + 1, (held - {v}) | {h}) for v in held]
            return max(options)
        reads = [seq[j:j + 3] for j in range(0, len(seq), 3)]  # requests of up to 3 pages
        assert min_bound_pct(reads, len(seq) * 64, 64, cap) == 100.0 * best(0, frozenset()) / len(seq), (seq, cap)


def test_workload_report_survives_a_dead_owner(tmp_path):
    """The report's per-owner slots come from each owner's /metrics: a live owner's are counted, a
    dead one's entry says it is unreachable instead of the report crashing on URLError."""
    import signal

    from conftest import Cluster, free_port
    from fluxon.workload import owner_slots

    cl = Cluster(tmp_path, f"wlr{free_port()}", owners=2, metrics=True).start()
    try:
        cl.stop_owner(1, signal.SIGKILL)
        got = owner_slots([("instance 0", cl.owner_metrics[0]), ("instance 1", cl.owner_metrics[1])])
    finally:
        cl.stop()
    assert got[0]["owner"] == "instance 0" and "committed" in got[0]["slots"] and "unreachable" not in got[0]
    assert got[1]["owner"] == "instance 1" and got[1]["slots"] == {} and got[1]["unreachable"]


def test_workload_crash_chaos_kill_9_owners_the_master_and_clients_nothing_wrong_nothing_lost():
    """`fluxon workload --chaos SEED`: 2 instances and a CPU owner; kill -9 of the master and both
    instance owners (seed 2; FLUXON_SEED for others), each restarted 0.5-2 s later, and a bystander
    client killed when the seed says so. The ranks lose their owner, map its new generation and go
    on (no call waits out a timeout); no restored page is wrong; afterwards every owner is back at
    baseline and the master's replicas are the owners' committed slots."""
    import os
    seed = os.environ.get("FLUXON_SEED", "2")
    out = run("--sessions", "48", "--turns", "8", "--instances", "2", "--remote-cache", "1", "--migrate", "0.3",
              "--prefill-tok-s", "200000", "--chaos", seed, "--chaos-kills", "3", "--json")
    assert out.returncode == 0, out.stderr[-3000:]
    rep = json.loads(out.stdout)
    ch = rep["chaos"]
    print(f"seed {seed}: {ch['events']}; bystander {ch['bystander']}")
    # The kills come 0.5-1.5 s apart while the ranks run: a short run may end before the third.
    assert 1 <= len(ch["events"]) <= 3 and not any("error" in e for e in ch["events"]), ch["events"]
    assert rep["totals"]["verify_failures"] == 0
    assert rep["totals"]["requests"] == 48 * 8
    assert ch["baseline"] and ch["routes_match"], ch
    assert ch["bystander"]["bad_bytes"] == 0 and ch["bystander"]["puts"] > 0
    if seed == "2":  # the master, then both instance owners (a short run may end before the last kill)
        victims = [e["victim"] for e in ch["events"]]
        assert victims == ["master", "owner-1", "owner-2"][:len(victims)]
        # An instance owner went down while the ranks still had a second of work after it: they lost
        # it and came back. (A kill in the run's last moments may find every rank done; a rank may
        # be idle at a round barrier while its owner is down: counted across the ranks.)
        # Reattaching needs the owner back (down_s after its kill) while a rank still works.
        ran_s = max(r["totals"]["seconds"] for r in rep["ranks"])
        if len(victims) > 1 and ran_s > ch["events"][1]["at_s"] + 1.0:
            assert sum(r["counters"]["owner_lost"] for r in rep["ranks"]) > 0
        if len(victims) > 1 and ran_s > ch["events"][1]["at_s"] + ch["events"][1]["down_s"] + 1.0:
            assert sum(r["counters"]["reattached"] for r in rep["ranks"]) > 0


TRACE = Path(__file__).resolve().parents[2] / "traces" / "mooncake_fast25_conversation.jsonl"


def test_workload_replays_the_public_trace_as_given_every_page_verified_hits_within_the_ceiling():
    """--trace: the Mooncake conversation trace's first 200 requests through two instances (TP 2,
    prefix-affine router) and a CPU owner: every request replayed, every restored page byte-checked,
    the ranks agreeing, and the hits never above the infinite-cache ceiling of exactly those requests."""
    from fluxon.trace import load_trace, prefix_ceiling
    out = run("--trace", str(TRACE), "--max-requests", "200", "--instances", "2", "--router", "prefix",
              "--page-tokens", "256", "--remote-cache", "1", "--prefill-tok-s", "400000", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    ranks = [r["totals"] for r in rep["ranks"]]
    assert sum(t["requests"] for t in ranks) == 2 * 200  # every request on one instance's two ranks
    assert all(t["verify_failures"] == 0 for t in ranks)
    tokens = sum(t["tokens"] for t in ranks)
    hits = sum(t["l1"] + t["l2"] + t["l3"] for t in ranks)
    ceiling = prefix_ceiling(load_trace(TRACE, 200))["ceiling_tokens_pct"]
    assert 0 < 100.0 * hits / tokens <= ceiling, (hits, tokens, ceiling)


def test_replay_refuses_a_malformed_trace_by_line_and_field_before_starting(tmp_path):
    """`fluxon replay TRACE` (the workload with --trace): a bad line is named, nothing starts."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [1]}\n')
    out = subprocess.run([FLUXON_BIN, "replay", str(bad), "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"{bad}:2: field 'hash_ids' has 1 blocks for input_length 600" in out.stderr, out.stderr
    assert not list(tmp_path.glob("fluxon-*"))


def test_replay_refuses_a_block_id_its_token_mapping_cannot_take(tmp_path):
    big = tmp_path / "big.jsonl"
    big.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [9000000]}\n')
    out = subprocess.run([FLUXON_BIN, "replay", str(big)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"{big}:1: field 'hash_ids': block id 9000000 is over 8388607" in out.stderr, out.stderr


def test_replay_paces_arrivals_by_trace_time_and_reports_ttft_per_request(tmp_path):
    """--speedup: requests arrive at their trace times / the factor (the run cannot end before the
    last one arrives), each request's modelled TTFT (from its arrival: queueing included) and hits go
    to --requests-out, and --model-preset shrinks a real model's pages by the scale it reports."""
    from fluxon.trace import load_trace
    reqs = load_trace(TRACE, 40)
    span_s = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) / 1000.0
    lines = tmp_path / "requests.jsonl"
    out = run("--trace", str(TRACE), "--max-requests", "40", "--instances", "2", "--tp", "1", "--speedup", "2",
              "--model-preset", "llama3-8b", "--prefill-tok-s", "1000000", "--requests-out", str(lines), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    assert rep["totals"]["seconds"] >= span_s / 2  # paced: the 40th request came at 12 s / 2
    assert rep["config"]["item_bytes"] * rep["config"]["page_tokens"] == 4096  # the default scale: 4 KiB pages
    assert "Llama-3-8B: 131072 KV bytes per token" in rep["model"] and "1/2048" in rep["model"]
    recs = [json.loads(x) for x in lines.read_text().splitlines()]
    assert [r["request"] for r in recs] == list(range(40))
    assert [r["tokens"] for r in recs] == [q.input_length for q in reqs]
    for r in recs:
        assert r["ttft_ms"] >= r["queued_ms"] >= 0
        assert r["l1_tokens"] + r["l2_tokens"] + r["l3_tokens"] <= r["tokens"]
    t = rep["totals"]
    assert sum(r["l1_tokens"] for r in recs) == t["l1"] and sum(r["l3_tokens"] for r in recs) == t["l3"]
    tt = rep["ttft_ms"]
    assert 0 < tt["p50"] <= tt["p90"] <= tt["p99"] <= max(r["ttft_ms"] for r in recs)


def test_replay_compare_prints_a_json_row_per_mode_and_point_with_min_and_ceiling():
    """--compare on the trace: one row per mode and capacity point with the issue's fields; hits never
    above Belady's MIN of the same bytes, MIN never above the infinite cache on the references replayed."""
    from fluxon.trace import load_trace, prefix_ceiling
    out = run("--trace", str(TRACE), "--max-requests", "60", "--instances", "2", "--tp", "1", "--page-tokens", "256",
              "--gpu-pages", "400", "--compare", "split,unified", "--capacity", "50", "--grant", "256KiB",
              "--bytes-per-token", "16384", "--scale", "0.001", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    assert [r["mode"] for r in rep["rows"]] == ["split", "unified"]
    for r in rep["rows"]:
        for f in ("mode", "capacity_pct", "hit_tokens_pct", "l1_pct", "l2_pct", "l3_pct", "ttft_p50_ms",
                  "ttft_p99_ms", "req_per_s", "min_bound_pct", "ceiling_pct"):
            assert f in r, f
        assert r["capacity_pct"] == 50 and r["errors"] == 0
        assert abs(r["hit_tokens_pct"] - (r["l1_pct"] + r["l2_pct"] + r["l3_pct"])) < 1e-6
        assert r["hit_tokens_pct"] <= r["min_bound_pct"] + 1e-9 <= r["ceiling_pct"] + 2e-9
        assert r["ttft_p50_ms"] <= r["ttft_p99_ms"] and r["req_per_s"] > 0
    # Every page read again counts in the ceiling: at least a leading-run prefix cache's share.
    assert rep["ceiling_pct"] >= prefix_ceiling(load_trace(TRACE, 60))["ceiling_tokens_pct"] - 1e-6
    assert rep["config"]["item_bytes"] == 16  # 16384 bytes per token x 0.001


def test_replay_refuses_an_l1_smaller_than_a_request_naming_it():
    out = subprocess.run([FLUXON_BIN, "replay", str(TRACE), "--max-requests", "5", "--gpu-pages", "10"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert re.search(r"--gpu-pages: 10 pages of 64 tokens cannot hold the request of .*:\d+ \(\d+ tokens", out.stderr), \
        out.stderr


def test_replay_stopped_by_sigterm_takes_its_cluster_down_and_leaves_nothing(tmp_path):
    """A replay killed with SIGTERM (a user's `kill`, a job scheduler) mid-run: its private cluster
    goes down - no daemon, no /dev/shm segment - and its temporary tree goes too."""
    import os
    import signal
    import time
    shm_before = set(os.listdir("/dev/shm"))  # segments, and multiprocessing's semaphores
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = subprocess.Popen([FLUXON_BIN, "replay", str(TRACE), "--max-requests", "3000", "--instances", "2",
                          "--tp", "1", "--remote-cache", "1", "--page-tokens", "512"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        seen = ""
        deadline = time.time() + 120
        while "requests" not in seen and time.time() < deadline:  # the first progress line: running
            seen += p.stderr.readline()
        assert "requests" in seen, seen
        run_dirs = list(tmp_path.glob("fluxon-wl*"))  # LocalCluster: fluxon-<cluster name>-*
        assert len(run_dirs) == 1
        daemons = subprocess.run(["pgrep", "-f", str(run_dirs[0])], capture_output=True, text=True).stdout.split()
        assert len(daemons) >= 3  # master, two instance owners, the CPU owner
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if p.poll() is None:  # failed before its SIGTERM: stopped the same way (a SIGKILL would leave the cluster up)
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    assert subprocess.run(["pgrep", "-f", str(run_dirs[0])], capture_output=True).returncode == 1  # none left
    assert not list(tmp_path.iterdir())
    assert set(os.listdir("/dev/shm")) <= shm_before
