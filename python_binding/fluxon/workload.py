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
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

from .testing import LocalCluster, find_fluxon_bin, free_port

PAGE_TOKENS_DEFAULT = 64

# KV bytes per token of real models (bf16): layers x KV heads x head dim x 2 (K and V) x 2 bytes, or
# for MLA layers x (the 512-wide latent + 64 rope dims) x 2 bytes. GQA/MHA heads are split across TP
# ranks; MLA's latent is whole on every rank.
MODEL_PRESETS = {
    "llama3-8b": {"name": "Llama-3-8B", "bytes_per_token": 32 * 8 * 128 * 2 * 2, "mla": False},
    "qwen3-32b": {"name": "Qwen3-32B", "bytes_per_token": 64 * 8 * 128 * 2 * 2, "mla": False},
    "deepseek-v3": {"name": "DeepSeek-V3 (MLA)", "bytes_per_token": 61 * (512 + 64) * 2, "mla": True},
}
BACKUP_BATCH_PAGES = 256  # pages per backup put at most (a radix node is never split)
SMALLEST_SLOT = 4096  # an owner's smallest slot: a page below it wastes the rest of its slot


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
                batch.append((s, sess["inst"], list(sess["history"]), out, None))
                sess["history"] += out
            yield turn, batch

    def count(self, inst):
        """Requests instance `inst` serves in the whole run (for progress)."""
        a = self.a
        return a.sessions * a.turns // a.instances + (1 if inst < a.sessions * a.turns % a.instances else 0)


class TraceRequests:
    """A public trace's requests (fluxon/trace.py: Mooncake's format) as the ranks' request stream,
    replayed as given: each request's prompt is its blocks' tokens (block b's are a function of b, so
    requests that share leading blocks share those pages' hashes), its instance the router's choice
    (round-robin, or prefix-affine: by its first block), and requests are grouped into rounds of
    --round-ms of trace time (a round ends on every instance before the next begins)."""

    MAX_BLOCK_ID = (1 << 32) // 512 - 1  # block b's tokens are b * 512 + 1 .. b * 512 + 512: 32-bit ids

    def __init__(self, a):
        self.reqs = a.trace_requests  # loaded and checked once, by main()
        self.a = a

    @staticmethod
    def tokens(r):
        out = []
        for i, b in enumerate(r.hash_ids):
            base = b * 512 + 1
            out.extend(range(base, base + r.block_tokens(i)))
        return out

    def rounds(self):
        a, t0 = self.a, self.reqs[0].timestamp_ms
        batch, turn = [], 0
        for n, r in enumerate(self.reqs):
            k = (r.timestamp_ms - t0) // a.round_ms
            while k > turn:
                yield turn, batch
                batch, turn = [], turn + 1
            batch.append((n, self.instance(n, r), self.tokens(r), [], (r.timestamp_ms - t0) / 1000.0))
        yield turn, batch

    def instance(self, n, r):
        return (r.hash_ids[0] if self.a.router == "prefix" else n) % self.a.instances

    def count(self, inst):
        return sum(1 for n, r in enumerate(self.reqs) if self.instance(n, r) == inst)


def request_stream(a):
    """The ranks' request stream: the public trace given by --trace, or the seeded agent sessions."""
    return TraceRequests(a) if getattr(a, "trace", None) else Requests(a)


def lru_prefix(index: OrderedDict, hashes) -> int:
    """How many leading hashes an LRU index holds; each one found becomes the most recent."""
    n = 0
    while n < len(hashes) and hashes[n] in index:
        index.move_to_end(hashes[n])
        n += 1
    return n


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
        return lru_prefix(self.index, hashes)

    def slot_ptr(self, slot):
        return self.base + slot * self.page_bytes


class HostPool:
    """Split mode's L2 (``--mode split``): the rank's own host-memory pool, a plain LRU of pages, as
    HiCache's host pool is. Every rank of an instance runs the same operations on its own pool."""

    def __init__(self, pages, page_bytes):
        self.page_bytes = page_bytes
        self.buf = (ctypes.c_uint8 * max(1, pages * page_bytes))()
        self.base = ctypes.addressof(self.buf)
        self.free = list(range(pages))
        self.index = OrderedDict()  # page hash -> slot
        self.evicted = 0

    def lookup_prefix(self, hashes):
        return lru_prefix(self.index, hashes)

    def read(self, h) -> bytes:
        return ctypes.string_at(self.base + self.index[h] * self.page_bytes, self.page_bytes)

    def insert(self, h, data: bytes) -> None:
        if h in self.index:
            self.index.move_to_end(h)
            return
        if not self.free:
            if not self.index:
                return  # a pool of no pages
            self.free.append(self.index.popitem(last=False)[1])
            self.evicted += 1
        slot = self.free.pop()
        ctypes.memmove(self.base + slot * self.page_bytes, data, self.page_bytes)
        self.index[h] = slot


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
                              admission=AdmissionConfig(
                                  policy=a.replica_policy, max_replica_pages_per_batch=a.replica_budget_pages
                                  if a.replica_policy == "kv_score_pressure_budget" else None), register_with_cuda=a.gpu)
    page_bytes = a.page_tokens * a.item_bytes
    pool = GpuPool(a.gpu_pages, page_bytes, a.page_tokens, a.item_bytes, a.gpu)
    split = a.mode == "split"
    host = HostPool(a.l2_pages, page_bytes) if split else None  # split: L2 here, Fluxon is the L3 store
    commit_times = {}
    pending_nodes = []
    totals = {k: 0 for k in ("requests", "tokens", "l1", "l2", "l3", "l3_joined", "l3_leader", "recomputed",
                             "backup_bytes", "restore_bytes", "verify_failures", "backups", "restores",
                             "remote_restores", "prefill_seconds", "round_wait_seconds")}
    per_round = []
    suffix = f"_{a.model}_{rank}_{a.tp}"

    def key(h):
        return f"{a.key_prefix}:{h}{suffix}"

    page_parent = {}  # page hash -> the page before it in its request ("" for the first)
    page_depth = {}   # page hash -> pages before it in its request (a radix node's content depth)

    def backup(*nodes):
        """Radix nodes (lists of page hashes) in put batches of at most BACKUP_BATCH_PAGES pages (a
        node whole; an L1 evicting for a long prompt would otherwise ask for more slots than a small
        owner has)."""
        batch, n = [], 0
        for node in nodes:
            if batch and n + len(node) > BACKUP_BATCH_PAGES:
                backup_batch(batch)
                batch, n = [], 0
            batch.append(node)
            n += len(node)
        if batch:
            backup_batch(batch)

    def backup_batch(nodes):
        """Radix nodes (lists of page hashes) in one put batch: each node's pages one atomic group,
        continuing the page before its first (SGLang's backup thread batches pages the same way)."""
        storage = []
        for hashes in nodes:
            parent = page_parent.get(hashes[0], "") if a.prefix_chains == "on" else ""
            storage.append(NodeStorage([key(h) for h in hashes], parent_key=key(parent) if parent else "",
                                       depth=page_depth.get(hashes[0], 0)))
            if split:  # the host pool first; the store keeps its own copy (write-through from L2)
                for h in hashes:
                    host.insert(h, pool.read(pool.index[h][0]))
        by_node = {id(n): hashes for n, hashes in zip(storage, nodes)}
        # A page's "KV score" for the score policies: a stable function of the page (TP-invariant).
        scores = [[int(h[:8], 16) / 0xFFFFFFFF for h in hashes] for hashes in nodes]

        def write(plan, batch):  # the backup kernel: one native call for the batch
            pool.backup(plan, [pool.index[h][0] for n in batch for h in by_node[id(n)]])
        for node, hashes, ok in zip(storage, nodes, backend.backup_nodes(storage, page_bytes, write, scores)):
            if not ok:
                continue
            if node.storage_pending and id(node.future) not in commit_times:
                commit_times[id(node.future)] = time.perf_counter()
                pending_nodes.append(node.future)
            for h in hashes:
                pool.index[h] = (pool.index[h][0], True)
            cur["backup_bytes"] += len(hashes) * page_bytes
            cur["backups"] += 1

    def settle():
        for future in list(pending_nodes):  # one future per put batch
            if not future.done():
                continue
            t0 = commit_times.pop(id(future), None)
            backend.poll()
            if t0 is not None:
                lat["commit_to_future"].append((time.perf_counter() - t0) * 1e6)
            pending_nodes.remove(future)

    def allocate(n, locked):
        """n free slots, evicting LRU pages not used by the running request (write_back: each
        evicted radix page that is not backed up yet is written back first)."""
        need = n - len(pool.free)
        if need > 0:
            victims = [h for h in pool.index if h not in locked][:need]
            if len(victims) < need:
                raise SystemExit(f"rank {rank}: a request needs more pages than --gpu-pages={a.gpu_pages} holds")
            if a.write_policy == "write_back":  # one batch, a node per page
                unbacked = [[h] for h in victims if not pool.index[h][1]]
                if unbacked:
                    backup(*unbacked)
            for h in victims:
                pool.free.append(pool.index.pop(h)[0])
        return [pool.free.pop() for _ in range(n)]

    stream = request_stream(a)
    lead = rank == 0  # the TP ranks of an instance move in lockstep: its rank 0 records requests
    progress = inst == 0 and lead and not a.json
    mine_total, done, hit_tokens, all_tokens, t_shown = stream.count(inst) if progress else 0, 0, 0, 0, 0.0
    tty = sys.stderr.isatty()  # a terminal: one line redrawn; a log: a line every 10 s
    cr = "\r" if tty else ""
    requests = []  # per request (lead ranks): index, tokens, L1/L2/L3 hit tokens, modelled TTFT
    t_start = time.perf_counter()
    cur = {k: 0 for k in totals}
    for turn, batch in stream.rounds():
        r_tot = cur = {k: 0 for k in totals}
        t_round = time.perf_counter()
        mine = [(sid, tokens, out, arrival) for sid, at, tokens, out, arrival in batch if at == inst]
        for i, (sid, tokens, out, arrival) in enumerate(mine):
            # --speedup: the request arrives at its trace time, compressed; closed loop: when the rank is free.
            due = t_start + arrival / a.speedup if a.speedup and arrival is not None else None
            if due is not None and due > time.perf_counter():
                time.sleep(due - time.perf_counter())
            t_req = time.perf_counter()
            arrived = t_req if due is None else due
            full = len(tokens) // a.page_tokens
            hashes, prev = [], ""
            for p in range(full):
                parent = prev
                prev = page_hash(prev, tokens[p * a.page_tokens:(p + 1) * a.page_tokens])
                page_parent[prev] = parent
                page_depth[prev] = p
                hashes.append(prev)
            l1 = min(allgather(pool.lookup_prefix(hashes)))
            rest = hashes[l1:]
            restored = remote = from_host = 0
            if rest and split:  # L2: the rank's host pool, then the store for what follows
                from_host = min(allgather(host.lookup_prefix(rest)))
                if from_host:
                    slots_ = allocate(from_host, set(hashes))
                    for h, s in zip(rest[:from_host], slots_):
                        pool.write(s, host.read(h))
                        pool.index[h] = (s, True)
                        if pool.read(s) != expected_page(h, rank, page_bytes):
                            r_tot["verify_failures"] += 1
                    rest = rest[from_host:]
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
                    remote = n if split else res.remote_pages  # split: every store hit is L3
                    r_tot["l3_joined"] += res.joined_pages
                    r_tot["l3_leader"] += res.remote_pages - res.joined_pages
                    if split:  # HiCache's L3 -> L2 -> L1: the page enters the host pool too
                        for h, s in zip(rest[:n], slots_):
                            host.insert(h, pool.read(s))
                    r_tot["restore_bytes"] += n * page_bytes
                    r_tot["restores"] += 1
                    r_tot["remote_restores"] += 1 if remote else 0
            # recompute the rest (a deterministic function of the page hash)
            compute = rest[restored:]
            if compute and a.prefill_tok_s:  # the modelled prefill: the GPU busy for these tokens
                busy = len(compute) * a.page_tokens / a.prefill_tok_s
                time.sleep(busy)
                r_tot["prefill_seconds"] += busy
            if compute:
                slots_ = allocate(len(compute), set(hashes))
                for h, s in zip(compute, slots_):
                    pool.write(s, expected_page(h, rank, page_bytes))
                    pool.index[h] = (s, False)
            # TTFT: from arrival to the prompt's KV in L1 (queueing, lookups, restores, the modelled prefill).
            ttft_ms = (time.perf_counter() - arrived) * 1e3
            if compute and a.write_policy == "write_through":
                backup(compute)
            settle()
            r_tot["requests"] += 1
            r_tot["tokens"] += len(tokens)
            r_tot["l1"] += l1 * a.page_tokens
            r_tot["l2"] += (from_host + restored - remote) * a.page_tokens
            r_tot["l3"] += remote * a.page_tokens
            r_tot["recomputed"] += len(tokens) - (l1 + from_host + restored) * a.page_tokens
            if lead:
                requests.append((sid, len(tokens), l1 * a.page_tokens, (from_host + restored - remote) * a.page_tokens,
                                 remote * a.page_tokens, round(ttft_ms, 3), round((t_req - arrived) * 1e3, 3)))
            if progress:  # on stderr, at most twice a second: requests done, hits so far, time left
                done += 1
                hit_tokens += (l1 + from_host + restored) * a.page_tokens
                all_tokens += len(tokens)
                now = time.perf_counter()
                if now - t_shown > (0.5 if tty else 10) or done == mine_total:
                    t_shown, el = now, now - t_start
                    eta = el / done * (mine_total - done)
                    print(f"{cr}  {a.progress_label}round {turn + 1}/{a.turns}, requests {done}/{mine_total} on "
                          f"instance 0, hits {100 * hit_tokens / max(1, all_tokens):.1f}% of tokens so far, "
                          f"{el:.0f} s, about {eta:.0f} s left  ", end="" if tty else "\n", file=sys.stderr, flush=True)
        r_tot["seconds"] = time.perf_counter() - t_round
        # A turn follows the previous turn of its session: the round ends on every instance, its
        # backups published, before the next begins (a migrated session finds its history).
        t_wait = time.perf_counter()
        while pending_nodes:
            settle()
            time.sleep(0.0005)
        round_barrier.wait()
        r_tot["round_wait_seconds"] = time.perf_counter() - t_wait
        for k in totals:
            totals[k] += r_tot[k]
        per_round.append(r_tot)
    while pending_nodes:  # the last round's write-backs settle
        settle()
        time.sleep(0.001)
    totals["seconds"] = time.perf_counter() - t_start
    if progress and tty:
        print(file=sys.stderr, flush=True)
    def survive(fn, *args):
        """A call at the end of the run, after crash chaos perhaps: the owner may have restarted
        (map its new generation) or be on its way back, the master too (try again)."""
        end = time.time() + 30
        while True:
            try:
                return fn(*args)
            except (fluxon.Closed, fluxon.GenerationMismatch, fluxon.Timeout):
                if time.time() > end:
                    raise
                try:
                    client.wait_local_segments_ready()
                except fluxon.Error:
                    time.sleep(0.2)

    # Every rank flushes its acknowledgements (stats() does) before anyone reads the owner's state.
    survive(client.stats)
    allgather(0)
    stats = survive(client.stats)
    end = time.time() + 10  # evictions in flight end (S4: committed, restored or obsolete)
    while time.time() < end and (stats.get("pending_eviction_reclaim_bytes") or stats.get("reclaims")):
        time.sleep(0.05)
        stats = survive(client.stats)
    if a.remote_cache:  # replica tasks settle in the background: give them a moment to land
        end = time.time() + 5
        while time.time() < end and survive(client.master_stats)["replica_tasks_queued"]:
            time.sleep(0.05)
        time.sleep(0.3)
    mstats = survive(client.master_stats) if inst == 0 and rank == 0 else {}
    host_state = {}
    if split:  # what the host pool holds, and how much of it the store does not (single-copy bytes)
        only = sum(1 for h in host.index if survive(client.exists_prefix, [key(h)]).prefix_len == 0)
        host_state = {"pages": len(host.index), "not_in_store": only, "evicted": host.evicted}
    client.close()
    out_q.put({"instance": inst, "rank": rank, "totals": totals, "rounds": per_round, "host_pool": host_state,
               "requests": requests,
               "latency_us": {k: {"p50": pct(v, 0.5), "p99": pct(v, 0.99), "n": len(v), "sum_s": sum(v) / 1e6}
                              for k, v in lat.items()},
               "counters": backend.counters, "owner_stats": stats, "master_stats": mstats})


def _stale_turnover(v: str):
    """--eviction-stale-turnover: auto, or a number of segments (the owner checks its range)."""
    if v == "auto":
        return v
    try:
        return float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"auto or a number of segments, not {v!r}")


def _double(size: str) -> str:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if size.endswith(u):
            return f"{int(float(size[:-len(u)]) * 2 * m)}"
    return str(int(size) * 2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    a.pythonpath = str(Path(__file__).resolve().parent.parent)
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


def trace_pages(a):
    """The seeded trace as one rank reads it: each request's full pages in order (every rank's
    sequence is this one under its own keys), and the tokens of all requests."""
    pages, tokens_total = [], 0
    pt = a.page_tokens
    for _turn, batch in request_stream(a).rounds():
        for _sid, _inst, tokens, _out, _arrival in batch:
            prev, req = "", []
            for p in range(len(tokens) // pt):
                prev = page_hash(prev, tokens[p * pt:(p + 1) * pt])
                req.append(prev)
            pages.append(req)
            tokens_total += len(tokens)
    return pages, tokens_total


def min_bound_pct(pages, tokens_total: int, page_tokens: int, capacity_pages: int) -> float:
    """Belady's MIN over the trace's page reads with `capacity_pages` per rank (L1 + L2 + L3 as one
    cache): the % of tokens that any cache of that size could find, as the report counts hits. Every
    read is counted, not only a request's leading run (a restore stops at the first miss), so it
    bounds every order's hits. MIN: a read that misses is admitted unless its next read is later than
    that of every page held, else the page read again last goes (bypass keeps it optimal)."""
    import heapq
    if capacity_pages <= 0:
        return 0.0
    seq = [h for req in pages for h in req]
    n = len(seq)
    nxt, last = [0] * n, {}
    for i in range(n - 1, -1, -1):
        nxt[i] = last.get(seq[i], n + i)  # never again: later than the end, and distinct
        last[seq[i]] = i
    held, heap, hits = {}, [], 0  # page -> its next read; heap of (-next read, page), stale ones skipped
    for i, h in enumerate(seq):
        if h in held:
            hits += 1
        elif len(held) >= capacity_pages:
            while -heap[0][0] != held.get(heap[0][1]):
                heapq.heappop(heap)
            if -heap[0][0] < nxt[i]:
                continue  # read again after every page held: not admitted
            del held[heapq.heappop(heap)[1]]
        held[h] = nxt[i]
        heapq.heappush(heap, (-nxt[i], h))
    return 100.0 * hits * page_tokens / max(1, tokens_total)


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


def owner_page(port: int, timeout: float = 10.0) -> str:
    """An owner's /metrics page refreshed after this call began (it counts each refresh last)."""
    import urllib.error
    import urllib.request

    end = time.time() + timeout

    def get():
        # A scrape the owner's HTTP server drops (a reset on a loaded host) is tried again until the
        # deadline; an owner that is gone fails every try and raises the last error.
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return r.read().decode()
            except (ConnectionError, urllib.error.URLError):
                if time.time() >= end:
                    raise
                time.sleep(0.05)

    def refreshes(page):
        for line in page.splitlines():
            if line.startswith("fluxon_owner_metrics_refreshes_total "):
                return float(line.split()[-1])
        return 0.0
    seen = refreshes(get())
    page = ""
    while time.time() < end:
        time.sleep(0.05)
        page = get()
        if refreshes(page) > seen:
            break
    return page


def owner_slots(metrics_ports) -> list:
    """Each owner's slots by state, from its /metrics page. A daemon that died (killed on purpose,
    say) has no page: its entry says so, and the report goes on without its slots."""
    out = []
    for what, port in metrics_ports:
        try:
            out.append({"owner": what, "slots": slot_counts(owner_page(port, timeout=3.0))})
        except OSError as e:  # URLError and ConnectionError are OSErrors
            out.append({"owner": what, "slots": {}, "unreachable": str(e)})
            print(f"workload: {what}'s /metrics is unreachable ({e}): its slots are left out", file=sys.stderr)
    return out


def slot_counts(page: str) -> dict:
    """Slots by state from an owner's page: fluxon_owner_slots{state="..."}."""
    out = {}
    for line in page.splitlines():
        if line.startswith('fluxon_owner_slots{state="'):
            state = line.split('"')[1]
            out[state] = int(float(line.rsplit(" ", 1)[1]))
    return out


def bystander_main(conf, seed, counts, pythonpath):
    """A client beside the ranks that crash chaos kills: it puts batches, reads its own keys back
    (checking every byte) and holds views while it reads, so that it dies holding things. counts:
    puts, keys read, bad bytes, reattaches, other errors."""
    sys.path.insert(0, pythonpath) if pythonpath else None
    import fluxon
    rnd = random.Random(seed)
    size = 16 << 10

    def value(k):
        return hashlib.sha256(k.encode()).digest() * (size // 32)
    c = None
    done = []
    n = 0
    while True:
        try:
            if c is None:
                c = fluxon.KvClient(conf)
            keys = [f"bystander-{seed}-{n}-{j}" for j in range(8)]
            n += 1
            p = c.local_fast_put_start(keys, size)
            for k, ptr in zip(keys, fluxon.plan_pointers(p)):
                ctypes.memmove(ptr, value(k), size)
            c.local_fast_put_commit(p).result(20)
            counts[0] += 1
            done.append(keys)
            back = rnd.choice(done[-32:])
            h, r = c.get_start(back)
            if r.transferable_len == 0:
                c.cancel_get_transfer(h)
                continue
            plan = c.get_transfer(h)
            time.sleep(0.02)  # held while "restoring"
            for k, ptr in zip(back, fluxon.plan_pointers(plan)):
                counts[1] += 1
                if ctypes.string_at(ptr, size) != value(k):
                    counts[2] += 1
            c.release_views(plan)
        except (fluxon.Closed, fluxon.GenerationMismatch):
            counts[3] += 1
            try:
                c.wait_local_segments_ready()
            except fluxon.Error:
                time.sleep(0.1)
        except fluxon.Error:
            counts[4] += 1
            time.sleep(0.05)


class Chaos:
    """--chaos: kill -9s daemons of the private cluster (restarted by `fluxon cluster up` after a
    seeded pause) and the bystander client (a fresh one started) at seeded random points. In the HA
    mode (ha_metrics: the masters' /metrics ports) a master kill is the leader's, timed: from the
    kill to the first remote get through the new leader of keys published through the old one."""

    def __init__(self, seed, kills, cluster, names, client_confs, pythonpath, ctx, ha_metrics=None):
        import threading
        self.rng = random.Random(seed)
        self.seed, self.kills = seed, kills
        self.fb, self.cfg = cluster
        self.run_dir = self.cfg.parent
        self.names, self.confs, self.pythonpath, self.ctx = names, client_confs, pythonpath, ctx
        self.events = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.counts = ctx.Array("q", 5)
        self.bystander = None
        self.bystanders = 0
        self.report = {}
        self.finished = False
        self.ha_metrics = ha_metrics
        self.probe = None  # (writer, reader): clients of instance 0's and instance 1's owners

    def start(self):
        self.t0 = time.time()
        self._spawn_bystander()
        self.thread.start()

    def _spawn_bystander(self):
        conf = self.confs[self.bystanders % len(self.confs)]
        self.bystander = self.ctx.Process(target=bystander_main, daemon=True,
                                          args=(conf, self.seed * 1000 + self.bystanders, self.counts, self.pythonpath))
        self.bystander.start()
        self.bystanders += 1

    def _up(self):
        """Every daemon up again; why not, if one did not come up (the event says so)."""
        r = subprocess.run([self.fb, "cluster", "up", str(self.cfg)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        return None if r.returncode == 0 else (r.stderr.strip() or f"cluster up exited {r.returncode}")

    def _leader(self):
        """The index of the master whose /metrics says it leads (None: none now)."""
        for i, port in enumerate(self.ha_metrics):
            try:
                if _sample(_page(port, timeout=2.0), "fluxon_master_leader") == 1:
                    return i
            except OSError:
                pass
        return None

    def _probe_keys(self, k):
        """Keys put through instance 0's owner and published (through the leader about to die)."""
        import fluxon
        if self.probe is None:
            self.probe = (fluxon.KvClient(self.confs[0]), fluxon.KvClient(self.confs[1]))
        w = self.probe[0]
        keys = [f"failover-{self.seed}-{k}-{i}" for i in range(4)]
        p = w.local_fast_put_start(keys, 4096)
        for key, ptr in zip(keys, fluxon.plan_pointers(p)):
            ctypes.memmove(ptr, hashlib.sha256(key.encode()).digest() * 128, 4096)
        w.local_fast_put_commit(p).result(20)
        return keys

    def _first_remote_get_ms(self, keys, t0):
        """Reads `keys` through instance 1's owner until they come (remote: the new leader routes
        them); ms since t0, the bytes checked. None after 30 s."""
        import fluxon
        r = self.probe[1]
        while time.time() - t0 < 30:
            h, res = r.get_start(keys)
            if res.transferable_len == len(keys):
                plan = r.get_transfer(h)
                t = (time.time() - t0) * 1000
                ok = all(ctypes.string_at(ptr, 4096) == hashlib.sha256(k.encode()).digest() * 128
                         for k, ptr in zip(keys, fluxon.plan_pointers(plan)))
                r.release_views(plan)
                if not ok:
                    self.counts[2] += 1
                return round(t)
            r.cancel_get_transfer(h)
            time.sleep(0.01)
        return None

    def _run(self):
        import signal
        for k in range(self.kills):
            if self.stop.wait(self.rng.uniform(0.5, 1.5)):
                return
            victim = self.rng.choice(self.names)
            at = round(time.time() - self.t0, 2)
            if victim == "client":
                self.bystander.kill()
                self.bystander.join()
                self._spawn_bystander()
                self.events.append({"at_s": at, "victim": "client", "down_s": 0})
                continue
            down = self.rng.uniform(0.5, 2.0)
            timed = victim == "master" and self.ha_metrics is not None and len(self.confs) > 1
            keys = None
            if timed:
                lead = self._leader()
                if lead is None:
                    self.events.append({"at_s": at, "victim": "leader", "error": "no leader to kill"})
                    continue
                victim = f"master-{lead}"
                try:
                    keys = self._probe_keys(k)
                except Exception as e:  # noqa: BLE001 - reported as the event's error
                    self.events.append({"at_s": at, "victim": victim, "error": f"probe put: {e}"})
                    continue
            t0 = time.time()
            try:
                os.kill(int((self.run_dir / f"{victim}.pid").read_text()), signal.SIGKILL)
            except (OSError, ValueError) as e:
                self.events.append({"at_s": at, "victim": victim, "error": str(e)})
                continue
            event = {"at_s": at, "victim": victim, "down_s": round(down, 2)}
            if timed:
                try:
                    event["first_remote_get_ms"] = self._first_remote_get_ms(keys, t0)
                except Exception as e:  # noqa: BLE001
                    event["error"] = f"probe get: {e}"
            time.sleep(max(0.0, down - (time.time() - t0)))
            failed = self._up()
            if failed:
                event["error"] = f"restart: {failed}"
            if timed:  # back as a standby before the next kill
                time.sleep(1.0)
            self.events.append(event)

    def finish(self):
        """Stops killing; the last bystander dies by kill -9 too; every daemon is up again."""
        if self.finished:
            return
        self.finished = True
        self.stop.set()
        self.thread.join()
        if self.bystander is not None:
            self.bystander.kill()
            self.bystander.join()
        if self.probe:
            for c in self.probe:
                c.close()
        self._up()


def _page(port: int, timeout: float = 5.0) -> str:
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode()


def _sample(page: str, name: str) -> float:
    for line in page.splitlines():
        if line.split(" ")[0] == name:
            return float(line.split()[-1])
    return -1.0


def chaos_check(metrics_ports, master_port, chaos) -> dict:
    """After the chaos: every owner back at baseline (nothing held, pending or prepared: the killed
    clients' sessions ended; no publish job, write-back, reclaim or reclaim byte still in flight: each
    completed or was retried to its end under the master that came back) and the master's replicas
    equal to the owners' committed slots (no route of a live owner lost, none left for a slot that is
    gone), the master with no reclaim or fence left. Waits up to 30 s for all of it."""
    end = time.time() + 30
    while True:
        pages = [owner_page(port, timeout=10.0) for _, port in metrics_ports]
        slots = [slot_counts(pg) for pg in pages]
        holders = [int(_sample(pg, "fluxon_owner_holders")) for pg in pages]
        inflight = [s.get("pending", 0) + s.get("pending_local_visible", 0) + s.get("prepared", 0) for s in slots]
        jobs = {name: [int(_sample(pg, f"fluxon_owner_{name}")) for pg in pages]
                for name in ("publish_jobs", "writeback_jobs", "reclaims", "pending_eviction_reclaim_bytes")}
        committed = sum(s.get("committed", 0) for s in slots)
        lead = chaos._leader() if chaos.ha_metrics else 0
        mpage = _page(master_port[lead]) if lead is not None else ""
        replicas = int(_sample(mpage, "fluxon_master_replicas")) if lead is not None else -1
        master_left = {name: int(_sample(mpage, f"fluxon_master_{name}")) for name in ("reclaims", "reclaim_fences")}
        baseline = not any(holders) and not any(inflight) and not any(x for v in jobs.values() for x in v) and \
            not any(master_left.values())
        match = replicas == committed
        if (baseline and match) or time.time() > end:
            break
        time.sleep(0.5)
    c = list(chaos.counts)
    took = sorted(e["first_remote_get_ms"] for e in chaos.events if e.get("first_remote_get_ms") is not None)
    failover = {"kills": sum(1 for e in chaos.events if "first_remote_get_ms" in e), "ms": took}
    if took:
        import statistics
        failover.update(median_ms=statistics.median(took), min_ms=took[0], max_ms=took[-1])
    return {"seed": chaos.seed, "events": chaos.events, "baseline": baseline, "holders": holders,
            "failover": failover, "owner_jobs": jobs, "master_left": master_left,
            "inflight_slots": inflight, "routes_match": match, "master_replicas": replicas,
            "owners_committed_slots": committed,
            "bystander": {"clients": chaos.bystanders, "puts": c[0], "keys_read": c[1], "bad_bytes": c[2],
                          "reattached": c[3], "other_errors": c[4]},
            "bystander_ok": c[2] == 0 and c[0] > 0}


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


def print_report(a, run):
    r0, results, reconciled = run["r0"], run["results"], run["reconciled"]
    t = r0["totals"]
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
    tt = r0["ttft_ms"]
    print(f"  TTFT (modelled): p50 {tt['p50']:.1f} ms  p90 {tt['p90']:.1f} ms  p99 {tt['p99']:.1f} ms over "
          f"{len(r0['requests'])} requests (queued p50 {tt['queued_p50']:.1f} ms); "
          + (f"arrivals at trace time / {a.speedup:g}" if a.speedup else "closed loop")
          + (f", prefill {a.prefill_tok_s:.0f} tokens/s per rank" if a.prefill_tok_s else ", no prefill modelled")
          + "; pages moved at the bytes below, not the model's")
    print(f"  bytes: {a.model_note}")
    for k, v in r0["latency_us"].items():
        note = "  (observed at the next scheduler poll)" if k == "commit_to_future" else ""
        print(f"  {k:<17} p50 {v['p50']:8.1f} us  p99 {v['p99']:8.1f} us  ({v['n']} calls, instance 0 rank 0){note}")
    # Instance 0 rank 0's own time (r0's totals add the instances' prefill up: more than one clock).
    own, lu = results[0]["totals"], r0["latency_us"]
    calls = {k: lu[k]["sum_s"] for k in ("put_start", "get_start", "get_transfer")}
    rest = own["seconds"] - own["prefill_seconds"] - own["round_wait_seconds"] - sum(calls.values())
    print(f"  time of instance 0 rank 0: {own['seconds']:.2f} s = modelled prefill {own['prefill_seconds']:.2f} s + "
          + " + ".join(f"{k} {v:.2f} s" for k, v in calls.items())
          + f" + round ends {own['round_wait_seconds']:.2f} s (its backups published, the other ranks)"
          + f" + the rest {rest:.2f} s (the pool, verifying, polls)")
    bad = run["verify_failures"]
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
    pending = st.get("pending_eviction_reclaim_bytes", 0)
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
    ch = run["report"].get("chaos")
    if ch:
        by = ch["bystander"]
        print(f"  crash chaos (seed {ch['seed']}): " + ", ".join(
            f"{e['victim']} at {e['at_s']} s" + (f" (down {e['down_s']} s)" if e.get("down_s") else "")
            for e in ch["events"]) + f"; ranks lost their owner {sum(r['counters']['owner_lost'] for r in results)}"
              f" times, reattached {sum(r['counters']['reattached'] for r in results)}; bystander clients "
              f"{by['clients']} ({by['puts']} puts, {by['keys_read']} keys read, {by['bad_bytes']} bad); owners at "
              f"baseline: {'yes' if ch['baseline'] else 'NO'}; master replicas {ch['master_replicas']} = owners' "
              f"committed slots {ch['owners_committed_slots']}: {'yes' if ch['routes_match'] else 'NO'}")
        fo = ch["failover"]
        if fo["kills"]:
            print(f"  failover: {fo['kills']} leader kills; first remote get through the new leader after "
                  f"{fo['ms']} ms" + (f" (median {fo['median_ms']:.0f} ms)" if fo["ms"] else ""))

if __name__ == "__main__":
    sys.exit(main())
