"""Hostless SGLang mode: node storage states, TP agreement with a real collective between rank
threads, the commit gate, and every row of the design's failure table."""

import ctypes
import random
import subprocess
import threading

import pytest

import fluxon
from conftest import Cluster, free_port
from fluxon.sglang.admission import AdmissionConfig
from fluxon.sglang.hostless import HostlessBackend, NodeStorage


class Collective:
    """allgather over threads: each rank's value, in rank order."""

    def __init__(self, n):
        self.barrier = threading.Barrier(n)
        self.slots = [None] * n

    def for_rank(self, rank):
        def allgather(v):
            self.slots[rank] = v
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out
        return allgather


def fill(seed):
    def write(plan):
        for i, a in enumerate(fluxon.plan_pointers(plan)):
            ctypes.memset(a, (seed + i) % 256, 4096)
    return write


def node(prefix, n, rank=0, size=1):
    return NodeStorage([f"{prefix}-{i}_m_{rank}_{size}" for i in range(n)])


def test_backup_states_follow_the_future(shared_cluster):
    c = fluxon.KvClient(shared_cluster.client_config())
    b = HostlessBackend(c)
    n = node(f"bk{random.random()}", 4)
    seen = {}

    def write(plan):
        seen["staged"] = n.storage_staged
        fill(1)(plan)
    assert b.backup_node(n, 4096, write)
    assert seen["staged"] and n.storage_local_ready and n.storage_pending and not n.storage_backed
    while b.poll(5) == 0:
        pass
    assert n.storage_backed and not (n.storage_staged or n.storage_local_ready or n.storage_pending)
    # the same node again: already stored, whole -> backed without a write
    again = NodeStorage(list(n.keys))
    assert b.backup_node(again, 4096, fill(2)) and again.storage_backed
    c.close()


def test_native_write_failure_aborts_the_put(shared_cluster):
    c = fluxon.KvClient(shared_cluster.client_config())
    b = HostlessBackend(c)
    n = node(f"wf{random.random()}", 3)

    def broken(plan):
        raise RuntimeError("CUDA kernel failed")
    assert not b.backup_node(n, 4096, broken)
    assert not (n.storage_staged or n.storage_pending or n.storage_backed)
    s = c.stats()
    assert s["slots_prepared"] == 0 and s["active_put_plans"] == 0
    assert b.backup_node(n, 4096, fill(3))  # the keys were released
    b.poll(5)
    c.close()


def test_half_a_group_fails_closed(shared_cluster):
    c = fluxon.KvClient(shared_cluster.client_config())
    b = HostlessBackend(c)
    n = node(f"half{random.random()}", 4)
    first = NodeStorage(n.keys[:2])
    assert b.backup_node(first, 4096, fill(1))
    b.poll(5)
    assert not b.backup_node(n, 4096, fill(2))  # two keys exist: the node is not split
    assert not n.storage_staged and not n.storage_backed
    c.close()


def test_backup_nodes_one_batch_nodes_whole_and_the_stored_ones_left_out(shared_cluster):
    """backup_nodes: several radix nodes in one put (one commit, one future), each its own group;
    a node stored whole already is a success without a write, a node half stored fails closed, and
    the others are put without them, their bytes where the plan put them."""
    c = fluxon.KvClient(shared_cluster.client_config())
    b = HostlessBackend(c)
    tag = f"bn{random.random()}"
    stored, half, a, z = node(tag + "s", 2), node(tag + "h", 3), node(tag + "a", 2), node(tag + "z", 1)
    assert b.backup_node(stored, 4096, fill(1))
    assert b.backup_node(NodeStorage(half.keys[:1]), 4096, fill(1))
    b.poll(5)
    written = []

    def write(plan, batch):
        written.append([n.keys for n in batch])
        for i, ptr in enumerate(fluxon.plan_pointers(plan)):
            ctypes.memset(ptr, 40 + i, 4096)
    nodes = [a, NodeStorage(list(stored.keys)), half, z]
    assert b.backup_nodes(nodes, 4096, write) == [True, True, False, True]
    assert written == [[a.keys, z.keys]]  # one plan, the two nodes left, in order
    assert nodes[1].storage_backed and not half.storage_staged and not half.storage_backed
    assert a.future is z.future and a.storage_pending
    while b.poll(5) == 0:
        pass
    assert a.storage_backed and z.storage_backed and not (a.storage_pending or z.storage_pending)
    h, r = c.get_start(a.keys + z.keys)
    assert r.transferable_len == 3
    plan = c.get_transfer(h)
    for i, ptr in enumerate(fluxon.plan_pointers(plan)):
        assert ctypes.string_at(ptr, 4096) == bytes([40 + i]) * 4096
    c.release_views(plan)
    c.close()


def test_future_failure_clears_states_and_reports_the_dead_leaf(tmp_path):
    cl = Cluster(tmp_path, f"ff{free_port()}", owners=2).start()
    try:
        c1 = fluxon.KvClient(cl.client_config(0))
        c2 = fluxon.KvClient(cl.client_config(1))
        dead = []
        b1 = HostlessBackend(c1, on_dead_leaf=dead.append)
        b2 = HostlessBackend(c2)
        first = node("shared-key", 2)
        assert b2.backup_node(first, 4096, fill(1))
        b2.poll(5)
        assert first.storage_backed
        second = node("shared-key", 2)  # the same keys from another owner: the master refuses
        assert b1.backup_node(second, 4096, fill(2))
        while b1.poll(5) == 0:
            pass
        assert not second.storage_backed and isinstance(second.error, fluxon.KeyConflict)
        assert not (second.storage_staged or second.storage_local_ready or second.storage_pending)
        assert dead == [second]
        c1.close()
        c2.close()
    finally:
        cl.stop()


def run_ranks(shared_cluster, prepare, fail_transfer_rank=None, restore_fail=False):
    """Two TP ranks as threads with their own clients; returns each rank's result and backend."""
    coll = Collective(2)
    results, backends = [None, None], [None, None]

    def rank(r):
        c = fluxon.KvClient(shared_cluster.client_config())
        if fail_transfer_rank == r:
            def broken(*a, **k):
                raise fluxon.Closed("P2P transfer failed")
            c.get_transfer = broken
        b = HostlessBackend(c, tp_rank=r, tp_size=2, allgather=coll.for_rank(r))
        keys, groups = prepare(b, r)
        res = b.start_restore(keys, groups)
        rolled = []
        if res.plan_ptr is not None:
            def restore(plan):
                if restore_fail:
                    raise RuntimeError("restore kernel failed")
            b.finish_restore(res, restore, rollback=lambda: rolled.append(True))
        results[r] = [res, None, rolled]
        backends[r] = b
        c.close()

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    # The owner's view once both ranks are done (acknowledgements are batched one-way messages).
    probe = fluxon.KvClient(shared_cluster.client_config())
    for _ in range(200):
        s = probe.stats()
        if s["holders"] == 0 and s["owner_active_get_handles"] == 0:
            break
        threading.Event().wait(0.01)
    probe.close()
    for r in range(2):
        results[r][1] = s
    return results, backends


def writer(tag, groups_written):
    def prepare(b, r):
        groups = [2, 2, 2]
        keys = [f"{tag}-{i}_m_{r}_2" for i in range(6)]
        for g in range(groups_written[r]):
            n = NodeStorage(keys[2 * g:2 * g + 2])
            assert b.backup_node(n, 4096, fill(r))
        while b.poll(5):
            pass
        return keys, groups
    return prepare


def test_ranks_that_disagree_converge_on_the_common_prefix(shared_cluster):
    results, backends = run_ranks(shared_cluster, writer(f"tp{random.random()}", {0: 3, 1: 2}))
    for r in range(2):
        res, stats, _ = results[r]
        assert (res.restored_pages, res.reason) == (4, "hit")
        assert backends[r].counters["tp_mismatch_retry"] == 1
        assert stats["holders"] == 0 and stats["owner_active_get_handles"] == 0


def test_ranks_with_no_common_group_take_a_unified_miss(shared_cluster):
    results, _ = run_ranks(shared_cluster, writer(f"tpm{random.random()}", {0: 3, 1: 0}))
    for r in range(2):
        res, stats, _ = results[r]
        assert (res.restored_pages, res.reason) == (0, "miss")
        assert stats["holders"] == 0


def test_commit_gate_rejects_when_one_rank_has_no_plan(shared_cluster):
    results, backends = run_ranks(shared_cluster, writer(f"gate{random.random()}", {0: 3, 1: 3}),
                                  fail_transfer_rank=1)
    for r in range(2):
        res, stats, _ = results[r]
        assert (res.restored_pages, res.reason) == (0, "gate_rejected")  # neither rank restores
        assert stats["holders"] == 0  # rank 0 released the views it held
        assert backends[r].counters["gate_rejected"] == 1


def test_restore_failure_releases_views_then_rolls_back(shared_cluster):
    results, backends = run_ranks(shared_cluster, writer(f"rf{random.random()}", {0: 3, 1: 3}), restore_fail=True)
    for r in range(2):
        res, stats, rolled = results[r]
        assert res.reason == "hit" and rolled == [True]
        assert stats["holders"] == 0
        assert backends[r].counters["restore_failed"] == 1


def test_abandoned_restore_is_cancelled(shared_cluster):
    c = fluxon.KvClient(shared_cluster.client_config())
    b = HostlessBackend(c)
    n = node(f"ab{random.random()}", 2)
    b.backup_node(n, 4096, fill(1))
    b.poll(5)
    h, r = c.get_start(n.keys)
    assert c.stats()["holders"] == 2
    b.abandon(h)
    for _ in range(100):
        if c.stats()["holders"] == 0:
            break
    assert c.stats()["holders"] == 0
    c.close()


def test_admission_mask_is_whole_node(shared_cluster):
    c = fluxon.KvClient(shared_cluster.client_config())
    b = HostlessBackend(c, admission=AdmissionConfig("kv_score_low_only", 0.5))
    n = node(f"adm{random.random()}", 3)
    assert b.backup_node(n, 4096, fill(1), scores=[0.1, 0.2, 0.3])
    b.poll(5)
    assert n.storage_backed
    c.close()


def test_a_nodes_depth_in_the_tree_is_what_depth_admission_reads(shared_cluster):
    """A radix node's pages go with content_depths = its depth + i: prefix_root_only admits the
    pages near the root of the tree, not the first pages of whatever node is backed up."""
    c = fluxon.KvClient(shared_cluster.client_config())
    b = HostlessBackend(c, admission=AdmissionConfig("prefix_root_only", root_pages=4))
    before = c.stats()["replica_keys_requested_total"]
    deep = node(f"deep{random.random()}", 3)
    deep.depth = 12
    assert b.backup_node(deep, 4096, fill(1))
    b.poll(5)
    assert deep.storage_backed
    assert c.stats()["replica_keys_requested_total"] == before  # 12.. is past the root pages
    top = node(f"top{random.random()}", 3)
    assert b.backup_node(top, 4096, fill(2))
    b.poll(5)
    assert c.stats()["replica_keys_requested_total"] == before + 3  # the whole node, one group
    c.close()


def test_content_depths_are_checked_by_the_client(shared_cluster):
    c = fluxon.KvClient(shared_cluster.client_config())
    with pytest.raises(fluxon.InvalidArgument, match=r"content_depths: length 1 != number of keys 2"):
        c.local_fast_put_start(["cd-a", "cd-b"], 4096, fluxon.PutOptionalArgs(content_depths=[0]))
    with pytest.raises(fluxon.InvalidArgument, match=r"content_depths\[1\]"):
        c.local_fast_put_start(["cd-a", "cd-b"], 4096, fluxon.PutOptionalArgs(content_depths=[0, -1]))
    plan = c.local_fast_put_start(["cd-a", "cd-b"], 4096, fluxon.PutOptionalArgs(content_depths=[3, 4]))
    c.put_abort(plan)
    c.close()


def test_cuda_registration_failure_is_synchronous(shared_cluster):
    if subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is present")
    c = fluxon.KvClient(shared_cluster.client_config())
    with pytest.raises(fluxon.Internal):
        HostlessBackend(c, register_with_cuda=True)
    c.close()
