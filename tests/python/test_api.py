"""The whole API of SPEC.md §2, in embedded and external mode (the `client` fixture)."""

import ctypes
import itertools
import time

import pytest

import fluxon

_counter = itertools.count()


def keys(n, prefix="k"):
    base = f"{prefix}{next(_counter)}-"
    return [f"{base}{i}" for i in range(n)]


def write(plan, value_len, seed):
    for i, a in enumerate(fluxon.plan_pointers(plan)):
        ctypes.memset(a, (seed + i) % 251, value_len)


def read(plan, value_len):
    return [ctypes.string_at(a, value_len) for a in fluxon.plan_pointers(plan)]


def put(c, ks, value_len=4096, seed=7, opts=None):
    p = c.local_fast_put_start(ks, value_len, opts)
    write(p, value_len, seed)
    f = c.local_fast_put_commit(p)
    f.result(10)
    return f


TEMP = ["slots_prepared", "slots_pending_local_visible", "slots_pending", "active_put_plans",
        "active_read_plans", "active_get_handles", "holders", "owner_active_put_plans", "owner_active_get_handles"]


def settle(c):
    """Temporary counters once every plan is released and every handle consumed."""
    for _ in range(200):
        s = c.stats()
        if all(s[k] == 0 for k in TEMP) and s["publish_jobs"] == 0:
            return s
        time.sleep(0.01)
    return c.stats()


def test_segments(client):
    segs = client.wait_local_segments_ready()
    assert len(segs) == 1
    s = segs[0]
    assert set(s) >= {"segment_label", "write_ptr", "read_ptr", "len", "generation", "node_id"}
    assert s["segment_label"] in ("cpu:0", "external_owner:0")
    assert s["len"] == 256 << 20 and s["write_ptr"] != 0 and s["generation"] != 0


def test_put_get_bytes_round_trip(client):
    ks = keys(16)
    p = client.local_fast_put_start(ks, 20000)
    ptrs = fluxon.plan_pointers(p)
    assert len(ptrs) == 16 and len(set(ptrs)) == 16
    seg = client.wait_local_segments_ready()[0]
    for a in ptrs:
        assert seg["write_ptr"] <= a and a + 20000 <= seg["write_ptr"] + seg["len"]
    write(p, 20000, 3)
    fut = client.local_fast_put_commit(p)
    assert fut.wait(10) and fut.done()
    assert fut.result() is None
    h, r = client.get_start(ks)
    assert r.all_hit and r.transferable_len == 16 and r.first_miss_index is None
    rp = client.get_transfer(h)
    got = read(rp, 20000)
    assert got == [bytes([(3 + i) % 251]) * 20000 for i in range(16)]
    client.release_views(rp)
    s = settle(client)
    assert s["slots_committed"] >= 16 and s["routes"] >= 16


def test_get_start_result_fields_and_groups(client):
    ks = keys(6)
    put(client, ks[:5])
    h, r = client.get_start(ks, atomic_group_lens=[2, 2, 2])
    assert (r.raw_prefix_hit_len, r.transferable_len, r.prefix_hit_groups) == (5, 4, 2)
    assert (r.first_miss_index, r.first_miss_group_index, r.all_hit) == (5, 2, False)
    # consume a shorter prefix on a group boundary; the tail goes back at once
    rp = client.get_transfer(h, consume_prefix_len=2)
    assert len(fluxon.plan_pointers(rp)) == 2
    client.release_views(rp)
    h2, r2 = client.get_start(ks, prefix_best_effort=False)
    assert r2.transferable_len == 0 and r2.raw_prefix_hit_len == 5
    with pytest.raises(fluxon.KeyNotFound):
        client.get_transfer(h2)
    settle(client)


def test_bad_consume_prefix_leaves_handle_usable(client):
    ks = keys(4)
    put(client, ks)
    h, r = client.get_start(ks, atomic_group_lens=[2, 2])
    for bad in (0, -1, 3, 5):
        with pytest.raises(fluxon.InvalidArgument):
            client.get_transfer(h, consume_prefix_len=bad)
    rp = client.get_transfer(h, consume_prefix_len=4)
    client.release_views(rp)
    with pytest.raises(fluxon.InvalidArgument):  # consumed
        client.get_transfer(h)
    with pytest.raises(fluxon.InvalidArgument):
        client.cancel_get_transfer(h)
    settle(client)


def test_cancel_releases_everything(client):
    ks = keys(8)
    put(client, ks)
    h, _ = client.get_start(ks)
    assert client.stats()["active_get_handles"] == 1
    client.cancel_get_transfer(h)
    s = settle(client)
    assert s["holders"] == 0 and s["owner_active_get_handles"] == 0


def test_put_abort_and_plan_kinds(client):
    ks = keys(3)
    p = client.local_fast_put_start(ks, 4096)
    assert client.stats()["slots_prepared"] == 3
    client.put_abort(p)
    assert client.stats()["slots_prepared"] == 0
    with pytest.raises(fluxon.InvalidArgument):
        client.put_abort(p)  # unknown now
    put(client, ks)  # the keys are free again
    h, _ = client.get_start(ks)
    rp = client.get_transfer(h)
    with pytest.raises(fluxon.InvalidArgument):
        client.put_abort(rp)  # a read plan given to put_abort
    with pytest.raises(fluxon.InvalidArgument):
        client.local_fast_put_commit(rp)
    client.release_views(rp)
    p2 = client.local_fast_put_start(keys(1), 4096)
    with pytest.raises(fluxon.InvalidArgument):
        client.release_views(p2)  # a put plan given to release_views
    client.local_fast_put_commit(p2).result(10)
    with pytest.raises(fluxon.InvalidArgument):
        client.local_fast_put_commit(p2)  # commit twice
    with pytest.raises(fluxon.InvalidArgument):
        client.release_views(12345678)  # unknown plan
    settle(client)


def test_key_conflict_indices_and_reasons(client):
    done, inflight = keys(1), keys(1)
    put(client, done)
    p = client.local_fast_put_start(inflight, 4096)
    before = client.stats()
    with pytest.raises(fluxon.KeyConflict) as e:
        client.local_fast_put_start(keys(1) + done + inflight, 4096)
    assert e.value.indices == [1, 2]
    assert e.value.reasons == ["exists", "inflight"]
    assert isinstance(e.value, fluxon.Error)
    after = client.stats()
    assert after["slots_prepared"] == before["slots_prepared"]
    client.put_abort(p)
    settle(client)


@pytest.mark.parametrize("bad", [
    dict(keys=[]),
    dict(keys=["a", ""]),
    dict(keys=["a", "b", "a"]),
    dict(value_len=0),
    dict(value_len=-4096),
    dict(value_len=(16 << 20) + 1),
    dict(opts=fluxon.PutOptionalArgs(atomic_group_lens=[1, 1])),
    dict(opts=fluxon.PutOptionalArgs(atomic_group_lens=[3, 0])),
    dict(opts=fluxon.PutOptionalArgs(atomic_group_lens=[1, 2], make_replica_task_mask=[True, True, False])),
    dict(opts=fluxon.PutOptionalArgs(make_replica_task_mask=[True, False])),
    dict(keys="abc"),
    dict(value_len=4096.0),
    # kv_score_pressure_budget: a priority and an id per group, pages > 0, with make_replica_task
    dict(opts=fluxon.PutOptionalArgs(make_replica_task=True, replica_budget_pages=4,
                                     replica_group_priorities=[1.0, 1.0], replica_group_ids=[1, 2, 3])),
    dict(opts=fluxon.PutOptionalArgs(make_replica_task=True, replica_budget_pages=4,
                                     replica_group_priorities=[1.0, 1.0, 1.0], replica_group_ids=[1, 2])),
    dict(opts=fluxon.PutOptionalArgs(make_replica_task=True, replica_budget_pages=0,
                                     replica_group_priorities=[1.0] * 3, replica_group_ids=[1, 2, 3])),
    dict(opts=fluxon.PutOptionalArgs(make_replica_task=False, replica_budget_pages=4,
                                     replica_group_priorities=[1.0] * 3, replica_group_ids=[1, 2, 3])),
    dict(opts=fluxon.PutOptionalArgs(make_replica_task=True, replica_budget_pages=4, replica_decision_shares=0,
                                     replica_group_priorities=[1.0] * 3, replica_group_ids=[1, 2, 3])),
    dict(opts=fluxon.PutOptionalArgs(make_replica_task=True, replica_budget_pages=4,
                                     replica_group_priorities=[float("nan")] * 3, replica_group_ids=[1, 2, 3])),
    dict(opts=fluxon.PutOptionalArgs(make_replica_task=True, replica_budget_pages=4,
                                     replica_group_priorities=[1.0] * 3, replica_group_ids=[1, 2, -3])),
])
def test_argument_rules_raise_before_side_effects(client, bad):
    args = dict(keys=keys(3), value_len=4096, opts=None)
    args.update(bad)
    before = client.stats()
    with pytest.raises(fluxon.InvalidArgument):
        client.local_fast_put_start(args["keys"], args["value_len"], args["opts"])
    after = client.stats()
    for k in ("slots_prepared", "active_put_plans", "owner_active_put_plans", "slots_free"):
        assert after[k] == before[k], k


def test_get_argument_rules(client):
    with pytest.raises(fluxon.InvalidArgument):
        client.get_start([])
    with pytest.raises(fluxon.InvalidArgument):
        client.get_start(["a", "a"])
    with pytest.raises(fluxon.InvalidArgument):
        client.get_start(["a", "b"], atomic_group_lens=[1])
    assert client.stats()["active_get_handles"] == 0


def test_put_optional_args_fields_accepted(client):
    ks = keys(4)
    opts = fluxon.PutOptionalArgs(reject_if_inflight_same_key=True, reject_if_exist_same_key=True,
                                  write_through=False, make_replica_task=True,
                                  make_replica_task_mask=[True, True, False, False], atomic_group_lens=[2, 2],
                                  lease_id=9)
    put(client, ks, opts=opts)
    h, r = client.get_start(ks, atomic_group_lens=[2, 2])
    assert r.all_hit
    client.cancel_get_transfer(h)
    settle(client)


def test_overwrite_without_reject_if_exist(client):
    ks = keys(2)
    put(client, ks, seed=1)
    put(client, ks, seed=50, opts=fluxon.PutOptionalArgs(reject_if_exist_same_key=False))
    h, _ = client.get_start(ks)
    rp = client.get_transfer(h)
    assert read(rp, 8) == [bytes([50]) * 8, bytes([51]) * 8]
    client.release_views(rp)
    s = settle(client)
    assert s["routes"] >= 2


def test_counters_return_to_baseline(client):
    base = settle(client)
    for rnd in range(5):
        ks = keys(10)
        p = client.local_fast_put_start(ks, 8192)
        f = client.local_fast_put_commit(p)
        h, r = client.get_start(ks + keys(2))
        rp = client.get_transfer(h, consume_prefix_len=5)
        client.release_views(rp)
        h2, _ = client.get_start(ks)
        client.cancel_get_transfer(h2)
        p2 = client.local_fast_put_start(keys(4), 8192)
        client.put_abort(p2)
        f.result(10)
    s = settle(client)
    for k in TEMP:
        assert s[k] == base[k] == 0, k
    assert s["slots_committed"] == base["slots_committed"] + 50


def test_future_api(client):
    p = client.local_fast_put_start(keys(1), 4096)
    f = client.local_fast_put_commit(p)
    assert f.wait(10) is True
    assert f.done()
    f.result(0)
    assert f.put_id > 0


def test_no_space(client):
    # 256 MiB / 16 MiB grants of 16 MiB values: 16 slots at most
    with pytest.raises(fluxon.NoSpace):
        client.local_fast_put_start(keys(17), 16 << 20)
    assert client.stats()["slots_prepared"] == 0


def test_cuda_registration_fails_synchronously_without_a_gpu(client):
    """On a machine without a usable GPU the registration raises; it never silently falls back."""
    import subprocess
    has_gpu = subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0
    if has_gpu:
        client.register_segments_with_cuda()
    else:
        with pytest.raises(fluxon.Internal, match="CUDA"):
            client.register_segments_with_cuda()


def test_one_client_from_many_threads(client):
    """KvClient is thread-safe: threads put, read back and release concurrently on one client."""
    import threading
    errors = []

    def worker(t):
        try:
            for r in range(20):
                ks = keys(4, f"mt{t}-{r}-")
                p = client.local_fast_put_start(ks, 4096)
                write(p, 4096, t * 7 + r)
                client.local_fast_put_commit(p).result(10)
                h, res = client.get_start(ks)
                assert res.all_hit
                rp = client.get_transfer(h)
                got = read(rp, 4096)
                client.release_views(rp)
                assert got == [bytes([(t * 7 + r + i) % 251]) * 4096 for i in range(4)]
        except Exception as e:  # surfaced below
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors[0]
    s = settle(client)
    for k in TEMP:
        assert s[k] == 0, k


def test_close_while_other_threads_call():
    """close() while calls are in flight on other threads: they fail cleanly (Closed), nothing crashes."""
    import threading
    c = fluxon.KvClient({"owners": [{"contribute_to_cluster_pool_size": {"dram": "64MiB"},
                                     "local_reserve_grant_bytes": "16MiB"}]})
    stop = threading.Event()
    outcomes = []

    def worker(t):
        n = 0
        while not stop.is_set():
            try:
                p = c.local_fast_put_start([f"cl{t}-{n}"], 4096)
                c.local_fast_put_commit(p)
                n += 1
            except fluxon.Closed:
                outcomes.append("closed")
                return
            except fluxon.Error as e:
                outcomes.append(type(e).__name__)
                return

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for t in ts:
        t.start()
    time.sleep(0.2)
    c.close()
    stop.set()
    for t in ts:
        t.join(10)
    assert outcomes and all(o == "closed" for o in outcomes), outcomes


def test_exists_prefix_and_remove_prefix(client):
    import ctypes
    plan = client.local_fast_put_start(["ex:a", "ex:b", "ex:c", "other:a"], 4096)
    for p in fluxon.plan_pointers(plan):
        ctypes.memset(p, 1, 4096)
    assert fluxon.plan_lengths(plan) == [4096] * 4
    client.local_fast_put_commit(plan).result(10)
    before = client.stats()
    assert client.exists_prefix(["ex:a", "ex:b", "ex:x", "ex:c"]).prefix_len == 2
    assert client.exists_prefix(["ex:a", "ex:b", "ex:c"], [2, 1]).prefix_len == 3
    assert client.exists_prefix(["ex:a", "ex:b", "ex:c"], [1, 2], expected_len=4096).prefix_len == 3
    assert client.exists_prefix(["ex:a"], expected_len=8192).prefix_len == 0  # another length: missing
    assert client.exists_prefix(["a", "b"], key_prefix="ex:").prefix_len == 2
    assert client.exists_prefix(["ex:a", "ex:a"]).prefix_len == 2  # a question: repeats are harmless
    after = client.stats()
    assert (after["slots_prepared"], after["holders"], after["owner_active_get_handles"]) == \
        (before["slots_prepared"], before["holders"], before["owner_active_get_handles"])
    with pytest.raises(fluxon.InvalidArgument):
        client.exists_prefix([])
    with pytest.raises(fluxon.InvalidArgument):
        client.exists_prefix(["ex:a", ""])
    with pytest.raises(fluxon.InvalidArgument):
        client.remove_prefix("")
    assert client.remove_prefix("ex:") == 3
    assert client.exists_prefix(["ex:a"]).prefix_len == 0 and client.exists_prefix(["other:a"]).prefix_len == 1
    client.remove_prefix("other:")


def test_error_classes_are_made_from_the_one_list_of_codes():
    from fluxon import _fluxon, errors
    names = [n for n, _ in _fluxon.ERROR_CODES]
    assert names == ["InvalidArgument", "KeyConflict", "NoSpace", "LocalReserveTimeout", "KeyNotFound",
                     "GenerationMismatch", "Closed", "Timeout", "MalformedMessage", "Internal", "PermissionDenied"]
    for n, doc in _fluxon.ERROR_CODES:
        cls = errors.error_class(n)
        assert issubclass(cls, fluxon.Error) and cls.code == n and cls.__doc__ == doc
        assert getattr(fluxon, n) is cls
    with pytest.raises(fluxon.KeyConflict) as e:
        c = fluxon.KvClient()
        try:
            c.local_fast_put_commit(c.local_fast_put_start(["dup"], 4096)).result(5)
            c.local_fast_put_start(["dup"], 4096)
        finally:
            c.close()
    assert e.value.reasons == ["exists"]
