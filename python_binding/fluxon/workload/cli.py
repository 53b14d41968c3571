"""The command line: `fluxon workload ...` / `python -m fluxon.workload ...`."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from .report import print_report
from .requests import MODEL_PRESETS, PAGE_TOKENS_DEFAULT, SMALLEST_SLOT, TraceRequests
from .run import _stop, compare, run_once


def _stale_turnover(v: str):
    """--eviction-stale-turnover: auto, or a number of segments (the owner checks its range)."""
    if v == "auto":
        return v
    try:
        return float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"auto or a number of segments, not {v!r}")


def main(argv=None):
    from . import __doc__ as workload_doc  # the package's: what the workload is
    ap = argparse.ArgumentParser(prog="fluxon workload", description=workload_doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=None, metavar="FILE",
                    help="replay a public trace (Mooncake's FAST'25 format, traces/README.md) instead of the "
                         "seeded agent sessions: --sessions, --turns and --migrate do not apply")
    ap.add_argument("--max-requests", type=int, default=None, help="--trace: replay its first N requests")
    ap.add_argument("--router", choices=["rr", "prefix"], default="rr",
                    help="--trace: which instance takes a request: round-robin, or by its first block")
    ap.add_argument("--round-ms", type=int, default=60000,
                    help="--trace: trace time per round (a round ends on every instance before the next)")
    ap.add_argument("--speedup", type=float, default=None,
                    help="--trace: requests arrive at their trace times divided by this (queueing counts in TTFT); "
                         "default: closed loop (each instance takes its next request when it is free)")
    ap.add_argument("--model-preset", choices=sorted(MODEL_PRESETS), default=None,
                    help="a real model's KV bytes per token (bf16; split across TP ranks but for MLA), shrunk by "
                         "--scale: sets --item-bytes")
    ap.add_argument("--bytes-per-token", type=int, default=None,
                    help="KV bytes per token of the whole model (instead of a preset's), shrunk by --scale")
    ap.add_argument("--scale", type=float, default=None,
                    help="with --model-preset/--bytes-per-token: every page's bytes times this (default: a page "
                         f"of {SMALLEST_SLOT} bytes, an owner's smallest slot), so the working set fits the machine")
    ap.add_argument("--requests-out", default=None, metavar="FILE",
                    help="write one JSON line per request: its index, tokens, L1/L2/L3 hit tokens, modelled TTFT")
    ap.add_argument("--sessions", type=int, default=96)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--tp", type=int, default=2, choices=[1, 2])
    ap.add_argument("--instances", type=int, default=1,
                    help="serving instances, each with its own owner (L3 hits need 2 or more)")
    ap.add_argument("--migrate", type=float, default=0.25,
                    help="odds per turn that the router moves a session to another instance")
    ap.add_argument("--remote-cache", type=int, default=0,
                    help="CPU-only owners (role remote_cache) in the private cluster: replica targets")
    ap.add_argument("--remote-cache-dram", default=None, help="each remote_cache owner's segment (default: 2x owner)")
    ap.add_argument("--replica-policy", choices=["none", "eager", "kv_score_only", "kv_score_low_only",
                                                 "kv_score_pressure_budget"], default=None,
                    help="replica admission of backups (default: eager with --remote-cache, else none)")
    ap.add_argument("--replica-budget-pages", type=int, default=64,
                    help="kv_score_pressure_budget: replica pages of a backup batch at full eviction pressure")
    ap.add_argument("--hot-writeback", type=float, default=0.0,
                    help="each instance owner's hot-tier share (replica_writeback_hot_capacity_ratio): cohorts it "
                         "evicts are written back to the remote_cache owner and demoted (0: off)")
    ap.add_argument("--writeback-demote", choices=["on", "off"], default=None,
                    help="with --hot-writeback: on - a written-back cohort leaves the instance owner (single-copy "
                         "demotion); off - it stays, remote-complete, evicted first (default: the owner's, on; "
                         "--compare: off)")
    ap.add_argument("--eviction-stale-turnover", type=_stale_turnover, default=None,
                    help="with prefix_depth: the owners' eviction_stale_turnover, auto or segments (default: the "
                         "owner's, auto - the horizon follows the re-read intervals the owner sees)")
    ap.add_argument("--eviction-order", choices=["tier", "prefix_depth"], default=None,
                    help="the owners' eviction_order (default: the owner's, tier; --compare: prefix_depth)")
    ap.add_argument("--eviction-free-watermark", type=float, default=None,
                    help="the instance owners' eviction_free_watermark (default: the owner's, 0.02; --compare: 0.1 "
                         "for split's store and unified's instance owners alike - puts find a free slot at once)")
    ap.add_argument("--eviction-interval-ms", type=int, default=None,
                    help="the owners' eviction_interval_ms (default: the owner's, 200)")
    ap.add_argument("--page-tokens", type=int, default=PAGE_TOKENS_DEFAULT)
    ap.add_argument("--item-bytes", type=int, default=64, help="bytes per token per rank in this stand-in")
    ap.add_argument("--gpu-pages", type=int, default=None,
                    help="pages in each rank's bounded pool, L1 (default 512; --trace: twice its longest request)")
    ap.add_argument("--gpu", action="store_true",
                    help="the pool in real GPU memory (PyTorch), pages moved by Fluxon's CUDA kernels")
    ap.add_argument("--system-prompts", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--user-tokens", type=int, default=384)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--write-policy", choices=["write_back", "write_through"], default="write_back")
    ap.add_argument("--prefix-chains", choices=["on", "off"], default="on",
                    help="backups name each node's parent page (radix_parent_keys): prefix-aware eviction")
    ap.add_argument("--prefetch-policy", choices=["best_effort", "wait_complete", "timeout"], default="best_effort")
    ap.add_argument("--prefetch-timeout", type=float, default=0.05)
    ap.add_argument("--config", help="a Fluxon client config (external owner); default: a private cluster")
    ap.add_argument("--owner-dram", default="2GiB", help="the private owner's segment (small: eviction at work)")
    ap.add_argument("--model", default="agent-model")
    ap.add_argument("--key-prefix", default=None)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--mode", choices=["unified", "split"], default="unified",
                    help="unified: Fluxon is L2 and L3 (the instance owners, a CPU owner with --remote-cache); "
                         "split: each rank's own host pool is L2 (a plain LRU, as HiCache's) and one Fluxon owner "
                         "is a separate L3 store that keeps its own copies (write-through from L2)")
    ap.add_argument("--l2-pages", type=int, default=0, help="split: pages in each rank's host pool (L2)")
    ap.add_argument("--store-dram", default=None, help="split: the L3 store's segment (default: --owner-dram)")
    ap.add_argument("--prefill-tok-s", type=float, default=None,
                    help="a modelled prefill: a rank waits tokens/rate for what it recomputes (0: none, the "
                         "default of a single run; recompute here is only writing the page; --compare: 100000)")
    ap.add_argument("--grant", default=None, help="the owners' local_reserve_grant_bytes (default 4MiB; --compare 1MiB)")
    ap.add_argument("--compare", default=None, metavar="split,unified",
                    help="run both on the same seeded trace at each --capacity point and print them side by side")
    ap.add_argument("--capacity", default="25,50,75,100",
                    help="--compare: total L2 + L3 capacity points, %% of the trace's working set")
    ap.add_argument("--chaos", type=int, default=None, metavar="SEED",
                    help="crash chaos: kill -9 daemons (an owner, the master) and a bystander client at seeded "
                         "random points while the ranks run, restart each, and check at the end that nothing wrong "
                         "was read, the owners are back at baseline and the master's routes match their slots")
    ap.add_argument("--chaos-kills", type=int, default=3, help="--chaos: how many kills")
    ap.add_argument("--chaos-victims", default="master,owner,client",
                    help="--chaos: what may be killed, of master (the leader with --masters), owner, client")
    ap.add_argument("--masters", type=int, default=1,
                    help="the private cluster's masters: 2 or more run the HA mode (a private etcd, an election); "
                         "with --chaos a master kill is the leader's, and each is timed to the first remote get "
                         "through the new leader")
    ap.add_argument("--lease-ms", type=int, default=1000, help="--masters: the leader's etcd lease (whole seconds)")
    ap.add_argument("--master-tiers", default=None, metavar="T2,T1",
                    help="the master's route tiers as shares of each owner's segment: T2 "
                         "(replica_cache_capacity_ratio) and T1 (replica_writeback_tier1_capacity_ratio, 0: none)")
    ap.add_argument("--hot-share", type=float, default=0.45,
                    help="--compare, unified: the instance owners' hot-tier share (owner-hot write-back + demotion)")
    a = ap.parse_args(argv)
    if a.speedup is not None and (not a.trace or a.speedup <= 0):
        ap.error("--speedup: needs --trace and a positive factor")
    a.model_note = f"{a.item_bytes} bytes per token per rank (a stand-in, no model's)"
    if a.model_preset or a.bytes_per_token is not None:
        preset = MODEL_PRESETS.get(a.model_preset, {"name": "the model", "bytes_per_token": 0, "mla": False})
        bpt = a.bytes_per_token if a.bytes_per_token is not None else preset["bytes_per_token"]
        if bpt <= 0:
            ap.error(f"--bytes-per-token: must be positive, not {bpt}")
        per_rank = bpt if preset["mla"] else bpt / a.tp
        real_page = per_rank * a.page_tokens
        scale = a.scale if a.scale is not None else SMALLEST_SLOT / real_page
        if not 0 < scale <= 1:
            ap.error(f"--scale: must be in (0, 1], not {scale:g}")
        a.item_bytes, a.scale = max(1, round(per_rank * scale)), scale
        a.model_note = (f"{preset['name']}: {bpt} KV bytes per token, {per_rank:.0f} per rank (TP {a.tp}"
                        f"{', MLA: whole on every rank' if preset['mla'] else ''}); scale {scale:.3g} (1/{1 / scale:.0f})"
                        f": a page of {a.page_tokens} tokens is {a.item_bytes * a.page_tokens} bytes here for "
                        f"{real_page / 2**20:.2f} MiB on a real rank")
    a.progress_label = ""
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _stop)
    if a.trace:  # checked whole before anything starts: a malformed line is named with its field
        from fluxon.trace import TraceError, load_trace
        if a.round_ms <= 0:
            ap.error(f"--round-ms: must be positive, not {a.round_ms}")
        try:
            reqs = load_trace(a.trace, a.max_requests)
        except (TraceError, OSError) as e:
            ap.error(f"--trace: {e}")
        big = next((r for r in reqs if max(r.hash_ids) > TraceRequests.MAX_BLOCK_ID), None)
        if big:
            ap.error(f"--trace: {a.trace}:{big.line}: field 'hash_ids': block id {max(big.hash_ids)} is over "
                     f"{TraceRequests.MAX_BLOCK_ID} (this replay gives each block 512 32-bit token ids)")
        a.trace_requests = reqs  # the ranks replay exactly what was checked
        longest = max(reqs, key=lambda r: r.input_length)
        need = longest.input_length // a.page_tokens
        if a.gpu_pages is None:
            a.gpu_pages = max(512, 2 * need)
        elif a.gpu_pages < need:
            ap.error(f"--gpu-pages: {a.gpu_pages} pages of {a.page_tokens} tokens cannot hold the request of "
                     f"{a.trace}:{longest.line} ({longest.input_length} tokens, {need} full pages)")
        a.turns = (reqs[-1].timestamp_ms - reqs[0].timestamp_ms) // a.round_ms + 1  # rounds
        a.sessions = len(reqs)
    a.gpu_pages = 512 if a.gpu_pages is None else a.gpu_pages
    a.master_keys = {}
    if a.master_tiers:
        try:
            t2, t1 = (float(x) for x in a.master_tiers.split(","))
        except ValueError:
            ap.error(f"--master-tiers: expected T2,T1 (two shares, e.g. 0.8,0.6), not {a.master_tiers!r}")
        if not (0 < t2 <= 1 and 0 <= t1 < t2):
            ap.error(f"--master-tiers: expected 0 < T1 < T2 <= 1 (or T1 = 0), not {a.master_tiers!r}")
        a.master_keys = {"replica_cache_capacity_ratio": t2,
                         **({"replica_writeback_tier1_capacity_ratio": t1} if t1 else {})}
    a.key_prefix = a.key_prefix or f"wl{os.getpid()}{int(time.time())}"
    a.pythonpath = str(Path(__file__).resolve().parent.parent.parent)  # the directory holding the fluxon package
    if a.compare:
        return compare(a)
    a.prefill_tok_s = a.prefill_tok_s or 0.0
    a.grant = a.grant or "4MiB"
    run = run_once(a)
    if a.json:
        print(json.dumps(run["report"], indent=1))
        return 0 if run["ok"] else 1
    print_report(a, run)
    return 0 if run["ok"] else 1
