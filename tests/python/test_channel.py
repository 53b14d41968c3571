"""The shared-memory channel between a same-host client and its owner, with real processes: it is
chosen when the owner is on this host, a killed client's holdings are released while the owner
keeps serving the others, two clients run at full rate side by side, an owner restart gives
GenerationMismatch at once and a new channel after, and a client that insists on the channel where
there is none is told so by name. (The API, remote-get and daemon tests run over the channel by
default and once more over CAF: tools/test.sh.)"""

import ctypes
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import fluxon
from conftest import BUILD, Cluster, free_port, sample, scrape


def client(cluster, channel="auto", i=0):
    cfg = cluster.client_config(i)
    cfg["client"]["channel"] = channel
    return fluxon.KvClient(cfg)


def channel_figures(cluster, i=0) -> dict:
    page = scrape(cluster.owner_metrics[i])
    names = ("sessions", "opened_total", "closed_total", "calls_total", "notes_total", "refused_entries_total")
    return {n: sample(page, f"fluxon_owner_channel_{n}") for n in names}


@pytest.fixture
def mcluster(tmp_path):
    c = Cluster(tmp_path, f"ch{free_port()}", metrics=True).start()
    yield c
    c.stop()


def put(c, keys, byte=1, n=4096):
    p = c.local_fast_put_start(keys, n)
    for a in fluxon.plan_pointers(p):
        ctypes.memset(a, byte, n)
    c.local_fast_put_commit(p).result(10)


def test_a_same_host_client_goes_over_the_channel_and_a_caf_client_does_not(mcluster):
    before = channel_figures(mcluster)
    assert before["sessions"] == 0 and before["calls_total"] == 0
    c = client(mcluster, "auto")
    c.wait_local_segments_ready()
    put(c, ["a0", "a1"])
    h, r = c.get_start(["a0", "a1"])
    assert r.all_hit
    plan = c.get_transfer(h)
    c.release_views(plan)
    mid = channel_figures(mcluster)
    assert mid["sessions"] == 1 and mid["calls_total"] >= 3  # put_start, commit, get_start (the transfer is local)
    caf = client(mcluster, "caf")
    put(caf, ["b0"])
    after = channel_figures(mcluster)
    assert after["calls_total"] == mid["calls_total"] and after["opened_total"] == 1  # the CAF client: none
    c.close()
    caf.close()
    end = time.time() + 10
    while channel_figures(mcluster)["sessions"] != 0 and time.time() < end:
        time.sleep(0.05)
    assert channel_figures(mcluster)["closed_total"] == 1


def test_channel_shm_is_refused_in_words_where_the_owner_has_none(tmp_path):
    c = Cluster(tmp_path, f"noch{free_port()}", owner_extra="client_channel: {enabled: false}").start()
    try:
        with pytest.raises(fluxon.Closed, match="client.channel is shm"):
            client(c, "shm")
        k = client(c, "auto")  # auto falls back to CAF
        put(k, ["x"])
        k.close()
    finally:
        c.stop()


def test_a_client_killed_during_calls_has_its_holdings_released_while_others_are_served(mcluster):
    c = client(mcluster)
    put(c, ["d0", "d1"])
    code = textwrap.dedent(f"""
        import sys, ctypes
        sys.path.insert(0, {str(BUILD / 'python')!r})
        import fluxon
        c = fluxon.KvClient({mcluster.client_config()!r})
        h, r = c.get_start(["d0", "d1"])
        c.local_fast_put_start(["d2"], 4096)
        print("held", flush=True)
        i = 0
        while True:  # calls without end: the kill lands in one of them
            hh, rr = c.get_start(["d0"])
            c.cancel_get_transfer(hh)
            i += 1
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        time.sleep(0.3)
        s = c.stats()
        assert s["slots_prepared"] == 1 and s["holders"] >= 2
        p.send_signal(signal.SIGKILL)
        p.wait()
        served = 0
        end = time.time() + 10
        while time.time() < end:
            put(c, [f"other{served}"])  # the owner keeps serving this client meanwhile
            served += 1
            s = c.stats()
            if s["holders"] == 0 and s["slots_prepared"] == 0:
                break
        assert s["holders"] == 0 and s["slots_prepared"] == 0 and s["owner_active_get_handles"] == 0
        assert served >= 1
        f = channel_figures(mcluster)
        assert f["sessions"] == 1 and f["closed_total"] == 1 and f["refused_entries_total"] == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    c.close()


def test_two_clients_at_full_rate_each_read_their_own_bytes(mcluster):
    code = textwrap.dedent(f"""
        import sys, ctypes
        sys.path.insert(0, {str(BUILD / 'python')!r})
        import fluxon
        tag = sys.argv[1]
        c = fluxon.KvClient({mcluster.client_config()!r})
        c.wait_local_segments_ready()
        bad = 0
        for i in range(300):
            keys = [f"{{tag}}-{{i}}-{{j}}" for j in range(8)]
            p = c.local_fast_put_start(keys, 1024)
            for j, a in enumerate(fluxon.plan_pointers(p)):
                ctypes.memset(a, (i + j) % 251, 1024)
            c.local_fast_put_commit(p)
            h, r = c.get_start(keys)
            plan = c.get_transfer(h)
            for j, a in enumerate(fluxon.plan_pointers(plan)):
                if ctypes.string_at(a, 1024) != bytes([(i + j) % 251]) * 1024:
                    bad += 1
            c.release_views(plan)
        c.close()
        print("bad", bad, flush=True)
    """)
    ps = [subprocess.Popen([sys.executable, "-c", code, t], stdout=subprocess.PIPE, text=True) for t in ("p", "q")]
    outs = [p.communicate(timeout=120)[0] for p in ps]
    assert [p.returncode for p in ps] == [0, 0], outs
    assert all(o.strip() == "bad 0" for o in outs), outs
    f = channel_figures(mcluster)
    assert f["opened_total"] == 2 and f["calls_total"] >= 2 * 300 * 3


def test_an_owner_restart_gives_generation_mismatch_at_once_and_a_new_channel_after(mcluster):
    c = client(mcluster, "shm")
    put(c, ["r0"])
    mcluster.stop_owner(0, signal.SIGKILL)
    mcluster.start_owner(0)
    t0 = time.time()
    with pytest.raises(fluxon.GenerationMismatch):
        c.get_start(["r0"])
    assert time.time() - t0 < 5  # not a timeout
    c.wait_local_segments_ready()
    put(c, ["r1"])
    f = channel_figures(mcluster)
    assert f["sessions"] == 1 and f["opened_total"] == 1 and f["calls_total"] >= 2
    c.close()


@pytest.mark.parametrize("channel", ["shm", "caf"])
def test_calls_waiting_in_a_killed_owner_end_at_once_and_the_client_goes_on_with_its_restart(tmp_path, channel):
    """Under load: puts wait in the owner's claim queue (every slot held by another client) when the
    owner is killed -9. Each waiting call ends at once with Closed (or GenerationMismatch), never at
    the 60 s RPC timeout, and the same client goes on with the restarted owner (its next call names
    the new generation; after wait_local_segments_ready it puts and reads again)."""
    import threading

    cl = Cluster(tmp_path, f"kl{free_port()}", dram="16MiB", metrics=False).start()
    try:
        cfg = cl.client_config()
        cfg["client"]["channel"] = channel
        cfg["client"]["rpc_timeout_ms"] = 60000
        hog = fluxon.KvClient(cfg)
        held = hog.local_fast_put_start([f"hog{i}" for i in range(4096)], 4096)  # every slot: Prepared
        assert len(fluxon.plan_pointers(held)) == 4096
        c = fluxon.KvClient(cfg)
        outcomes = []

        def waiter(i):
            try:
                c.local_fast_put_start([f"w{i}"], 4096)
                outcomes.append(("served", time.time()))
            except fluxon.Error as e:
                outcomes.append((e.code, time.time()))

        ts = [threading.Thread(target=waiter, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        time.sleep(1.0)  # they wait in the claim queue now
        assert not outcomes
        killed = time.time()
        cl.stop_owner(0, signal.SIGKILL)
        for t in ts:
            t.join(timeout=30)
        assert len(outcomes) == 4, outcomes
        assert all(code in ("Closed", "GenerationMismatch") for code, _ in outcomes), outcomes
        assert all(end - killed < 10 for _, end in outcomes), [(c_, end - killed) for c_, end in outcomes]
        cl.start_owner(0)
        with pytest.raises((fluxon.GenerationMismatch, fluxon.Closed)):
            c.local_fast_put_start(["after"], 4096)
        c.wait_local_segments_ready()
        put(c, ["after"])
        h, r = c.get_start(["after"])
        assert r.all_hit
        c.release_views(c.get_transfer(h))
        c.close()
        hog.close()
    finally:
        cl.stop()
