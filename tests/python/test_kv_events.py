"""KV events for cache-aware routers (docs/events.md), with real processes: a master, owners and
clients, and for the failover case a real etcd and two masters. KvClient.kv_events streams
stored/removed in the master's order, resumes from a cursor, says `lost` when it cannot go on."""

import os
import time

import pytest

import fluxon
from conftest import Cluster, free_port
from test_ha import HaCluster
from test_remote import _put


def _drain(c, prefix, cursor=None, want=None, timeout=15.0):
    """Events after cursor until `want` of them came (or nothing new for a while)."""
    out = []
    for e in c.kv_events(prefix=prefix, cursor=cursor, poll_interval_s=0.02,
                         idle_timeout_s=timeout if want else 1.0):
        out.append(e)
        if want is not None and len([x for x in out if x.kind != "lost"]) >= want:
            break
    return out


def test_stored_and_removed_in_order_with_causes_prefix_and_a_resumed_cursor(tmp_path):
    cl = Cluster(tmp_path, f"ev{os.getpid()}x{free_port()}", owners=2).start()
    try:
        a, b = fluxon.KvClient(cl.client_config(0)), fluxon.KvClient(cl.client_config(1))
        keys = [f"ev:a:{i}" for i in range(8)]
        _put(a, keys, 4096, seed=1)
        _put(b, ["other:x"], 4096, seed=2)  # another prefix: filtered out
        got = _drain(b, "ev:", want=8)  # read through another owner: the master's log is the cluster's
        assert [(e.kind, e.key, e.node) for e in got] == [("stored", k, 1) for k in keys]
        assert all(e.version[0] == 1 and e.version[2] > 0 for e in got)
        cursor = got[-1].cursor
        # An overwrite (the owner's own newer version) and a removal, then a resume from the cursor.
        opts = fluxon.PutOptionalArgs(reject_if_exist_same_key=False)
        _put(a, keys[:1], 4096, seed=3, opts=opts)
        assert a.remove_prefix("ev:a:7") == 1
        more = _drain(b, "ev:", cursor=cursor, want=3)
        # The old version leaves first: removed by its owner (its RemoveRoutes came first) or
        # replaced in place (the new version's PutDone did); then the new version is stored.
        assert [(e.kind, e.key) for e in more] == [("removed", keys[0]), ("stored", keys[0]), ("removed", keys[7])]
        assert more[0].cause in ("removed", "replaced") and more[0].version == got[0].version
        assert more[1].version[2] > got[0].version[2]  # the newer put_id
        assert more[2].cause == "removed"
        # Per key, the order is the order of the changes; the cursor of each event resumes after it.
        again = _drain(b, "ev:", cursor=more[0].cursor, want=2)
        assert [(e.kind, e.key) for e in again] == [("stored", keys[0]), ("removed", keys[7])]
        # Nothing new: the iterator ends at its idle timeout, the cursor stays at the head.
        events, head = b.poll_kv_events("ev:", more[-1].cursor)
        assert events == [] and head == more[-1].cursor
        # A bad cursor is refused, naming it.
        with pytest.raises(fluxon.InvalidArgument, match="cursor"):
            b.poll_kv_events(None, "nonsense")
        # ... and by the iterator when it is made, not at its first event.
        with pytest.raises(fluxon.InvalidArgument, match="cursor"):
            b.kv_events(cursor="nonsense")
        with pytest.raises(fluxon.InvalidArgument, match="idle_timeout_s"):
            b.kv_events(idle_timeout_s=-1)
        a.close()
        b.close()
    finally:
        cl.stop()


def test_a_slow_reader_overtaken_at_the_bound_is_told_lost_and_where_to_go_on(tmp_path):
    cl = Cluster(tmp_path, f"evb{os.getpid()}x{free_port()}", master_extra="kv_event_log_capacity: 16").start()
    try:
        c = fluxon.KvClient(cl.client_config(0))
        _put(c, [f"slow:{i}" for i in range(4)], 4096, seed=1)
        first, cursor = c.poll_kv_events("slow:")
        assert [e.key for e in first] == [f"slow:{i}" for i in range(4)]
        _put(c, [f"slow:{i}" for i in range(4, 40)], 4096, seed=2)  # 36 more: 24 pass the bound of 16
        events, cursor2 = c.poll_kv_events("slow:", cursor)
        assert events[0].kind == "lost"
        assert [e.key for e in events[1:]] == [f"slow:{i}" for i in range(24, 40)]  # the 16 the log holds
        assert c.master_stats()["kv_events"] == 16
        again, _ = c.poll_kv_events("slow:", cursor2)
        assert again == []  # read on from where it was told: nothing lost any more
        c.close()
    finally:
        cl.stop()


def test_a_master_restart_reads_on_with_lost_then_the_resynced_routes(tmp_path):
    cl = Cluster(tmp_path, f"evr{os.getpid()}x{free_port()}").start()
    try:
        c = fluxon.KvClient(cl.client_config(0))
        keys = [f"rs:{i}" for i in range(6)]
        _put(c, keys, 4096, seed=1)
        got = _drain(c, "rs:", want=6)
        cl.master.kill()
        cl.master.wait()
        cl.start_master()  # empty: the owner resyncs its live routes to it
        after = _drain(c, "rs:", cursor=got[-1].cursor, want=6, timeout=20)
        assert after[0].kind == "lost"  # another master's log: the reader re-syncs
        assert sorted(e.key for e in after[1:]) == keys and all(e.kind == "stored" for e in after[1:])
        assert after[1].cursor.split(":")[0] != got[-1].cursor.split(":")[0]  # a new epoch
        c.close()
    finally:
        cl.stop()


def test_a_resume_across_an_ha_failover(tmp_path):
    ha = HaCluster(tmp_path, f"evh{os.getpid()}x{free_port()}").start()
    try:
        lead, term = ha.wait_leader()
        a, b = ha.client(0), ha.client(1)
        keys = [f"fo:{i}" for i in range(5)]
        _put(a, keys, 4096, seed=1)
        got = _drain(b, "fo:", want=5)
        assert got[-1].cursor.split(":")[0] == str(term)  # the leader's term names its log
        ha.masters[lead].kill()
        ha.masters[lead].wait()
        new, new_term = ha.wait_leader(timeout=15, other_than=lead)
        _put(a, ["fo:late"], 4096, seed=2)
        after = _drain(b, "fo:", cursor=got[-1].cursor, want=6, timeout=20)
        assert after[0].kind == "lost"
        assert sorted(e.key for e in after[1:]) == sorted(keys + ["fo:late"])
        assert all(e.kind == "stored" and e.cursor.startswith(f"{new_term}:") for e in after[1:])
        a.close()
        b.close()
    finally:
        ha.stop()
