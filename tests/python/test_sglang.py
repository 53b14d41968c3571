"""fluxon.sglang against SGLang's interface, driven the way SGLang drives it (sglang_harness.py):
real torch host pools with SGLang's geometry, the dynamic loader, the controller's threads."""

import random
import signal
import time

import pytest

torch = pytest.importorskip("torch")

import fluxon  # noqa: E402
from fluxon.sglang import (FluxonHiCacheStorage, HiCacheStorage, PoolHitPolicy, PoolName,  # noqa: E402
                           PoolTransfer, StorageMetrics)
from sglang_harness import (Controller, MHAHostPool, MLAHostPool, StateHostPool, dynamic_extra,  # noqa: E402
                            fill_page, load_backend, page_bytes, page_indices, storage_config)

from conftest import Cluster, free_port, pause  # noqa: E402


def tag():
    return f"t{random.randrange(1 << 30)}"


def mha(layout="page_first", pages=64, dtype=torch.bfloat16, heads=2):
    return MHAHostPool(layout, pages=pages, page_size=16, layer_num=3, head_num=heads, head_dim=32, dtype=dtype)


def backend(cluster, pool, tp_rank=0, tp_size=1, mla=False, t=None, **more):
    extra = dynamic_extra(cluster.client_config_file(), extra_backend_tag=t, **more)
    return load_backend(storage_config(tp_rank, tp_size, mla=mla, layout=pool.layout, extra=extra), pool)


# -- loading and configuration -----------------------------------------------------------------------
def test_loads_by_dynamic_config_with_sglang_keys(shared_cluster):
    pool = mha()
    b = load_backend(storage_config(extra=dynamic_extra(shared_cluster.client_config_file(),
                                                        prefetch_threshold=256, tp_lcm_size=None)), pool)
    assert isinstance(b, HiCacheStorage) and isinstance(b, FluxonHiCacheStorage)
    assert b.batch_exists(["nothing-here"]) == 0
    b.close()


@pytest.mark.parametrize("extra,named", [
    ({"fluxon_cfg": "/x.yaml"}, "fluxon_cfg"),
    ({"fluxon_config": None}, "fluxon_config"),
    ({"replica_task": {"enabled": True, "admission": {"policy": "kv_score_only"}}}, "SGLang's storage calls carry"),
    ({"replica_task": {"enabled": True, "admission": {"policy": "maybe"}}}, "replica_task.admission.policy"),
    ({"call_timeout_s": 0}, "call_timeout_s"),
    ({"wait_ready_timeout_s": -1}, "wait_ready_timeout_s"),
])
def test_construction_refuses_in_words(shared_cluster, extra, named):
    e = dynamic_extra(shared_cluster.client_config_file())
    e.update(extra)
    if e.get("fluxon_config") is None:
        e.pop("fluxon_config")
    with pytest.raises(fluxon.InvalidArgument, match=named.replace(".", r"\.").replace("'", ".")):
        FluxonHiCacheStorage(storage_config(extra=e), {})


def test_construction_waits_for_the_owners_warm_up(tmp_path):
    """SGLang starts serving only once the owner's expected capacity is faulted in: the backend's
    constructor calls wait_ready (extra_config.wait_ready_timeout_s)."""
    c = Cluster(tmp_path, f"sgw{free_port()}", dram="512MiB",
                owner_extra="owner_local_reserve_expected_capacity: {value_len: 1MiB, payload_capacity_bytes: 400MiB}")
    c.start()
    try:
        b = FluxonHiCacheStorage(storage_config(extra=dynamic_extra(c.client_config_file())), {})
        st = b.client.stats()
        assert st["warmup_bytes"] == 25 * (16 << 20) and st["warmed_bytes"] == st["warmup_bytes"]
        b.close()
    finally:
        c.stop()


def test_embedded_only_on_purpose():
    e = dynamic_extra(None, fluxon_embedded=True)
    e.pop("fluxon_config")
    b = FluxonHiCacheStorage(storage_config(extra=e), {})
    b.register_mem_pool_host(mha())
    assert b.batch_set_v1(["e0"], page_indices(b.mem_pool_host, [1])) == [True]
    b.close()


# -- bytes: every layout, bit-exact, through the controller's threads ---------------------------------------
POOLS = [("mha", "layer_first"), ("mha", "page_first"), ("mha", "page_first_direct"), ("mha", "page_head"),
         ("mla", "layer_first"), ("mla", "page_first"), ("mla", "page_first_direct")]


def make_pool(kind, layout, pages=300):
    if kind == "mla":
        return MLAHostPool(layout, pages=pages, page_size=16, layer_num=3, kv_cache_dim=72)
    return mha(layout, pages=pages)


@pytest.mark.parametrize("kind,layout", POOLS)
def test_backup_then_prefetch_bit_exact_every_layout(shared_cluster, kind, layout):
    t = tag()
    src = make_pool(kind, layout)
    hashes = [f"{t}-{i:04x}" for i in range(140)]  # two batches (128 + 12)
    pages = random.Random(1).sample(range(300), 140)
    want = {h: fill_page(src, p, h) for h, p in zip(hashes, pages)}
    w = backend(shared_cluster, src, mla=kind == "mla", t=t)
    ctl = Controller(w, src)
    assert ctl.backup(hashes, pages) == 140
    w.close()

    dst = make_pool(kind, layout)
    r = backend(shared_cluster, dst, mla=kind == "mla", t=t)
    into = list(range(150, 290))
    assert Controller(r, dst).prefetch(hashes + [f"{t}-missing"], into + [299]) == 140
    for h, p in zip(hashes, into):
        assert page_bytes(dst, p) == want[h]
    m = r.get_stats()
    assert isinstance(m, StorageMetrics) and sum(m.prefetch_pgs) == 140 and min(m.prefetch_bandwidth) > 0
    assert r.get_stats().prefetch_pgs == []  # a window, cleared on read
    assert not ctl.thread_errors
    r.close()


def test_split_heads_share_pages_across_tp_sizes(shared_cluster):
    """TP=2 with tp_lcm_size=4 stores one value per head group; TP=4 ranks read them as their own."""
    t = tag()
    hashes = [f"{t}-{i}" for i in range(5)]
    wrote = {}
    for rank in range(2):
        pool = MHAHostPool("page_head", pages=8, page_size=16, layer_num=3, head_num=2, head_dim=32)
        for i, h in enumerate(hashes):
            fill_page(pool, i, f"{h}/{rank}")
        cfg = storage_config(rank, 2, layout="page_head", tp_lcm_size=4, should_split_heads=True,
                             extra=dynamic_extra(shared_cluster.client_config_file(), extra_backend_tag=t))
        b = load_backend(cfg, pool)
        assert b.batch_set_v1(hashes, page_indices(pool, list(range(5)))) == [True] * 5
        ptrs, sizes = pool.get_split_heads_page_buffer_meta(page_indices(pool, [0]), 2)
        import ctypes
        for j in range(2):  # head group j of page 0: K then V
            wrote[rank * 2 + j] = ctypes.string_at(ptrs[2 * j], sizes[0]) + ctypes.string_at(ptrs[2 * j + 1], sizes[0])
        b.close()
    for rank in range(4):
        pool = MHAHostPool("page_head", pages=8, page_size=16, layer_num=3, head_num=1, head_dim=32)
        cfg = storage_config(rank, 4, layout="page_head", tp_lcm_size=4, should_split_heads=False,
                             extra=dynamic_extra(shared_cluster.client_config_file(), extra_backend_tag=t))
        b = load_backend(cfg, pool)
        assert b.batch_exists(hashes) == 5
        assert b.batch_get_v1(hashes[:1], page_indices(pool, [3])) == [True]
        assert page_bytes(pool, 3) == wrote[rank]
        b.close()


# -- keys pin the bytes -------------------------------------------------------------------------------
@pytest.mark.parametrize("other", [dict(layout="page_first_direct"), dict(dtype=torch.float16),
                                   dict(heads=4), dict(model="other/model")])
def test_deployments_differing_in_layout_dtype_or_model_share_nothing(shared_cluster, other):
    t = tag()
    a = mha()
    fill_page(a, 0, "x")
    wa = backend(shared_cluster, a, t=t)
    assert wa.batch_set_v1([f"{t}h"], page_indices(a, [0])) == [True]
    b = mha(layout=other.get("layout", "page_first"), dtype=other.get("dtype", torch.bfloat16),
            heads=other.get("heads", 2))
    extra = dynamic_extra(shared_cluster.client_config_file(), extra_backend_tag=t)
    wb = load_backend(storage_config(model=other.get("model", "Qwen/Qwen3-8B"), layout=b.layout, extra=extra), b)
    assert wb.batch_exists([f"{t}h"]) == 0
    assert wb.batch_get_v1([f"{t}h"], page_indices(b, [1])) == [False]
    wa.close()
    wb.close()


def test_a_stored_value_of_another_length_is_a_miss(shared_cluster):
    t = tag()
    pool = mha()
    b = backend(shared_cluster, pool, t=t)
    key = b.storage_keys([f"{t}h"])[0]
    c = fluxon.KvClient(shared_cluster.client_config())
    plan = c.local_fast_put_start([key], 4096)  # the right key, the wrong length
    c.local_fast_put_commit(plan).result(5)
    assert b.batch_exists([f"{t}h"]) == 0
    before = page_bytes(pool, 2)
    assert b.batch_get_v1([f"{t}h"], page_indices(pool, [2])) == [False]
    assert page_bytes(pool, 2) == before  # no partial copy
    assert b.fluxon_stats()["counters"]["get_len_mismatch"] == 1
    c.close()
    b.close()


# -- existence is one cheap question -------------------------------------------------------------------
def test_exists_claims_no_slot_and_starts_no_fetch(tmp_path):
    cl = Cluster(tmp_path, f"ex{free_port()}", owners=2).start()
    try:
        t = tag()
        p1, p2 = mha(), mha()
        w = backend(cl, p1, t=t)
        hashes = [f"{t}-{i}" for i in range(20)]
        for i, h in enumerate(hashes):
            fill_page(p1, i, h)
        assert w.batch_set_v1(hashes, page_indices(p1, list(range(20)))) == [True] * 20
        assert w.flush(5)
        extra = dynamic_extra(cl.client_config_file(1), extra_backend_tag=t)
        r = load_backend(storage_config(extra=extra), p2)
        before, mbefore = r.client.stats(), r.client.master_stats()
        assert r.batch_exists(hashes + [f"{t}-none"]) == 20  # from the master's routes
        after, mafter = r.client.stats(), r.client.master_stats()
        for k in ("slots_prepared", "slots_committed", "grants", "holders", "owner_active_get_handles"):
            assert after[k] == before[k], k
        assert mafter["get_started_total"] == mbefore["get_started_total"]  # no remote fetch began
        # The read that follows does fetch them (L3).
        assert r.batch_get_v1(hashes[:4], page_indices(p2, [30, 31, 32, 33])) == [True] * 4
        assert page_bytes(p2, 31) == page_bytes(p1, 1)
        w.close()
        r.close()
    finally:
        cl.stop()


# -- hybrid pools (v2) -----------------------------------------------------------------------------------
def test_v2_hybrid_pools_all_and_trailing_hit_policies(shared_cluster):
    t = tag()
    kv, state, idx = mha(), StateHostPool(64, 96, 40), MLAHostPool("page_first", 64, 16, 3, 8)
    b = backend(shared_cluster, kv, t=t)
    for name, pool in ((PoolName.KV, kv), (PoolName.MAMBA, state), (PoolName.INDEXER, idx)):
        b.register_mem_host_pool_v2(pool, name)
    hashes = [f"{t}-{i}" for i in range(10)]
    for i, h in enumerate(hashes):
        fill_page(kv, i, h)
        fill_page(idx, i, h + "i")
    for i in range(10):
        fill_page(state, i, f"{hashes[i]}s")
    assert b.batch_set_v1(hashes, page_indices(kv, list(range(10)))) == [True] * 10
    res = b.batch_set_v2([PoolTransfer(PoolName.INDEXER, page_indices(idx, list(range(10))), keys=hashes),
                          # the Mamba states of pages 5, 6 and 9 only (ends of radix nodes)
                          PoolTransfer(PoolName.MAMBA, page_indices(state, [5, 6]), keys=hashes[5:7]),
                          PoolTransfer(PoolName.MAMBA, page_indices(state, [9]), keys=[hashes[9]])])
    assert res[PoolName.INDEXER] == [True] * 10 and res[PoolName.MAMBA] == [True]  # the last MAMBA transfer

    def q(transfers):
        return b.batch_exists_v2(hashes, transfers)
    r = q([PoolTransfer(PoolName.INDEXER, keys=hashes, hit_policy=PoolHitPolicy.ALL_PAGES)])
    assert r.kv_hit_pages == 10
    r = q([PoolTransfer(PoolName.MAMBA, keys=["w"], hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert r.kv_hit_pages == 10  # the state at page 9 restores all 10
    assert q([PoolTransfer(PoolName.MAMBA, keys=["w", "w"], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
             ).kv_hit_pages == 7  # a window of 2: 8 is missing, 7 too, states 5,6 exist -> prefix 7
    missing = b.batch_exists_v2(hashes, [PoolTransfer(PoolName.SWA, keys=hashes)])
    assert missing.kv_hit_pages == 0  # an unregistered pool: no hit, and no exception
    dst_state = StateHostPool(64, 96, 40)
    b.register_mem_host_pool_v2(dst_state, PoolName.MAMBA)
    got = b.batch_get_v2([PoolTransfer(PoolName.MAMBA, page_indices(dst_state, [20]), keys=[hashes[9]])])
    assert got[PoolName.MAMBA] == [True]
    assert page_bytes(dst_state, 20) == page_bytes(state, 9)
    b.close()


# -- the legacy tensor calls -----------------------------------------------------------------------------
def test_legacy_tensor_calls_like_the_file_backend(shared_cluster):
    t = tag()
    pool = mha()
    extra = dynamic_extra(shared_cluster.client_config_file(), extra_backend_tag=t)
    extra["interface_v1"] = False
    b = load_backend(storage_config(extra=extra), pool)
    n = b._geom("kv").value_len // 4  # SGLang's flat data page: the page's bytes
    v = torch.arange(n, dtype=torch.float32)
    assert b.set(f"{t}a", v) and b.batch_set([f"{t}b", f"{t}c"], [v * 2, v * 3])
    assert b.exists(f"{t}a") and not b.exists(f"{t}z")
    assert b.batch_exists([f"{t}a", f"{t}b", f"{t}z", f"{t}c"]) == 2
    out = torch.zeros(n, dtype=torch.float32)
    assert b.get(f"{t}b", out) is out and torch.equal(out, v * 2)
    got = b.batch_get([f"{t}c", f"{t}z"], [torch.zeros(n), torch.zeros(n)])
    assert torch.equal(got[0], v * 3) and got[1] is None
    assert b.get(f"{t}a", torch.zeros(10)) is None  # another length: a miss, nothing copied
    b.close()


def test_legacy_and_v1_sets_are_one_put_a_failed_copy_aborts_its_plan(shared_cluster, monkeypatch):
    """One put path: a copy that fails gives the plan back (no slot held, the keys free to write
    again) in the legacy calls as in v1, and a key another process is writing is a success in both."""
    from fluxon import _fluxon
    t = tag()
    pool = mha()
    extra = dynamic_extra(shared_cluster.client_config_file(), extra_backend_tag=t)
    b = load_backend(storage_config(extra=extra), pool)
    n = b._geom("kv").value_len // 4
    v = torch.arange(n, dtype=torch.float32)
    plans_before = b.client.stats()["owner_active_put_plans"]

    def broken(*a, **k):
        raise RuntimeError("copy failed (injected)")

    monkeypatch.setattr(_fluxon, "plan_copy", broken)
    assert b.set(f"{t}x", v) is False  # the failure is reported as a failed set, never raised into SGLang
    assert b.batch_set_v1([f"{t}p"], page_indices(pool, [0])) == [False]
    assert b.client.stats()["owner_active_put_plans"] == plans_before  # both plans given back
    monkeypatch.undo()
    assert b.set(f"{t}x", v) and b.batch_set_v1([f"{t}p"], page_indices(pool, [0])) == [True]  # keys free again
    out = torch.zeros(n, dtype=torch.float32)
    assert b.get(f"{t}x", out) is out and torch.equal(out, v)
    # A key another process is writing: a success for the legacy set too (its own key, inflight).
    raw = fluxon.KvClient(shared_cluster.client_config())
    other = raw.local_fast_put_start([b._flat_key(f"{t}y")], n * 4)
    assert b.batch_set([f"{t}y", f"{t}w"], [v, v * 2])
    assert b.fluxon_stats()["counters"]["set_inflight_elsewhere_values"] >= 1
    raw.put_abort(other)
    raw.close()
    b.close()


# -- clear, shared pages, admission ------------------------------------------------------------------------
def test_clear_removes_this_deployment_only(shared_cluster):
    t1, t2 = "dep" + tag(), "dep" + tag()
    pool = mha()
    a = backend(shared_cluster, pool, key_prefix=t1)
    o = backend(shared_cluster, pool, key_prefix=t2)
    assert a.batch_set_v1(["p0", "p1"], page_indices(pool, [0, 1])) == [True, True]
    assert o.batch_set_v1(["p0"], page_indices(pool, [0])) == [True]
    a.flush(5)
    a.clear()
    assert a.batch_exists(["p0", "p1"]) == 0 and o.batch_exists(["p0"]) == 1
    assert a.fluxon_stats()["counters"]["cleared_values"] == 2
    a.close()
    o.close()


def test_pages_stored_or_being_stored_by_another_rank_are_a_success(shared_cluster):
    """Attention-DP with MLA: every DP rank is TP rank 0 and backs up the same pages."""
    t = tag()
    pools = [MLAHostPool("page_first", 16, 16, 3, 72) for _ in range(2)]
    dp = [load_backend(storage_config(0, 1, mla=True, dp_rank=r, dp_size=2,
                                      extra=dynamic_extra(shared_cluster.client_config_file(), extra_backend_tag=t)),
                       pools[r]) for r in range(2)]
    hashes = [f"{t}-{i}" for i in range(4)]
    key = dp[0].storage_keys(hashes[:1])[0]
    raw = fluxon.KvClient(shared_cluster.client_config())
    plan = raw.local_fast_put_start([key], dp[0]._geom("kv").value_len)  # another process writes page 0
    assert dp[0].batch_set_v1(hashes[:2], page_indices(pools[0], [0, 1])) == [True, True]
    assert dp[1].batch_set_v1(hashes, page_indices(pools[1], [0, 1, 2, 3])) == [True] * 4
    c = dp[1].fluxon_stats()["counters"]
    assert c["set_exists_values"] == 1 and c["set_inflight_elsewhere_values"] == 1
    raw.put_abort(plan)
    raw.close()
    for b in dp:
        b.close()


def test_prefix_admission_is_per_group_and_tp_invariant(shared_cluster):
    t = tag()
    masks = []
    for rank in range(2):
        pool = mha(pages=200)
        extra = dynamic_extra(shared_cluster.client_config_file(), extra_backend_tag=t,
                              replica_task={"enabled": True, "admission": {"policy": "prefix_depth_ratio",
                                                                           "ratio": 0.25}})
        b = load_backend(storage_config(rank, 2, extra=extra), pool)
        from fluxon.sglang import HiCacheStorageExtraInfo
        info = HiCacheStorageExtraInfo(prefix_keys=[f"{t}-p{i}" for i in range(40)])
        masks.append(b._admit(b._geom("kv"), [f"{t}-{i}" for i in range(120)], info))
        # depth 40..159 of 160: the shallowest quarter (< 40) is already stored: nothing admitted
        assert not any(masks[-1])
        masks.append(b._admit(b._geom("kv"), [f"{t}-{i}" for i in range(120)], None))
        assert masks[-1] == [i < 30 for i in range(120)]
        b.close()
    assert masks[0] == masks[2] and masks[1] == masks[3]


# -- backups do not wait for the master; the window is bounded -----------------------------------------
def test_backups_return_while_the_master_is_paused(tmp_path):
    cl = Cluster(tmp_path, f"mp{free_port()}").start()
    try:
        t = tag()
        pool = mha()
        b = backend(cl, pool, t=t, call_timeout_s=0.5, max_pending_backups=2)
        for i in range(8):
            fill_page(pool, i, f"{t}{i}")
        pause(cl.master)
        try:
            # True while the master cannot answer: they returned at local-read-ready (a wait for the
            # route would have failed after call_timeout_s).
            assert b.batch_set_v1([f"{t}-0", f"{t}-1"], page_indices(pool, [0, 1])) == [True, True]
            assert b.batch_set_v1([f"{t}-2"], page_indices(pool, [2])) == [True]
            assert b.batch_exists([f"{t}-0", f"{t}-1", f"{t}-2"]) == 3  # V1: local reads
            assert b.batch_get_v1([f"{t}-1"], page_indices(pool, [9])) == [True]
            # Two batches unsettled = the window: the next waits call_timeout_s, then is refused.
            t0 = time.monotonic()
            assert b.batch_set_v1([f"{t}-3"], page_indices(pool, [3])) == [False]
            assert time.monotonic() - t0 < 10  # bounded: it never waits for the master itself
            assert b.fluxon_stats()["counters"]["backup_backpressure_pages"] == 1
        finally:
            cl.master.send_signal(signal.SIGCONT)
        assert b.flush(15)
        assert b.fluxon_stats()["counters"]["backup_published_pages"] == 3
        b.close()
    finally:
        cl.stop()


def test_full_pool_and_dead_owner_never_raise_and_are_bounded(tmp_path):
    cl = Cluster(tmp_path, f"fp{free_port()}", owner_extra="eviction: false", dram="32MiB").start()
    try:
        t = tag()
        pool = mha(pages=300)
        b = backend(cl, pool, t=t, call_timeout_s=0.5)
        page = b._geom("kv").value_len
        fits = (32 << 20) // page
        hashes = [f"{t}-{i}" for i in range(fits + 40)]
        ctl = Controller(b, pool)
        t0 = time.monotonic()
        done = ctl.backup(hashes, [i % 300 for i in range(len(hashes))])
        assert 0.9 * fits <= done < len(hashes) and time.monotonic() - t0 < 30
        f = b.fluxon_stats()["failures"]
        assert f.get("set:no_slot_in_time", 0) + f.get("set:no_space", 0) >= 1
        cl.stop_owner(0, signal.SIGKILL)
        t0 = time.monotonic()
        assert ctl.backup(hashes[:3], [0, 1, 2]) == 0 and ctl.prefetch(hashes[:3], [0, 1, 2]) == 0
        assert time.monotonic() - t0 < 15  # bounded (the RPC timeouts are 30-60 s)
        assert not ctl.thread_errors
        cl.start_owner(0)  # a new generation: the backend maps it by itself
        assert ctl.backup(hashes[:3], [0, 1, 2]) == 3
        assert ctl.prefetch(hashes[:3], [10, 11, 12]) == 3
        assert b.fluxon_stats()["counters"]["reattached"] >= 1
        b.close()
    finally:
        cl.stop()


def test_a_logical_kv_anchor_holds_nothing_and_the_v2_pools_decide(shared_cluster):
    """Hybrid models whose KV entry has no buffer here (kv_buffer None): KV counts as present."""
    t = tag()
    anchor = mha()
    anchor.kv_buffer = None
    state = StateHostPool(16, 64, 32)
    b = backend(shared_cluster, anchor, t=t)
    b.register_mem_host_pool_v2(state, PoolName.MAMBA)
    hashes = [f"{t}-{i}" for i in range(3)]
    assert b.batch_set_v1(hashes, torch.arange(3 * 16)) == [True] * 3
    assert b.batch_exists(hashes) == 3
    fill_page(state, 2, "s")
    assert b.batch_set_v2([PoolTransfer(PoolName.MAMBA, page_indices(state, [2]), keys=hashes[2:])]) == \
        {PoolName.MAMBA: [True]}
    r = b.batch_exists_v2(hashes, [PoolTransfer(PoolName.MAMBA, keys=["w"], hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert r.kv_hit_pages == 3
    b.close()


def test_the_stand_in_restates_sglangs_signatures():
    from fluxon.sglang import HAVE_SGLANG, HiCacheStorageConfig, PoolTransferResult
    if HAVE_SGLANG:
        pytest.skip("SGLang's own classes are in use")
    with pytest.raises(TypeError):  # the ten leading fields have no defaults, as upstream
        HiCacheStorageConfig(tp_rank=0, tp_size=1)
    r = PoolTransferResult.empty()
    r.update_kv_hit_pages(3)
    r.update_extra_pool_hit_pages({"mamba": 2})
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (3, {"mamba": 2})
    with pytest.raises(TypeError):  # abstract: the legacy calls must be implemented
        HiCacheStorage()


def test_backups_carry_their_prefix_chain_so_capacity_eviction_keeps_a_cold_chains_prefix(tmp_path):
    """batch_set_v1 with SGLang's prefix_keys names each page's parent (radix_parent_keys): when a newer
    chain overflows the owner, the older chain loses pages from its tail, and a restore of it still
    hits its leading pages (an LRU would take its root first: a prefix read of it would hit nothing)."""
    from fluxon.sglang import HiCacheStorageExtraInfo
    # No free watermark: eviction takes what the waiting claims need, whatever the machine's speed (the
    # watermark also evicts ahead by the claim rate of the last round, which a slow machine inflates).
    cl = Cluster(tmp_path, f"chain{free_port()}", dram="16MiB", owner_extra="eviction_free_watermark: 0").start()
    try:
        t = tag()
        pool = mha(pages=64)
        b = backend(cl, pool, t=t)
        slots = (16 << 20) // b._geom("kv").value_len  # K and V of a page: one 12 KiB value, slot

        def write_chain(name, pages):
            keys = [f"{t}-{name}{i}" for i in range(pages)]
            for s in range(0, pages, 64):
                info = HiCacheStorageExtraInfo(prefix_keys=keys[:s]) if s else None
                assert b.batch_set_v1(keys[s:s + 64], page_indices(pool, list(range(len(keys[s:s + 64])))),
                                      info) == [True] * len(keys[s:s + 64])
            return keys
        old = write_chain("a", slots // 2)
        new = write_chain("b", slots // 2 + 256)  # 256 pages more than there is room for
        assert b.flush(30)
        end = time.time() + 20
        while time.time() < end and (b.client.stats()["reclaims"] or b.client.stats()["pending_eviction_reclaim_bytes"]):
            time.sleep(0.05)
        st = b.client.stats()
        assert st["reclaim_committed_keys_total"] >= 256
        hit_old = b.batch_exists(old)
        assert hit_old > 0 and hit_old < len(old)  # its tail went, its prefix stays
        assert hit_old >= len(old) - st["reclaim_committed_keys_total"]  # nothing but the tail
        assert b.batch_exists(new) == len(new)
        b.close()
    finally:
        cl.stop()
