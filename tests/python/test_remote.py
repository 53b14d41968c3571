"""Remote gets (L3) between owner daemons: a key put through one owner is read through another, its
bytes fetched over the TCP data plane into the reader's owner segment, then served locally."""

import ctypes
import os
import random
import signal
import threading
import time

import pytest

import fluxon
from conftest import Cluster, free_port, labelled, metric, sample, scrape, wait_metric


def _put(c, keys, size, seed, opts=None):
    rnd = random.Random(seed)
    vals = {k: bytes(rnd.getrandbits(8) for _ in range(64)) * (size // 64) for k in keys}
    p = c.local_fast_put_start(keys, size, opts)
    for k, ptr in zip(keys, fluxon.plan_pointers(p)):
        ctypes.memmove(ptr, vals[k], size)
    c.local_fast_put_commit(p).result(20)
    return vals


def _read(c, keys, size, consume=None):
    h, r = c.get_start(keys)
    if r.transferable_len == 0:
        c.cancel_get_transfer(h)
        return r, []
    rp = c.get_transfer(h, consume_prefix_len=consume)
    out = [ctypes.string_at(p, size) for p in fluxon.plan_pointers(rp)]
    c.release_views(rp)
    return r, out


def _assert_quiet(c, timeout=10.0):
    """Nothing of the read path is left on c's owner: no prepared or pending slot, no holder."""
    end = time.time() + timeout
    while True:
        s = c.stats()
        if s["slots_pending"] == 0 and s["slots_prepared"] == 0 and s["holders"] == 0:
            return
        assert time.time() < end, s
        time.sleep(0.1)


@pytest.fixture
def two_owners(tmp_path):
    c = Cluster(tmp_path, f"rem{os.getpid()}x{free_port()}", owners=2, metrics=True,
                owner_extra="local_reserve_hard_timeout_ms: 5000\ndata_timeout_ms: 2000").start()
    yield c
    c.stop()


def test_a_key_put_on_one_owner_is_read_through_another(two_owners):
    a = fluxon.KvClient(two_owners.client_config(0))
    b = fluxon.KvClient(two_owners.client_config(1))
    keys = [f"rk{i}" for i in range(32)]
    size = 64 << 10
    vals = _put(a, keys, size, 1)
    r, got = _read(b, keys, size)
    assert r.transferable_len == 32 and r.leader_keys == 32 and r.remote_keys == 32 and r.local_keys == 0
    assert got == [vals[k] for k in keys]
    # The fetched copies are local replicas now: the next read is a local hit (InlineLocal).
    r2, got2 = _read(b, keys, size)
    assert r2.local_keys == 32 and r2.remote_keys == 0
    assert got2 == got
    sb = b.stats()
    assert sb["slots_pending"] == 0 and sb["slots_prepared"] == 0 and sb["routes"] == 32
    # Prometheus: the reader fetched the bytes, the writer served them, the master counts 2 replicas.
    assert metric(two_owners.owner_metrics[1], "fluxon_owner_transfer_bytes_total") == 32 * size
    assert metric(two_owners.owner_metrics[0], "fluxon_owner_data_served_bytes_total") == 32 * size
    # The master hears of the fetches from the reader's GetDone, after the reader had its bytes.
    assert wait_metric(two_owners.metrics_port, "fluxon_master_replicas", 64) == 64
    assert wait_metric(two_owners.metrics_port, "fluxon_master_inflight_gets", 0) == 0
    a.close()
    b.close()


def test_overlapping_remote_reads_from_many_threads_share_fetches(two_owners):
    a = fluxon.KvClient(two_owners.client_config(0))
    b = fluxon.KvClient(two_owners.client_config(1))
    keys = [f"ov{i}" for i in range(48)]
    size = 16 << 10
    vals = _put(a, keys, size, 2)
    errors = []
    fetched_by = []

    def reader(t):
        try:
            lo = (t * 7) % 32
            ks = keys[lo:lo + 16]
            r, got = _read(b, ks, size)
            assert r.transferable_len == 16, r
            assert got == [vals[k] for k in ks]
            fetched_by.append((r.leader_keys, r.joined_keys, r.local_keys))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=reader, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    # Every key was fetched at most once, whatever the overlap (per-key singleflight).
    leaders = sum(x[0] for x in fetched_by)
    assert leaders <= 48
    assert metric(two_owners.owner_metrics[1], "fluxon_owner_transfer_keys_total") == leaders
    _assert_quiet(b)
    a.close()
    b.close()


def test_g9_get_starts_arriving_together_share_batch_get_starts(two_owners):
    """8 clients read remote keys at once through one owner: their leaders reach the master in fewer
    BatchGetStarts than there were get_starts (the owner flushes behind its mailbox), bytes intact."""
    a = fluxon.KvClient(two_owners.client_config(0))
    size = 16 << 10
    keys = [f"g9-{i}" for i in range(1024)]
    vals = {}
    for i in range(0, 1024, 256):
        vals.update(_put(a, keys[i:i + 256], size, i))
    readers = [fluxon.KvClient(two_owners.client_config(1)) for _ in range(8)]
    errors = []

    def run(t):
        try:
            for j in range(16):
                ks = keys[t * 128 + j * 8:t * 128 + j * 8 + 8]
                r, got = _read(readers[t], ks, size)
                assert r.transferable_len == 8 and got == [vals[k] for k in ks]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    page = scrape(two_owners.owner_metrics[1])
    requests = sample(page, "fluxon_owner_get_leader_requests_total")
    batches = sample(page, "fluxon_owner_get_master_batches_total")
    assert requests == 128
    assert 0 < batches < requests, (batches, requests)
    for r in readers:
        r.close()
    a.close()


def test_a_dead_source_fails_the_transfer_and_leaks_nothing(two_owners):
    a = fluxon.KvClient(two_owners.client_config(0))
    b = fluxon.KvClient(two_owners.client_config(1))
    keys = [f"dead{i}" for i in range(4)]
    _put(a, keys, 8192, 3)
    a.close()
    two_owners.stop_owner(0, signal.SIGKILL)  # the master still routes to it
    h, r = b.get_start(keys)
    assert r.transferable_len == 4 and r.leader_keys == 4
    with pytest.raises(fluxon.KeyNotFound, match="fetch from node 1 failed"):
        b.get_transfer(h)
    _assert_quiet(b)
    assert wait_metric(two_owners.metrics_port, "fluxon_master_inflight_gets", 0) == 0  # revoked
    b.close()


def test_master_stats_reach_an_external_client_through_its_owner(two_owners):
    a = fluxon.KvClient(two_owners.client_config(0))
    _put(a, ["ms0", "ms1"], 4096, 4)
    m = a.master_stats()
    assert m["routes"] == 2 and m["owners"] == 2 and m["replicas"] == 2 and m["inflight_gets"] == 0
    a.close()


def test_t1_remote_gets_between_daemons_under_injected_faults(tmp_path):
    """The reading owner loses 30% of its master requests, duplicates 30%, delays them up to 20 ms,
    and 30% of its fetches fail after their bytes arrived: every read returns the right bytes or
    fails as a whole (KeyNotFound / Timeout), retried reads get there, and nothing is left behind."""
    extra = "publish_retry_ms: 100\nlocal_reserve_hard_timeout_ms: 4000"
    c = Cluster(tmp_path, f"rft{os.getpid()}x{free_port()}", owners=2, owner_extra=extra).start()
    try:
        c.settings["owners"][1]["fault_injection"] = {"seed": 11, "drop": 0.3, "duplicate": 0.3, "max_delay_ms": 20,
                                                      "fetch_fail": 0.3}
        c.save()
        c.stop_owner(1)
        c.start_owner(1)
        a = fluxon.KvClient(c.client_config(0))
        b = fluxon.KvClient(c.client_config(1))
        keys = [f"ft{i}" for i in range(48)]
        size = 16 << 10
        vals = _put(a, keys, size, 5)
        ok = failed = 0
        for attempt in range(40):
            lo = (attempt * 5) % 40
            ks = keys[lo:lo + 8]
            try:
                r, got = _read(b, ks, size)
            except (fluxon.KeyNotFound, fluxon.Timeout):
                failed += 1
                continue
            assert got == [vals[k] for k in ks[:r.transferable_len]]
            ok += 1
        assert ok > 0 and failed > 0, (ok, failed)
        # Converged: every key reads back locally on B in the end (each read may lose a fetch or
        # wait for a retried master request: retried until a deadline, not a count).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                r, got = _read(b, keys, size)
                if r.local_keys == len(keys):
                    break
            except (fluxon.KeyNotFound, fluxon.Timeout):
                pass
        assert got == [vals[k] for k in keys]
        _assert_quiet(b)
        a.close()
        b.close()
    finally:
        c.stop()


def test_owner_hot_write_back_demotes_cold_keys_to_the_remote_cache_owner(tmp_path):
    """A GPU owner whose hot tier holds 5% of its segment: what the tier evicts is copied to the
    remote_cache owner and then dropped here (single-copy demotion); every key still reads back,
    the demoted ones through the remote_cache owner (L3)."""
    c = Cluster(tmp_path, f"wb{os.getpid()}x{free_port()}", owners=2, metrics=True,
                owner_extra=["replica_writeback_hot_capacity_ratio: 0.05", "role: remote_cache"]).start()
    try:
        a = fluxon.KvClient(c.client_config(0))
        size = 1 << 20
        vals = {}
        for batch in range(8):
            vals.update(_put(a, [f"wb{batch}-{i}" for i in range(8)], size, batch))
        end = time.time() + 30
        while True:
            page = scrape(c.owner_metrics[0])
            demoted = sample(page, "fluxon_owner_demoted_keys_total") or 0
            pending = sample(page, "fluxon_owner_writeback_jobs")
            if demoted > 0 and pending == 0:
                break
            assert time.time() < end, (demoted, pending)
        hot = sample(page, "fluxon_owner_hot_bytes")
        assert hot <= 0.05 * (256 << 20)
        assert metric(c.metrics_port, "fluxon_master_demoted_keys_total") == demoted
        assert metric(c.owner_metrics[1], "fluxon_owner_replica_done_total") >= demoted
        assert a.stats()["routes"] == 64 - demoted
        keys = sorted(vals)
        r, got = _read(a, keys, size)
        assert r.transferable_len == 64
        assert r.remote_keys == demoted and r.local_keys == 64 - demoted
        assert got == [vals[k] for k in keys]
        _assert_quiet(a)
        a.close()
    finally:
        c.stop()


def test_master_tiers_write_back_ahead_and_demote_what_t2_lets_go(tmp_path):
    """The master's T1/T2 route tiers between real daemons: T2 (half of the GPU owner's 64 MiB)
    hands its coldest routes to the owner, whose fenced reclaim demotes them once T1's write-back
    put their copies on the remote_cache owner; every key still reads back, bytes intact, and the
    counters reconcile on the Prometheus pages."""
    c = Cluster(tmp_path, f"tiers{os.getpid()}x{free_port()}", owners=2, metrics=True, dram="64MiB",
                master_extra="replica_cache_capacity_ratio: 0.5, replica_writeback_tier1_capacity_ratio: 0.3",
                owner_extra=["", "role: remote_cache"]).start()
    try:
        a = fluxon.KvClient(c.client_config(0))
        size = 1 << 20
        vals = {}
        for batch in range(6):
            vals.update(_put(a, [f"tier{batch}-{i}" for i in range(8)], size, batch))
        # 48 MiB put, T2 holds 32: at least 16 routes leave the GPU owner, each demoted.
        end = time.time() + 60
        while True:
            page = scrape(c.metrics_port)
            opage = scrape(c.owner_metrics[0])
            t2 = labelled(page, "fluxon_master_node_tier_bytes", node="1", tier="t2")
            victims = sample(page, "fluxon_master_tier2_victims")
            demoted = sample(opage, "fluxon_owner_demoted_keys_total") or 0
            if t2 <= 32 << 20 and victims == 0 and demoted >= 16 and sample(opage, "fluxon_owner_reclaims") == 0:
                break
            assert time.time() < end, (t2, victims, demoted)
        assert labelled(page, "fluxon_master_node_tier_bytes", node="1", tier="t1") <= 0.3 * (64 << 20)
        assert labelled(page, "fluxon_master_node_tier_bytes", node="1", tier="t2_capacity") == 32 << 20  # S5
        assert labelled(page, "fluxon_master_node_tier_bytes", node="2", tier="t1_capacity") == 0
        assert sample(page, "fluxon_master_writeback_tier1_triggered_total") >= 16
        triggered = sample(page, "fluxon_master_writeback_tier1_triggered_total")
        outcomes = sum(labelled(page, "fluxon_master_writeback_tier1_outcomes_total", outcome=o)
                       for o in ("stale", "backed", "no_target", "queued"))
        assert triggered == outcomes
        assert sample(page, "fluxon_master_tier2_selected_total") == \
            sample(page, "fluxon_master_tier2_ended_total") + sample(page, "fluxon_master_tier2_restored_total")
        assert sample(page, "fluxon_master_tier2_shortfall_total") == 0
        assert labelled(opage, "fluxon_owner_tier_victims_outcomes_total", outcome="demoted") > 0
        assert sample(opage, "fluxon_owner_pending_eviction_reclaim_bytes") == 0
        assert a.stats()["routes"] == 48 - demoted
        keys = sorted(vals)
        r, got = _read(a, keys, size)
        assert r.transferable_len == 48 and r.remote_keys == demoted
        assert got == [vals[k] for k in keys]
        _assert_quiet(a)
        a.close()
    finally:
        c.stop()


def test_spill_puts_under_pressure_land_on_the_cpu_owner_and_nothing_is_lost(tmp_path):
    """spill_free_ratio between real daemons: 160 MiB put into a 128 MiB GPU owner; once fewer than
    half its slots are free or still to carve, each put that goes live is written back
    to the remote_cache owner and demoted here, so every key still reads back, bytes intact."""
    c = Cluster(tmp_path, f"spill{os.getpid()}x{free_port()}", owners=2, metrics=True, dram="128MiB",
                owner_extra=["spill_free_ratio: 0.5\neviction_free_watermark: 0\npublish_retry_ms: 50",
                             "role: remote_cache"]).start()
    try:
        a = fluxon.KvClient(c.client_config(0))
        size = 1 << 20
        vals = {}
        for batch in range(20):  # puts arriving over time, as a server's do: a spill is asynchronous
            vals.update(_put(a, [f"spill{batch}-{i}" for i in range(8)], size, batch))
            time.sleep(0.3)
        end = time.time() + 60
        while True:
            page = scrape(c.owner_metrics[0])
            if sample(page, "fluxon_owner_writeback_jobs") == 0 and sample(page, "fluxon_owner_reclaims") == 0 \
                    and (sample(page, "fluxon_owner_spill_keys_total") or 0) > 0:
                break
            assert time.time() < end
        spilled = sample(page, "fluxon_owner_spill_keys_total")
        demoted = sample(page, "fluxon_owner_demoted_keys_total")
        assert spilled >= 32 and demoted == spilled
        assert sample(page, "fluxon_owner_pending_eviction_reclaim_bytes") == 0
        remote = 0
        for batch in range(20):  # a batch at a time: all 160 MiB would not fit this owner at once
            keys = [f"spill{batch}-{i}" for i in range(8)]
            r, got = _read(a, keys, size)
            assert r.transferable_len == 8, (batch, r)
            assert got == [vals[k] for k in keys]
            remote += r.remote_keys
        assert remote >= 32
        _assert_quiet(a)
        a.close()
    finally:
        c.stop()


def test_write_through_future_completes_once_the_cpu_owner_holds_the_copy(tmp_path):
    """write_through=True is a synchronous remote placement: the future completes when a
    remote_cache owner (replica_task_placement) holds every key — the master lists both copies by
    then — and the key reads back from there once the GPU owner's copy is gone."""
    c = Cluster(tmp_path, f"wt{os.getpid()}x{free_port()}", owners=2, metrics=True,
                owner_extra=["", "role: remote_cache"]).start()
    try:
        a = fluxon.KvClient(c.client_config(0))
        size = 64 << 10
        keys = [f"wt-{i}" for i in range(16)]
        vals = _put(a, keys, size, 5, fluxon.PutOptionalArgs(write_through=True))
        page = scrape(c.metrics_port)  # refreshed after the future completed
        assert sample(page, "fluxon_master_routes") == 16
        assert sample(page, "fluxon_master_replicas") == 32  # the GPU owner's and the CPU owner's
        assert metric(c.owner_metrics[0], "fluxon_owner_write_through_backed_total") == 1
        # The remote copy serves the keys once the GPU owner's go (remove_prefix removes this owner's).
        assert a.remove_prefix("wt-") == 16
        b = fluxon.KvClient(c.client_config(0))
        r, got = _read(b, keys, size)
        assert r.transferable_len == 16 and r.remote_keys == 16
        assert got == [vals[k] for k in keys]
        _assert_quiet(b)
        a.close()
        b.close()
    finally:
        c.stop()


def test_write_through_without_a_cpu_owner_fails_the_future_naming_the_placement(tmp_path):
    c = Cluster(tmp_path, f"wtn{os.getpid()}x{free_port()}", owners=2).start()
    try:
        a = fluxon.KvClient(c.client_config(0))
        with pytest.raises(fluxon.NoSpace) as e:
            _put(a, ["wtn-0"], 4096, 1, fluxon.PutOptionalArgs(write_through=True))
        assert "no owner of a target role" in str(e.value) and "remote_only_node_roles" in str(e.value)
        # Published here and readable: only the remote copy is missing.
        r, _ = _read(a, ["wtn-0"], 4096)
        assert r.transferable_len == 1 and r.local_keys == 1
        a.close()
    finally:
        c.stop()


def test_kv_score_pressure_budget_replicates_only_under_eviction_pressure_and_alike_for_both_tp_ranks(tmp_path):
    """kv_score_pressure_budget between real daemons, through the hostless backend of two TP ranks
    behind one owner: while the owner has room no backup gets a replica (it would be a duplicate);
    once every page it admits evicts another, each candidate node (mean score >= the threshold) is
    replicated whole on the remote_cache owner, for both ranks alike (the first rank's put decides
    for the second), and no other node is."""
    from fluxon.sglang.admission import AdmissionConfig
    from fluxon.sglang.hostless import HostlessBackend, NodeStorage
    c = Cluster(tmp_path, f"bud{os.getpid()}x{free_port()}", owners=2, metrics=True, dram="16MiB",
                owner_extra=["", "role: remote_cache"]).start()
    try:
        size = 64 << 10  # 16 MiB of 64 KiB slots: 256
        # 8 pages at full pressure: a 2-page node fits from a pressure of 0.25 (it moves as evictions lag)
        cfg = AdmissionConfig("kv_score_pressure_budget", score_threshold=0.5, max_replica_pages_per_batch=8)
        clients = [fluxon.KvClient(c.client_config(0)) for _ in range(2)]
        ranks = [HostlessBackend(cl, tp_rank=r, tp_size=2, admission=cfg) for r, cl in enumerate(clients)]

        def backup(tag, node, score):
            for r, b in enumerate(ranks):
                n = NodeStorage([f"{tag}{node}p{i}_{r}_2" for i in range(2)], depth=2 * node)
                assert b.backup_node(n, size, lambda plan: None, [score, score])
                n.future.result(20)

        for node in range(4):  # room: nothing replicated
            backup("rest", node, 0.9)
        page = scrape(c.owner_metrics[0])
        assert labelled(page, "fluxon_owner_replica_budget_keys_total", decision="cut") == 16
        assert sample(page, "fluxon_owner_replica_budget_shared_keys_total") == 8
        assert sample(page, "fluxon_owner_replica_keys_requested_total") == 0
        for b in range(80):  # 640 pages into 256 slots: every admission evicts
            _put(clients[0], [f"fill{b}-{i}" for i in range(8)], size, b)
        scores = [0.9, 0.2, 0.7, 0.4, 0.6, 0.1]
        for node, s in enumerate(scores):
            backup("hot", node, s)
        page = scrape(c.owner_metrics[0])
        assert sample(page, "fluxon_owner_replica_budget_pressure_ratio") >= 0.25
        wanted = [node for node, s in enumerate(scores) if s >= 0.5]
        assert labelled(page, "fluxon_owner_replica_budget_keys_total", decision="kept") == 2 * 2 * len(wanted)
        assert sample(page, "fluxon_owner_replica_keys_requested_total") == 2 * 2 * len(wanted)
        assert wait_metric(c.owner_metrics[1], "fluxon_owner_replica_done_total", 4 * len(wanted)) == 4 * len(wanted)
        cpu = fluxon.KvClient(c.client_config(1))
        for node in range(len(scores)):
            for r in range(2):
                keys = [f"hot{node}p{i}_{r}_2" for i in range(2)]
                assert cpu.exists_prefix(keys).local_len == (2 if node in wanted else 0), (node, r)
        for cl in clients + [cpu]:
            cl.close()
    finally:
        c.stop()
