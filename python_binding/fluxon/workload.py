"""The multi-turn agent workload, shaped like SGLang's benchmark/hicache/bench_multiturn.py and the
design's runs ("96 sessions x 12 turns, concurrency 16", page size 64, TP=2).

Each TP rank is a process with a bounded "GPU" KV pool (host memory here) and a radix index of
SGLang-style page hash chains (SHA-256 over the previous hash and the page's token ids). Sessions
extend their own history; several share a system prompt. A request matches its prefix in L1 (the
rank's pool), restores what Fluxon has (L2: the local owner, L3: a remote owner) through the
hostless backend (get_start -> collective min -> common-prefix retry -> get_transfer -> commit gate
-> restore), recomputes the rest, and backs radix nodes up (write_through: at once; write_back: when
evicted). The ranks agree through a real collective between processes. Restored pages are checked
byte for byte against what compute would produce.

With --instances N there are N serving instances (each TP ranks attached to an owner of its own, as
on N GPU hosts) behind a router that keeps a session on its instance except, with odds --migrate
per turn, when it moves it to another one: the session's history is then in a remote owner (L3)
and is fetched over the data plane.

    PYTHONPATH=build/python python3 -m fluxon.workload --sessions 96 --turns 12 --concurrency 16
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

PAGE_TOKENS_DEFAULT = 64


def page_hash(prev: str, tokens) -> str:
    h = hashlib.sha256()
    if prev:
        h.update(bytes.fromhex(prev))
    for t in tokens:
        h.update(int(t).to_bytes(4, "little"))
    return h.hexdigest()


def pct(v, q):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


class Requests:
    """The request stream: identical on every rank (same seed)."""

    def __init__(self, a):
        rng = random.Random(a.seed)
        self.prompts = [[rng.randrange(1, 50000) for _ in range(a.system_tokens)] for _ in range(a.system_prompts)]
        self.sessions = []
        for s in range(a.sessions):
            self.sessions.append({"history": list(self.prompts[s % a.system_prompts]), "turn": 0,
                                  "inst": s % a.instances})
        self.rng = rng
        self.a = a

    def rounds(self):
        a = self.a
        for turn in range(a.turns):
            order = list(range(a.sessions))
            self.rng.shuffle(order)
            batch = []
            for s in order:
                sess = self.sessions[s]
                user = [self.rng.randrange(1, 50000) for _ in range(self.rng.randint(a.user_tokens // 2, a.user_tokens))]
                sess["history"] += user
                out = [self.rng.randrange(1, 50000) for _ in range(a.output_tokens)]
                if a.instances > 1 and turn > 0 and self.rng.random() < a.migrate:
                    sess["inst"] = (sess["inst"] + 1 + self.rng.randrange(a.instances - 1)) % a.instances
                batch.append((s, sess["inst"], list(sess["history"]), out))
                sess["history"] += out
            yield turn, batch


class GpuPool:
    """The bounded per-rank KV pool with a radix/LRU index: host memory standing in for the GPU, or
    (--gpu) real GPU memory, whose pages move to and from Fluxon values with the CUDA kernels
    (layout ``mla``, one layer: a page is ``page_tokens`` tokens of ``item_bytes``)."""

    def __init__(self, pages, page_bytes, page_tokens=0, item_bytes=0, gpu=False):
        self.page_bytes = page_bytes
        self.page_tokens, self.item_bytes = page_tokens, item_bytes
        self.gpu = gpu
        self.free = list(range(pages))
        self.index = OrderedDict()  # page hash -> (slot, backed)
        if gpu:
            import torch
            from fluxon.kv import GpuCopier
            self.torch = torch
            self.tensor = torch.zeros(pages * page_bytes, dtype=torch.uint8, device="cuda")
            self.base = self.tensor.data_ptr()
            self.copier = GpuCopier()
        else:
            self.buf = (ctypes.c_uint8 * (pages * page_bytes))()
            self.base = ctypes.addressof(self.buf)

    def backup(self, plan, slots):
        """Pool pages -> the plan's values (the backup kernel), complete on return."""
        if self.gpu:
            self.copier.write_pages_to_values(plan, "mla", 1, self.page_tokens, self.item_bytes, [self.base], [],
                                              list(slots))
            self.torch.cuda.synchronize()
        else:
            from fluxon import _fluxon
            _fluxon.plan_copy(plan, [self.slot_ptr(s) for s in slots], [self.page_bytes], len(slots), True)

    def restore(self, plan, slots):
        """The plan's values -> pool pages (the restore kernel), complete on return."""
        if self.gpu:
            self.copier.restore_pages_from_values(plan, "mla", 1, self.page_tokens, self.item_bytes, [self.base], [],
                                                  list(slots))
            self.torch.cuda.synchronize()
        else:
            from fluxon import _fluxon
            _fluxon.plan_copy(plan, [self.slot_ptr(s) for s in slots], [self.page_bytes], len(slots), False)

    def read(self, slot) -> bytes:
        if self.gpu:
            pb = self.page_bytes
            return self.tensor[slot * pb:(slot + 1) * pb].cpu().numpy().tobytes()
        return ctypes.string_at(self.slot_ptr(slot), self.page_bytes)

    def write(self, slot, data: bytes) -> None:
        if self.gpu:
            pb = self.page_bytes
            self.tensor[slot * pb:(slot + 1) * pb].copy_(self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8))
        else:
            ctypes.memmove(self.slot_ptr(slot), data, self.page_bytes)

    def lookup_prefix(self, hashes):
        n = 0
        while n < len(hashes) and hashes[n] in self.index:
            self.index.move_to_end(hashes[n])
            n += 1
        return n

    def slot_ptr(self, slot):
        return self.base + slot * self.page_bytes


def expected_page(h: str, rank: int, size: int) -> bytes:
    seed = hashlib.sha256(bytes.fromhex(h) + bytes([rank])).digest()
    return (seed * (size // len(seed) + 1))[:size]


def rank_main(inst, rank, a, client_conf, barrier, slots, round_barrier, out_q):
    sys.path.insert(0, a.pythonpath) if a.pythonpath else None
    import fluxon
    from fluxon import _fluxon
    from fluxon.sglang.hostless import HostlessBackend, NodeStorage

    def allgather(v):
        slots[rank] = int(v)
        barrier.wait()
        res = [slots[i] for i in range(a.tp)]
        barrier.wait()
        return res

    client = fluxon.KvClient(client_conf)
    lat = {"put_start": [], "commit_to_future": [], "get_start": [], "get_transfer": []}

    class Timed:
        def __init__(self, c):
            self.c = c

        def __getattr__(self, name):
            f = getattr(self.c, name)
            if name not in ("local_fast_put_start", "get_start", "get_transfer"):
                return f
            key = {"local_fast_put_start": "put_start"}.get(name, name)

            def timed(*args, **kw):
                t = time.perf_counter()
                try:
                    return f(*args, **kw)
                finally:
                    lat[key].append((time.perf_counter() - t) * 1e6)
            return timed

    from fluxon.sglang.admission import AdmissionConfig
    backend = HostlessBackend(Timed(client), tp_rank=rank, tp_size=a.tp, allgather=allgather,
                              admission=AdmissionConfig(policy=a.replica_policy), register_with_cuda=a.gpu)
    page_bytes = a.page_tokens * a.item_bytes
    pool = GpuPool(a.gpu_pages, page_bytes, a.page_tokens, a.item_bytes, a.gpu)
    commit_times = {}
    pending_nodes = []
    totals = {k: 0 for k in ("requests", "tokens", "l1", "l2", "l3", "recomputed", "backup_bytes", "restore_bytes",
                             "verify_failures", "backups", "restores", "remote_restores")}
    per_round = []
    suffix = f"_{a.model}_{rank}_{a.tp}"

    def key(h):
        return f"{a.key_prefix}:{h}{suffix}"

    page_parent = {}  # page hash -> the page before it in its request ("" for the first)

    def backup(hashes):
        """One radix node: its pages as one atomic group, continuing the page before its first."""
        parent = page_parent.get(hashes[0], "") if a.prefix_chains == "on" else ""
        node = NodeStorage([key(h) for h in hashes], parent_key=key(parent) if parent else "")
        slots_ = [pool.index[h][0] for h in hashes]
        # A page's "KV score" for the score policies: a stable function of the page (TP-invariant).
        scores = [int(h[:8], 16) / 0xFFFFFFFF for h in hashes]

        def write(plan):  # the backup kernel: one native call for the node
            pool.backup(plan, slots_)
        if backend.backup_node(node, page_bytes, write, scores):
            if node.storage_pending:
                commit_times[id(node)] = time.perf_counter()
                pending_nodes.append(node)
            for h in hashes:
                pool.index[h] = (pool.index[h][0], True)
            cur["backup_bytes"] += len(hashes) * page_bytes
            cur["backups"] += 1

    def settle():
        for node in list(pending_nodes):
            if node.future is not None and not node.future.done():
                continue
            t0 = commit_times.pop(id(node), None)
            backend.poll()
            if t0 is not None:
                lat["commit_to_future"].append((time.perf_counter() - t0) * 1e6)
            pending_nodes.remove(node)

    def allocate(n, locked):
        """n free slots, evicting LRU pages not used by the running request (write_back: each
        evicted radix page that is not backed up yet is written back first)."""
        need = n - len(pool.free)
        if need > 0:
            victims = [h for h in pool.index if h not in locked][:need]
            if len(victims) < need:
                raise SystemExit(f"rank {rank}: a request needs more pages than --gpu-pages={a.gpu_pages} holds")
            if a.write_policy == "write_back":
                for h in victims:
                    if not pool.index[h][1]:
                        backup([h])
            for h in victims:
                pool.free.append(pool.index.pop(h)[0])
        return [pool.free.pop() for _ in range(n)]

    t_start = time.perf_counter()
    stream = Requests(a)
    cur = {k: 0 for k in totals}
    for turn, batch in stream.rounds():
        r_tot = cur = {k: 0 for k in totals}
        t_round = time.perf_counter()
        mine = [(sid, tokens, out) for sid, at, tokens, out in batch if at == inst]
        for i, (sid, tokens, out) in enumerate(mine):
            full = len(tokens) // a.page_tokens
            hashes, prev = [], ""
            for p in range(full):
                parent = prev
                prev = page_hash(prev, tokens[p * a.page_tokens:(p + 1) * a.page_tokens])
                page_parent[prev] = parent
                hashes.append(prev)
            l1 = min(allgather(pool.lookup_prefix(hashes)))
            rest = hashes[l1:]
            restored = remote = 0
            if rest:
                if a.prefetch_policy != "best_effort":
                    deadline = time.perf_counter() + (a.prefetch_timeout if a.prefetch_policy == "timeout" else 3600)
                    while pending_nodes and time.perf_counter() < deadline:
                        settle()
                        if pending_nodes:
                            time.sleep(0.0005)
                res = backend.start_restore([key(h) for h in rest])
                if res.plan_ptr is not None:
                    n = res.restored_pages
                    slots_ = allocate(n, set(hashes))

                    def restore(plan, slots_=slots_, n=n):  # the restore kernel: one native call
                        pool.restore(plan, slots_[:n])
                    backend.finish_restore(res, restore)
                    for h, s in zip(rest[:n], slots_):
                        pool.index[h] = (s, True)
                        if pool.read(s) != expected_page(h, rank, page_bytes):
                            r_tot["verify_failures"] += 1
                    restored = n
                    remote = res.remote_pages
                    r_tot["restore_bytes"] += n * page_bytes
                    r_tot["restores"] += 1
                    r_tot["remote_restores"] += 1 if remote else 0
            # recompute the rest (a deterministic function of the page hash)
            compute = rest[restored:]
            if compute:
                slots_ = allocate(len(compute), set(hashes))
                for h, s in zip(compute, slots_):
                    pool.write(s, expected_page(h, rank, page_bytes))
                    pool.index[h] = (s, False)
                if a.write_policy == "write_through":
                    backup(compute)
            settle()
            r_tot["requests"] += 1
            r_tot["tokens"] += len(tokens)
            r_tot["l1"] += l1 * a.page_tokens
            r_tot["l2"] += (restored - remote) * a.page_tokens
            r_tot["l3"] += remote * a.page_tokens
            r_tot["recomputed"] += len(tokens) - (l1 + restored) * a.page_tokens
            if inst == 0 and rank == 0 and not a.json and (i % 16 == 0 or i == len(mine) - 1):
                print(f"\r  round {turn + 1}/{a.turns}  requests {i + 1}/{len(mine)} on instance 0", end="",
                      flush=True)
        r_tot["seconds"] = time.perf_counter() - t_round
        # A turn follows the previous turn of its session: the round ends on every instance, its
        # backups published, before the next begins (a migrated session finds its history).
        while pending_nodes:
            settle()
            time.sleep(0.0005)
        round_barrier.wait()
        for k in totals:
            totals[k] += r_tot[k]
        per_round.append(r_tot)
    while pending_nodes:  # the last round's write-backs settle
        settle()
        time.sleep(0.001)
    totals["seconds"] = time.perf_counter() - t_start
    # Every rank flushes its acknowledgements (stats() does) before anyone reads the owner's state.
    client.stats()
    allgather(0)
    stats = client.stats()
    end = time.time() + 10  # evictions in flight end (S4: committed, restored or obsolete)
    while time.time() < end and (stats.get("pending_eviction_reclaim_bytes") or stats.get("reclaims")):
        time.sleep(0.05)
        stats = client.stats()
    if a.remote_cache:  # replica tasks settle in the background: give them a moment to land
        end = time.time() + 5
        while time.time() < end and client.master_stats()["replica_tasks_queued"]:
            time.sleep(0.05)
        time.sleep(0.3)
    mstats = client.master_stats() if inst == 0 and rank == 0 else {}
    client.close()
    out_q.put({"instance": inst, "rank": rank, "totals": totals, "rounds": per_round,
               "latency_us": {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "n": len(v)} for k, v in lat.items()},
               "counters": backend.counters, "owner_stats": stats, "master_stats": mstats})


def find_fluxon_bin():
    env = os.environ.get("FLUXON_BIN")
    if env:
        return env
    here = Path(__file__).resolve().parent
    for cand in (here.parent.parent / "tools" / "fluxon", Path(shutil.which("fluxon") or "/nonexistent")):
        if cand.exists():
            return str(cand)
    raise SystemExit("fluxon binary not found: set FLUXON_BIN")


def _double(size: str) -> str:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if size.endswith(u):
            return f"{int(float(size[:-len(u)]) * 2 * m)}"
    return str(int(size) * 2)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    ap.add_argument("--replica-policy", choices=["none", "eager", "kv_score_only", "kv_score_low_only"], default=None,
                    help="replica admission of backups (default: eager with --remote-cache, else none)")
    ap.add_argument("--hot-writeback", type=float, default=0.0,
                    help="each instance owner's hot-tier share (replica_writeback_hot_capacity_ratio): cohorts it "
                         "evicts are written back to the remote_cache owner and demoted (0: off)")
    ap.add_argument("--eviction-free-watermark", type=float, default=None,
                    help="the instance owners' eviction_free_watermark (default: the owner's, 0.02)")
    ap.add_argument("--page-tokens", type=int, default=PAGE_TOKENS_DEFAULT)
    ap.add_argument("--item-bytes", type=int, default=64, help="bytes per token per rank in this stand-in")
    ap.add_argument("--gpu-pages", type=int, default=512, help="pages in each rank's bounded pool")
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
    a = ap.parse_args(argv)
    a.key_prefix = a.key_prefix or f"wl{os.getpid()}{int(time.time())}"
    a.pythonpath = str(Path(__file__).resolve().parent.parent)

    if a.replica_policy is None:
        a.replica_policy = "eager" if a.remote_cache > 0 else "none"
    if a.instances < 1 or not 0 <= a.migrate <= 1:
        raise SystemExit("workload: --instances must be >= 1 and --migrate in [0, 1]")
    cluster = None
    if a.config:
        if a.instances > 1 or a.remote_cache:
            raise SystemExit("workload: --config serves one instance; --instances/--remote-cache need the private cluster")
        client_confs = [a.config]
    elif (a.tp == 1 and a.instances == 1 and a.remote_cache == 0 and not a.hot_writeback
          and a.eviction_free_watermark is None):
        client_confs = [{"owners": [{"contribute_to_cluster_pool_size": {"dram": a.owner_dram},
                                     "local_reserve_grant_bytes": "4MiB"}]}]
    else:
        tmp = Path(tempfile.mkdtemp(prefix="fluxon-workload-"))
        mport = free_port()
        oports = [free_port() for _ in range(a.instances)]
        cfg = tmp / "cluster.yaml"
        text = f"cluster_name: wl{os.getpid()}\nrun_dir: {tmp}\nmaster: {{port: {mport}}}\nowners:\n"
        for i, op in enumerate(oports):
            hot = f", replica_writeback_hot_capacity_ratio: {a.hot_writeback}" if a.hot_writeback else ""
            if a.eviction_free_watermark is not None:
                hot += f", eviction_free_watermark: {a.eviction_free_watermark}"
            text += (f"  - {{node_id: {i + 1}, port: {op}, contribute_to_cluster_pool_size: {{dram: {a.owner_dram}}},"
                     f" local_reserve_grant_bytes: 4MiB{hot}}}\n")
        rc_dram = a.remote_cache_dram or _double(a.owner_dram)
        for j in range(a.remote_cache):
            text += (f"  - {{node_id: {a.instances + j + 1}, role: remote_cache, port: {free_port()},"
                     f" contribute_to_cluster_pool_size: {{dram: {rc_dram}}}, local_reserve_grant_bytes: 4MiB}}\n")
        cfg.write_text(text)
        fb = find_fluxon_bin()
        subprocess.run([fb, "cluster", "up", str(cfg)], check=True, stdout=subprocess.DEVNULL)
        cluster = (fb, cfg)
        client_confs = [{"client": {"owner_address": f"127.0.0.1:{op}"}} for op in oports]
    try:
        ctx = mp.get_context("spawn")
        round_barrier = ctx.Barrier(a.tp * a.instances)
        q = ctx.Queue()
        procs = []
        # Kept referenced until the ranks are done: a collected Barrier unlinks its semaphores.
        collectives = [(ctx.Barrier(a.tp), ctx.Array("q", a.tp)) for _ in range(a.instances)]
        for inst, (barrier, slots) in enumerate(collectives):
            procs += [ctx.Process(target=rank_main, args=(inst, r, a, client_confs[inst], barrier, slots,
                                                          round_barrier, q)) for r in range(a.tp)]
        for p in procs:
            p.start()
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
    finally:
        if cluster:
            subprocess.run([cluster[0], "cluster", "down", str(cluster[1])], stdout=subprocess.DEVNULL)
    # The instances' rank 0 together: requests and tokens add up, a round lasts as long as its slowest.
    leads = [r for r in results if r["rank"] == 0]
    r0 = {"totals": {}, "rounds": []}
    for k in leads[0]["totals"]:
        r0["totals"][k] = (max if k == "seconds" else sum)(x["totals"][k] for x in leads)
    for i in range(len(leads[0]["rounds"])):
        r0["rounds"].append({k: (max if k == "seconds" else sum)(x["rounds"][i][k] for x in leads)
                             for k in leads[0]["rounds"][i]})
    r0["latency_us"] = leads[0]["latency_us"]
    r0["counters"] = {k: sum(x["counters"][k] for x in leads) for k in leads[0]["counters"]}
    r0["owner_stats"] = {k: sum(x["owner_stats"][k] for x in leads) for k in leads[0]["owner_stats"]}
    r0["master_stats"] = leads[0]["master_stats"]
    t = r0["totals"]
    report = {"config": {k: v for k, v in vars(a).items() if k != "pythonpath"}, "ranks": results,
              "totals": t, "rounds": r0["rounds"], "master": r0["master_stats"]}
    if a.json:
        print(json.dumps(report, indent=1))
        st = r0["owner_stats"]
        reconciled = st.get("evicted_bytes_total", 0) == sum(
            st.get(f"reclaim_{e}_bytes_total", 0) for e in ("committed", "restored", "obsolete")) + \
            st.get("pending_eviction_reclaim_bytes", 0)
        return 0 if reconciled and all(r["totals"]["verify_failures"] == 0 for r in results) else 1
    print()
    print(f"{'round':>5} {'reqs':>5} {'tokens':>9} {'L1%':>6} {'L2%':>6} {'L3%':>6} {'total%':>7} "
          f"{'recomp':>8} {'backup MB':>10} {'restore MB':>11} {'req/s':>7}")
    for i, r in enumerate(r0["rounds"]):
        tok = max(1, r["tokens"])
        print(f"{i + 1:>5} {r['requests']:>5} {r['tokens']:>9} {100 * r['l1'] / tok:6.1f} {100 * r['l2'] / tok:6.1f} "
              f"{100 * r['l3'] / tok:6.1f} {100 * (r['l1'] + r['l2'] + r['l3']) / tok:7.1f} {r['recomputed']:>8} "
              f"{r['backup_bytes'] / 1e6:10.1f} {r['restore_bytes'] / 1e6:11.1f} {r['requests'] / r['seconds']:7.1f}")
    tok = max(1, t["tokens"])
    print(f"total: {t['requests']} requests, {t['tokens']} tokens in {t['seconds']:.2f} s = "
          f"{t['requests'] / t['seconds']:.1f} req/s ({a.instances} instance(s) x TP {a.tp}); hits L1 {100 * t['l1'] / tok:.1f}% "
          f"L2 {100 * t['l2'] / tok:.1f}% L3 {100 * t['l3'] / tok:.1f}% total "
          f"{100 * (t['l1'] + t['l2'] + t['l3']) / tok:.1f}%; recomputed {t['recomputed']} tokens; "
          f"{t['remote_restores']} of {t['restores']} restores fetched from a remote owner; "
          f"backup {t['backup_bytes'] / 1e6:.1f} MB, restore {t['restore_bytes'] / 1e6:.1f} MB")
    for k, v in r0["latency_us"].items():
        note = "  (observed at the next scheduler poll)" if k == "commit_to_future" else ""
        print(f"  {k:<17} p50 {v['p50']:8.1f} us  p99 {v['p99']:8.1f} us  ({v['n']} calls, instance 0 rank 0){note}")
    bad = sum(r["totals"]["verify_failures"] for r in results)
    mism = [r["counters"]["tp_mismatch_retry"] for r in results]
    st = r0["owner_stats"]
    ctr = r0["counters"]
    print(f"  owner slots: {st['slots_committed']} committed, {st['slots_free']} free, {st['grants']} grants; "
          f"backups {ctr['backup_backed']} backed, {ctr['backup_conflict']} already stored, "
          f"{ctr['backup_stored_elsewhere']} stored first by another owner, "
          f"{ctr['backup_failed'] + ctr['backup_write_failed']} failed; restores failed {ctr['restore_failed']}")
    ms = r0["master_stats"]
    print(f"  master: {ms.get('routes', 0)} routes, {ms.get('replicas', 0)} replicas; remote gets started "
          f"{ms.get('get_started_total', 0)}, done {ms.get('get_done_total', 0)}, revoked "
          f"{ms.get('get_revoked_total', 0)}; replica tasks ({a.replica_policy}) assigned "
          f"{ms.get('replica_tasks_assigned_total', 0)}, queued {ms.get('replica_tasks_queued', 0)}, "
          f"without a target {ms.get('replica_tasks_no_target_total', 0)}; evicted/removed copies "
          f"{ms.get('removed_with_copies_left_total', 0)} with another copy left, "
          f"{ms.get('removed_last_copy_total', 0)} last copies; write-back tasks "
          f"{ms.get('writeback_tasks_total', 0)}, backed {ms.get('writeback_backed_total', 0)}, demoted keys "
          f"{ms.get('demoted_keys_total', 0)}, demotions refused {ms.get('demote_kept_total', 0)}")
    # S4, to the byte: every selected byte's reclaim ended (or is still pending, said so).
    ended = st.get("reclaim_committed_bytes_total", 0) + st.get("reclaim_restored_bytes_total", 0) + \
        st.get("reclaim_obsolete_bytes_total", 0)
    pending = st.get("pending_eviction_reclaim_bytes", 0)
    reconciled = st.get("evicted_bytes_total", 0) == ended + pending
    print(f"  evictions (S4): {st.get('evicted_keys_total', 0)} keys / {st.get('evicted_bytes_total', 0)} bytes selected"
          f" = committed {st.get('reclaim_committed_bytes_total', 0)} + restored {st.get('reclaim_restored_bytes_total', 0)}"
          f" + obsolete {st.get('reclaim_obsolete_bytes_total', 0)} + pending {pending} bytes"
          f" ({'reconciled' if reconciled else 'NOT RECONCILED'}); {st.get('reclaim_started_total', 0)}"
          f" transactions; deferred: master activity {st.get('reclaim_master_activity_total', 0)}, partial"
          f" {st.get('reclaim_master_partial_total', 0)}, closure {st.get('reclaim_master_closure_total', 0)}, owner holder"
          f" {st.get('reclaim_owner_holder_total', 0)}, write {st.get('reclaim_owner_write_total', 0)}; back-offs"
          f" {st.get('reclaim_retry_queued_total', 0)}, then committed {st.get('reclaim_retry_completed_total', 0)},"
          f" restored {st.get('reclaim_restored_total', 0)}; master fenced {ms.get('reclaim_fenced_total', 0)},"
          f" refused gets {ms.get('reclaim_refused_gets_total', 0)} puts {ms.get('reclaim_refused_puts_total', 0)},"
          f" fences left {ms.get('reclaim_fences', 0)}")
    print(f"  restored pages verified byte for byte: {'all ok' if bad == 0 else f'{bad} FAILED'}; "
          f"TP mismatch retries {mism}; gate rejections {[r['counters']['gate_rejected'] for r in results]}")
    return 0 if bad == 0 and reconciled else 1


if __name__ == "__main__":
    sys.exit(main())
