"""One TP rank as a process: its pools, the collective with its peers, restores and backups through
the hostless SGLang backend, every restored page checked byte for byte."""

from __future__ import annotations

import sys
import time

from .pools import GpuPool, HostPool, expected_page
from .requests import BACKUP_BATCH_PAGES, page_hash, pct, request_stream


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
