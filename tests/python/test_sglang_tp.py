"""Two TP ranks as processes (torch.distributed gloo, MIN all-reduce as SGLang takes it) on one
owner daemon, through faults: the master paused and killed, the owner SIGKILLed and restarted (a
new generation), ranks that see different outcomes. Every rank returns every time; no thread of
the controller ever sees an exception; restored pages are verified byte for byte."""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from conftest import BUILD, Cluster, free_port, pause  # noqa: E402

HERE = Path(__file__).resolve().parent


class Ranks:
    def __init__(self, client_config: str, layout="page_first", world=2):
        port = free_port()
        env = dict(os.environ, FLUXON_BUILD_DIR=str(BUILD))
        self.procs = [subprocess.Popen([sys.executable, str(HERE / "sglang_rank.py"), str(r), str(world), str(port),
                                        client_config, layout], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       env=env, text=True) for r in range(world)]

    def send(self, rank_ops, timeout=30.0):
        """rank_ops: one command for every rank, or a list (None: that rank gets nothing)."""
        ops = rank_ops if isinstance(rank_ops, list) else [rank_ops] * len(self.procs)
        for p, op in zip(self.procs, ops):
            if op is not None:
                p.stdin.write(json.dumps(op) + "\n")
                p.stdin.flush()
        out = []
        for p, op in zip(self.procs, ops):
            if op is None:
                out.append(None)
                continue
            ready, _, _ = select.select([p.stdout], [], [], timeout)
            assert ready, f"a TP rank did not return within {timeout} s: {op['op']} hangs"
            reply = json.loads(p.stdout.readline())
            assert reply.get("thread_errors") in (None, []), reply["thread_errors"]
            out.append(reply)
        return out

    def close(self):
        try:
            self.send({"op": "exit"}, timeout=20)
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.kill()


def hashes(tag, n):
    return [f"{tag}{i:05x}" for i in range(n)]


def test_two_tp_ranks_survive_master_and_owner_faults(tmp_path):
    cl = Cluster(tmp_path, f"tp{free_port()}").start()
    ranks = Ranks(cl.client_config_file())
    try:
        a = hashes("a", 200)  # two batches of SGLang's 128
        assert [r["done"] for r in ranks.send({"op": "backup", "hashes": a, "pages": list(range(200))})] == [200, 200]
        got = ranks.send({"op": "prefetch", "hashes": a, "pages": list(range(250, 450))})
        assert [(r["restored"], r["verified"]) for r in got] == [(200, True)] * 2

        # Ranks that see different outcomes: rank 1 never backed b up; MIN gives 0 on both, none blocks.
        b = hashes("b", 40)
        ranks.send([{"op": "backup", "hashes": b, "pages": list(range(40))}, None])
        assert [r["restored"] for r in ranks.send({"op": "prefetch", "hashes": b, "pages": list(range(40))})] == [0, 0]

        # The master paused: backups are local-read-ready at once; reads of local pages go on.
        c = hashes("c", 100)
        pause(cl.master)
        try:
            res = ranks.send({"op": "backup", "hashes": c, "pages": list(range(100))})
            assert [r["done"] for r in res] == [100, 100]  # the master cannot answer: no wait for it
            got = ranks.send({"op": "prefetch", "hashes": c, "pages": list(range(300, 400))})
            assert [(r["restored"], r["verified"]) for r in got] == [(100, True)] * 2
        finally:
            cl.master.send_signal(signal.SIGCONT)
        assert all(r["settled"] for r in ranks.send({"op": "flush", "timeout": 20}))

        # The master killed: still local-read-ready; a new master gets the routes back.
        cl.master.send_signal(signal.SIGKILL)
        cl.master.wait()
        d = hashes("d", 30)
        assert [r["done"] for r in ranks.send({"op": "backup", "hashes": d, "pages": list(range(30))})] == [30, 30]
        cl.start_master()
        assert all(r["settled"] for r in ranks.send({"op": "flush", "timeout": 30}))
        got = ranks.send({"op": "prefetch", "hashes": d, "pages": list(range(60, 90))})
        assert [(r["restored"], r["verified"]) for r in got] == [(30, True)] * 2

        # The owner SIGKILLed: every call fails closed and returns, bounded; then a new generation.
        cl.stop_owner(0, signal.SIGKILL)
        res = ranks.send({"op": "backup", "hashes": hashes("e", 20), "pages": list(range(20))})
        assert [r["done"] for r in res] == [0, 0] and max(r["secs"] for r in res) < 15  # bounded
        res = ranks.send({"op": "prefetch", "hashes": a, "pages": list(range(200))})
        assert [r["restored"] for r in res] == [0, 0] and max(r["secs"] for r in res) < 15
        cl.start_owner(0)
        e = hashes("e", 50)
        assert [r["done"] for r in ranks.send({"op": "backup", "hashes": e, "pages": list(range(50))})] == [50, 50]
        got = ranks.send({"op": "prefetch", "hashes": e, "pages": list(range(100, 150))})
        assert [(r["restored"], r["verified"]) for r in got] == [(50, True)] * 2
        stats = ranks.send({"op": "stats"})
        for s in stats:
            assert s["counters"]["reattached"] >= 1
            assert any(k.startswith(("set:", "exists:")) for k in s["failures"])
    finally:
        ranks.close()
        cl.stop()
