"""One run (the private cluster, the rank processes, their results added up), the split-vs-unified
comparison, and the summary rows."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys

from ..testing import LocalCluster, find_fluxon_bin, free_port
from .bound import min_bound_pct, trace_pages
from .chaos import Chaos, chaos_check
from .rank import rank_main
from .requests import pct
from .scrape import owner_slots


def _double(size: str) -> str:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if size.endswith(u):
            return f"{int(float(size[:-len(u)]) * 2 * m)}"
    return str(int(size) * 2)


def _bytes(size) -> int:
    size = str(size)
    for u, m in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if size.endswith(u):
            return int(float(size[:-len(u)]) * m)
    return int(size)


def summarize(a, run) -> dict:
    """The design's P2 list for one run: throughput, hits by tier, where remote pages came from,
    replica and demotion work, physical against single-copy logical bytes, slots, errors."""
    r0, results = run["r0"], run["results"]
    t, ms, ctr = r0["totals"], r0["master_stats"], r0["counters"]
    tok = max(1, t["tokens"])
    page_bytes = a.page_tokens * a.item_bytes
    host = [r["host_pool"] for r in results if r["host_pool"]]
    slots = {}
    for o in run["owners"]:
        for k, v in o["slots"].items():
            slots[k] = slots.get(k, 0) + v
    used = sum(v for k, v in slots.items() if k != "free")
    physical = used * page_bytes + sum(h["pages"] for h in host) * page_bytes
    logical = (ms.get("routes", 0) + sum(h["not_in_store"] for h in host)) * page_bytes
    errors = run["verify_failures"] + ctr["backup_failed"] + ctr["backup_write_failed"] + ctr["restore_failed"]
    tt = r0["ttft_ms"]
    return {"mode": a.mode, "req_s": t["requests"] / t["seconds"], "seconds": t["seconds"],
            "ttft_p50_ms": tt["p50"], "ttft_p90_ms": tt["p90"], "ttft_p99_ms": tt["p99"],
            "l1": 100 * t["l1"] / tok, "l2": 100 * t["l2"] / tok, "l3": 100 * t["l3"] / tok,
            "total": 100 * (t["l1"] + t["l2"] + t["l3"]) / tok, "recomputed": t["recomputed"],
            "l3_joined_pages": t["l3_joined"], "l3_leader_pages": t["l3_leader"],
            "remote_gets": ms.get("get_started_total", 0), "replica_tasks": ms.get("replica_tasks_assigned_total", 0),
            "writeback_tasks": ms.get("writeback_tasks_total", 0), "demoted_keys": ms.get("demoted_keys_total", 0),
            "physical_bytes": physical, "logical_bytes": logical, "slots_used": used,
            "slots_free": slots.get("free", 0), "host_pool_evictions": sum(h["evicted"] for h in host),
            "errors": errors, "reconciled": run["reconciled"]}


def compare(a) -> int:
    """--compare split,unified: the same seeded trace at each capacity point, both ways (P2, P3). The
    capacity C is the L2 + L3 bytes, counted alike: split = the ranks' host pools (C/2, plain LRUs)
    + one store (C/2) that keeps its own copy of what L2 writes through to it; unified = the
    instance owners (C/2 together, hot-tier write-back and single-copy demotion) + one CPU owner
    (C/2). L1 (each rank's GPU pool) is the same in both."""
    modes = [m.strip() for m in a.compare.split(",") if m.strip()]
    if not modes or any(m not in ("split", "unified") for m in modes):
        raise SystemExit("workload: --compare takes split, unified or both (split,unified)")
    if a.config or a.remote_cache or a.hot_writeback or a.replica_policy not in (None, "none"):
        raise SystemExit("workload: --compare sets the cluster itself: no --config, --remote-cache, --hot-writeback "
                         "or --replica-policy")
    try:
        points = [float(x) for x in a.capacity.split(",")]
    except ValueError:
        raise SystemExit(f"workload: --capacity: not a list of percentages: {a.capacity!r}")
    if not points or any(p <= 0 for p in points):
        raise SystemExit("workload: --capacity: percentages must be > 0")
    if not 0 < a.hot_share < 1:
        raise SystemExit("workload: --hot-share must be in (0, 1)")
    a.prefill_tok_s = 100000.0 if a.prefill_tok_s is None else a.prefill_tok_s
    a.eviction_free_watermark = 0.1 if a.eviction_free_watermark is None else a.eviction_free_watermark
    a.grant = a.grant or "1MiB"
    grant = _bytes(a.grant)
    page_bytes = a.page_tokens * a.item_bytes
    trace, trace_tokens = trace_pages(a)
    ws_pages = len({h for req in trace for h in req})
    ws = ws_pages * page_bytes * a.tp
    # An infinite cache on exactly the references replayed: every page read again is found (MIN at
    # the working set's size).
    ceiling = min_bound_pct(trace, trace_tokens, a.page_tokens, ws_pages)
    if not a.json:
        what = (f"{a.trace}: {a.sessions} requests in {a.turns} rounds of {a.round_ms} ms, router {a.router}"
                if a.trace else f"{a.sessions} sessions x {a.turns} turns, seed {a.seed}")
        print(f"trace: {what}, {a.instances} instance(s) x TP {a.tp}; "
              f"working set {ws_pages} pages per rank = {ws / 2**20:.1f} MiB; L1 {a.gpu_pages} pages per rank; "
              f"prefill modelled at {a.prefill_tok_s:.0f} tokens/s per rank; an infinite cache finds "
              f"{ceiling:.1f}% of the tokens\n  bytes: {a.model_note}")
    rows = []
    base_prefix = a.key_prefix
    for point in points:
        total = ws * point / 100
        l3 = int(total / 2) // grant * grant
        l2_owner = int(total / 2 / a.instances) // grant * grant
        if l3 < grant or l2_owner < grant:
            raise SystemExit(f"workload: --capacity {point}%: {total / 2**20:.1f} MiB leaves an owner less than one "
                             f"grant ({a.grant}); raise the capacity, --item-bytes or lower --grant")
        # The same bytes and every instance's L1 as one cache of each rank's pages: the bound of both modes.
        bound = min_bound_pct(trace, trace_tokens, a.page_tokens,
                              (l3 + l2_owner * a.instances) // a.tp // page_bytes + a.gpu_pages * a.instances)
        for mode in modes:
            b = argparse.Namespace(**vars(a))
            b.mode, b.compare, b.key_prefix = mode, None, f"{base_prefix}c{point}{mode}"
            b.replica_policy = "none"
            if mode == "split":
                b.l2_pages = l2_owner // a.tp // page_bytes
                b.store_dram, b.remote_cache, b.hot_writeback = str(l3), 0, 0.0
            else:
                b.owner_dram, b.remote_cache, b.remote_cache_dram = str(l2_owner), 1, str(l3)
                b.hot_writeback = a.hot_share
                b.eviction_order = a.eviction_order or "prefix_depth"
                b.writeback_demote = a.writeback_demote or "off"
            b.progress_label = f"capacity {point:g}% {mode}: "
            row = summarize(b, run_once(b))
            row.update({"capacity_pct": point, "capacity_bytes": l3 + l2_owner * a.instances, "l3_bytes": l3,
                        "l2_bytes": l2_owner * a.instances, "min_bound": bound,
                        # the row: one per mode and point
                        "hit_tokens_pct": row["total"], "l1_pct": row["l1"], "l2_pct": row["l2"], "l3_pct": row["l3"],
                        "req_per_s": row["req_s"], "min_bound_pct": bound, "ceiling_pct": ceiling})
            rows.append(row)
            if not a.json:
                print(f"  capacity {point:g}%: {mode}: {row['total']:.1f}% hits (MIN {bound:.1f}%, ceiling "
                      f"{ceiling:.1f}%), {row['req_s']:.1f} req/s, TTFT p50 {row['ttft_p50_ms']:.1f} ms p99 "
                      f"{row['ttft_p99_ms']:.1f} ms", flush=True)
    ok = all(r["errors"] == 0 and r["reconciled"] for r in rows)
    if a.json:
        print(json.dumps({"config": {k: v for k, v in vars(a).items() if k not in ("pythonpath", "trace_requests")},
                          "model": a.model_note, "working_set_bytes": ws, "ceiling_pct": ceiling, "rows": rows},
                         indent=1))
        return 0 if ok else 1
    print()
    print(f"{'cap%':>5} {'MiB':>6} {'mode':>8} {'req/s':>7} {'TTFT50':>7} {'TTFT99':>7} {'L1%':>5} {'L2%':>5} "
          f"{'L3%':>5} {'total%':>6} {'MIN%':>5} {'ceil%':>5} "
          f"{'joined':>6} {'leader':>6} {'rgets':>6} {'repl':>5} {'wback':>5} {'demoted':>7} {'phys MB':>7} "
          f"{'logic MB':>8} {'slots used/free':>15} {'err':>3}")
    for r in rows:
        print(f"{r['capacity_pct']:5g} {r['capacity_bytes'] / 2**20:6.1f} {r['mode']:>8} {r['req_s']:7.1f} "
              f"{r['ttft_p50_ms']:7.1f} {r['ttft_p99_ms']:7.1f} {r['l1']:5.1f} {r['l2']:5.1f} {r['l3']:5.1f} "
              f"{r['total']:6.1f} {r['min_bound_pct']:5.1f} {r['ceiling_pct']:5.1f} {r['l3_joined_pages']:6d} "
              f"{r['l3_leader_pages']:6d} {r['remote_gets']:6d} {r['replica_tasks']:5d} {r['writeback_tasks']:5d} "
              f"{r['demoted_keys']:7d} {r['physical_bytes'] / 1e6:7.1f} {r['logical_bytes'] / 1e6:8.1f} "
              f"{str(r['slots_used']) + '/' + str(r['slots_free']):>15} {r['errors']:3d}"
              f"{'' if r['reconciled'] else ' S4 NOT RECONCILED'}")
    if set(modes) == {"split", "unified"}:
        for point in points:
            sp = next(r for r in rows if r["capacity_pct"] == point and r["mode"] == "split")
            un = next(r for r in rows if r["capacity_pct"] == point and r["mode"] == "unified")
            print(f"  {point:g}%: unified - split = {un['total'] - sp['total']:+.1f} points of total hits, "
                  f"req/s x{un['req_s'] / max(1e-9, sp['req_s']):.2f}, single-copy logical bytes "
                  f"x{un['logical_bytes'] / max(1, sp['logical_bytes']):.2f}; Belady's MIN (L1 + this capacity as "
                  f"one cache) {sp['min_bound']:.1f}%")
    return 0 if ok else 1


class Stopped(SystemExit):
    """SIGTERM or SIGHUP: the run unwinds as on Ctrl-C - its cluster goes down, its files go."""


def _stop(signum, _frame):
    raise Stopped(128 + signum)


def run_once(a):
    """One run: the private cluster (or --config's), the rank processes, their results added up."""
    if a.replica_policy is None:
        a.replica_policy = "eager" if a.remote_cache > 0 else "none"
    if a.instances < 1 or not 0 <= a.migrate <= 1:
        raise SystemExit("workload: --instances must be >= 1 and --migrate in [0, 1]")
    split = a.mode == "split"
    if split and (a.remote_cache or a.hot_writeback or a.config):
        raise SystemExit("workload: --mode split has its own L3 store: no --remote-cache, --hot-writeback or --config")
    if split and a.l2_pages <= 0:
        raise SystemExit("workload: --mode split needs --l2-pages (each rank's host pool)")
    cluster = lc = None
    metrics_ports = []  # (what, port) of each private owner
    if a.config:
        if a.instances > 1 or a.remote_cache:
            raise SystemExit("workload: --config serves one instance; --instances/--remote-cache need the private cluster")
        client_confs = [a.config]
    elif (not split and a.tp == 1 and a.instances == 1 and a.remote_cache == 0 and not a.hot_writeback
          and a.eviction_free_watermark is None and a.eviction_order is None):
        client_confs = [{"owners": [{"contribute_to_cluster_pool_size": {"dram": a.owner_dram},
                                     "local_reserve_grant_bytes": a.grant}]}]
    else:
        # split: one owner, the L3 store every instance writes through to; unified: an owner per instance
        n_inst_owners = 1 if split else a.instances
        order = {"eviction_order": a.eviction_order} if a.eviction_order and not split else {}
        if order and a.eviction_order == "prefix_depth" and a.eviction_stale_turnover:
            order["eviction_stale_turnover"] = a.eviction_stale_turnover
        if a.masters > 1:  # the HA mode: a private etcd (started by `cluster up`), masters campaigning
            master_metrics = [free_port() for _ in range(a.masters)]
            conf = {"etcd": {"lease_ttl_ms": a.lease_ms},
                    "masters": [{"metrics_port": m, **a.master_keys} for m in master_metrics]}
        else:
            master_metrics = [free_port() if a.chaos is not None else 0]
            conf = {"master": {"metrics_port": master_metrics[0], **a.master_keys}}
        conf["owners"] = []
        for i in range(n_inst_owners):
            o = {"metrics_port": free_port(), "local_reserve_grant_bytes": a.grant,
                 "contribute_to_cluster_pool_size": {"dram": (a.store_dram or a.owner_dram) if split else a.owner_dram}}
            if a.hot_writeback:
                o["replica_writeback_hot_capacity_ratio"] = a.hot_writeback
                if a.writeback_demote:
                    o["writeback_demote"] = a.writeback_demote == "on"
            if a.eviction_free_watermark is not None:
                o["eviction_free_watermark"] = a.eviction_free_watermark
            if a.eviction_interval_ms is not None:
                o["eviction_interval_ms"] = a.eviction_interval_ms
            metrics_ports.append(("store" if split else f"instance {i}", o["metrics_port"]))
            conf["owners"].append({**o, **order})
        rc_dram = a.remote_cache_dram or _double(a.owner_dram)
        # Only unified's owners: split's store stands in for another system's (it keeps the tier order).
        for j in range(a.remote_cache):
            o = {"role": "remote_cache", "metrics_port": free_port(), "contribute_to_cluster_pool_size": {"dram": rc_dram},
                 "local_reserve_grant_bytes": a.grant, **order}
            metrics_ports.append((f"cpu owner {j}", o["metrics_port"]))
            conf["owners"].append(o)
        lc = LocalCluster(conf, name=f"wl{os.getpid()}", fluxon_bin=find_fluxon_bin())
        lc.up()
        cluster = (lc.bin, lc.config)
        oports = lc.owner_ports[:n_inst_owners]
        client_confs = [{"client": {"owner_address": f"127.0.0.1:{oports[0 if split else i]}"}}
                        for i in range(a.instances)]
    if a.chaos is not None and (not cluster or split):
        raise SystemExit("workload: --chaos needs the private cluster of the unified mode (--instances 2 or "
                         "--remote-cache 1, no --config)")
    owners = []
    chaos = None
    procs = []
    try:
        ctx = mp.get_context("spawn")
        round_barrier = ctx.Barrier(a.tp * a.instances)
        q = ctx.Queue()
        # Kept referenced until the ranks are done: a collected Barrier unlinks its semaphores.
        collectives = [(ctx.Barrier(a.tp), ctx.Array("q", a.tp)) for _ in range(a.instances)]
        for inst, (barrier, slots) in enumerate(collectives):
            procs += [ctx.Process(target=rank_main, args=(inst, r, a, client_confs[inst], barrier, slots,
                                                          round_barrier, q)) for r in range(a.tp)]
        for p in procs:
            p.start()
        if a.chaos is not None:
            victims = set(a.chaos_victims.split(","))
            if not victims or not victims <= {"master", "owner", "client"}:
                raise SystemExit("workload: --chaos-victims: a comma list of master, owner, client")
            names = (["master"] if "master" in victims else []) + \
                ([f"owner-{i + 1}" for i in range(len(oports) + a.remote_cache)] if "owner" in victims else []) + \
                (["client"] if "client" in victims else [])
            chaos = Chaos(a.chaos, a.chaos_kills, cluster, names, client_confs, a.pythonpath, ctx,
                          master_metrics if a.masters > 1 else None)
            chaos.start()
        results = []
        import queue as _queue
        while len(results) < len(procs):
            try:
                results.append(q.get(timeout=0.5))
            except _queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:  # a rank died: its peers would wait at the collective forever
                    for p in procs:
                        p.kill()
                    raise SystemExit(f"workload: rank process exited with {dead[0].exitcode}")
        results.sort(key=lambda x: (x["instance"], x["rank"]))
        for p in procs:
            p.join()
        if chaos:
            chaos.finish()
            chaos.report = chaos_check(metrics_ports, master_metrics, chaos)
        owners = owner_slots(metrics_ports)
    finally:
        # Stopped or failed midway: the ranks go first (left alone they would replay on against a
        # cluster that is gone, and the interpreter's exit would wait for them).
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        if chaos:
            chaos.finish()  # (again, when a rank failed: the bystander goes before the cluster)
        if lc:
            # The private cluster's run_dir goes with it; a failed run keeps its logs and says where
            # (a run stopped by the user - Ctrl-C, SIGTERM - keeps nothing).
            keep = sys.exc_info()[0] not in (None, KeyboardInterrupt, Stopped)
            lc.down(keep_run_dir=keep)
            if keep:
                print(f"workload: the daemons' logs are in {lc.run_dir}", file=sys.stderr)
    # The instances' rank 0 together: requests and tokens add up, a round lasts as long as its slowest.
    leads = [r for r in results if r["rank"] == 0]
    r0 = {"totals": {}, "rounds": []}
    for k in leads[0]["totals"]:
        r0["totals"][k] = (max if k == "seconds" else sum)(x["totals"][k] for x in leads)
    for i in range(len(leads[0]["rounds"])):
        r0["rounds"].append({k: (max if k == "seconds" else sum)(x["rounds"][i][k] for x in leads)
                             for k in leads[0]["rounds"][i]})
    r0["latency_us"] = leads[0]["latency_us"]
    # Per request, every instance's (its rank 0's record): the modelled TTFT's percentiles over all of them.
    r0["requests"] = sorted((q for x in leads for q in x["requests"]), key=lambda q: q[0])
    ttft = [q[5] for q in r0["requests"]]
    r0["ttft_ms"] = {"p50": pct(ttft, 0.5), "p90": pct(ttft, 0.9), "p99": pct(ttft, 0.99),
                     "queued_p50": pct([q[6] for q in r0["requests"]], 0.5)}
    if a.requests_out:
        with open(a.requests_out, "w") as f:
            for q in r0["requests"]:
                f.write(json.dumps(dict(zip(("request", "tokens", "l1_tokens", "l2_tokens", "l3_tokens", "ttft_ms",
                                             "queued_ms"), q))) + "\n")
    r0["counters"] = {k: sum(x["counters"][k] for x in leads) for k in leads[0]["counters"]}
    # Split: every instance is attached to the one store, whose state each lead saw: count it once.
    r0["owner_stats"] = leads[0]["owner_stats"] if split else \
        {k: sum(x["owner_stats"][k] for x in leads) for k in leads[0]["owner_stats"]}
    r0["master_stats"] = leads[0]["master_stats"]
    st = r0["owner_stats"]
    # S4, to the byte: every selected byte's reclaim ended (or is still pending, said so).
    reconciled = st.get("evicted_bytes_total", 0) == sum(
        st.get(f"reclaim_{e}_bytes_total", 0) for e in ("committed", "restored", "obsolete")) + \
        st.get("pending_eviction_reclaim_bytes", 0)
    bad = sum(r["totals"]["verify_failures"] for r in results)
    for r in results:  # the per-request records go to --requests-out, not into every rank's report
        r.pop("requests", None)
    report = {"config": {k: v for k, v in vars(a).items() if k not in ("pythonpath", "trace_requests")}, "ranks": results,
              "totals": r0["totals"], "ttft_ms": r0["ttft_ms"], "model": a.model_note, "rounds": r0["rounds"],
              "master": r0["master_stats"], "owners": owners}
    ok = reconciled and bad == 0
    if chaos:
        ch = report["chaos"] = chaos.report
        # S4's reconciliation holds per owner generation: a restarted owner's counters start again.
        restarted = any(e["victim"].startswith("owner-") for e in ch["events"])
        ok = (reconciled or restarted) and bad == 0 and ch["baseline"] and ch["routes_match"] and ch["bystander_ok"]
    return {"report": report, "r0": r0, "results": results, "owners": owners, "reconciled": reconciled,
            "verify_failures": bad, "ok": ok}
