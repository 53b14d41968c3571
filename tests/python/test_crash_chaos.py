"""Crash chaos with real processes: clients put and read back against two owners while a driver
kill -9s an owner or the master at seeded random points and restarts each 1-2 s later."""

import multiprocessing as mp
import os
import random
import signal
import time

import pytest

import fluxon
from conftest import Cluster, free_port, sample, scrape
from fluxon.overload import TEMPORARY, client_main

SEED = int(os.environ.get("FLUXON_SEED", "7"))


def _settled(conf, timeout=30.0) -> dict:
    c = fluxon.KvClient(conf)
    try:
        c.wait_local_segments_ready()
        end = time.time() + timeout
        while True:
            s = c.stats()
            # Eviction's reclaims end too: the master drops a route at the commit, the owner frees
            # the slot a moment later (an owner's committed slots would count it until then).
            if (all(s.get(k, 0) == 0 for k in TEMPORARY) and s["owner_sessions"] <= 1 and s["publish_jobs"] == 0
                    and s.get("reclaims", 0) == 0 and s.get("pending_eviction_reclaim_bytes", 0) == 0) \
                    or time.time() > end:
                return s
            time.sleep(0.1)
    finally:
        c.close()


@pytest.mark.parametrize("seed", [SEED])  # more: FLUXON_SEED=S (seeds 7-12 pass by hand)
def test_crash_chaos_kill_9_owners_and_the_master_under_load_nothing_wrong_nothing_lost(tmp_path, seed):
    """Six client processes (three per owner) put batches and read them back for 16 s; three kill -9s
    at seeded points (an owner or the master), each restarted 1-2 s later. At the end: no read
    returned bytes that were not put; every failure is a documented answer (a dead owner's Closed or
    GenerationMismatch, or NoSpace, LocalReserveTimeout, Timeout, Busy); every client reattached and
    went on; each owner is back at its baseline (no plan, holder, prepared slot, session or publish
    job left); every key an owner still holds is routed by the master (found through the other
    owner), and the master's replicas are the owners' committed slots."""
    rng = random.Random(seed)
    cl = Cluster(tmp_path, f"cc{free_port()}", owners=2, metrics=True, dram="64MiB").start()
    try:
        confs = []
        for i in range(2):
            conf = cl.client_config(i)
            conf["client"]["rpc_timeout_ms"] = 20000
            confs.append(conf)
        seconds = 16.0
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=client_main, args=(f"s{seed}", k, confs[k % 2], seconds, 0.01, 16, 8192, q))
                 for k in range(6)]
        for p in procs:
            p.start()
        t0 = time.time()
        plan = sorted((rng.uniform(3, seconds - 5), rng.choice(["owner 1", "owner 2", "master"])) for _ in range(3))
        done = []
        for at, what in plan:
            time.sleep(max(0.0, t0 + at - time.time()))
            killed = time.time() - t0
            if what == "master":
                cl.master.send_signal(signal.SIGKILL)
                cl.master.wait(timeout=10)
            else:
                cl.stop_owner(int(what[-1]) - 1, signal.SIGKILL)
            time.sleep(rng.uniform(1, 2))
            if what == "master":
                cl.start_master()
            else:
                cl.start_owner(int(what[-1]) - 1)
            done.append((round(killed, 1), what))
        results = [q.get(timeout=seconds + 120) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        total = {}
        for _, counts, _ in results:
            for k, v in counts.items():
                if k != "batches":
                    total[k] = total.get(k, 0) + v
        print(f"seed {seed}: kills {done}; outcomes {total}")
        assert total["bad_bytes"] == 0
        allowed = {"Closed", "GenerationMismatch", "NoSpace", "LocalReserveTimeout", "Timeout", "Busy"}
        assert all(k.split(":", 1)[1] in allowed for k in total if ":" in k), total
        assert all(counts["puts_done"] > 0 for _, counts, _ in results)  # each client went on
        # Baseline: nothing held or in flight on either owner.
        for conf in confs:
            s = _settled(conf)
            left = {k: s[k] for k in TEMPORARY if s.get(k)}
            assert not left and s["publish_jobs"] == 0, left
        # The master's replicas are the owners' committed slots.
        # Both sides read afresh each time: a reclaim ending between two reads moves both.
        end = time.time() + 30
        while True:
            owners_now = sum(_settled(conf)["slots_committed"] for conf in confs)
            master_now = sample(scrape(cl.metrics_port), "fluxon_master_replicas")
            if master_now == owners_now or time.time() > end:
                break
            time.sleep(0.2)
        assert master_now == owners_now
        # No route of a live owner lost: each key of a client's last 256 batches that its owner
        # still holds is found through the other owner too (a remote get: the master routes it).
        cs = [fluxon.KvClient(conf) for conf in confs]
        held = lost = 0
        for idx, counts, _ in results:
            o = idx % 2
            for n in counts["batches"]:
                keys = [f"ov-s{seed}-{idx}-{n}-{j}" for j in range(16)]
                h, r = cs[o].get_start(keys)
                if r.transferable_len == 0:
                    cs[o].cancel_get_transfer(h)
                    continue
                cs[o].release_views(cs[o].get_transfer(h))
                held += r.transferable_len
                h2, r2 = cs[1 - o].get_start(keys[:r.transferable_len])
                if r2.transferable_len:
                    cs[1 - o].release_views(cs[1 - o].get_transfer(h2))
                else:
                    cs[1 - o].cancel_get_transfer(h2)
                lost += r.transferable_len - r2.transferable_len
        for c in cs:
            c.close()
        print(f"seed {seed}: {held} keys held by their owners checked, {lost} without a master route")
        assert held > 0 and lost == 0
    finally:
        cl.stop()
