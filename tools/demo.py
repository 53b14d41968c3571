#!/usr/bin/env python3
"""A short hostless workload through the Python API: put with ctypes writes, get, verify, stats."""

import ctypes
import sys
import time

import fluxon


def main(config=None):
    c = fluxon.KvClient(config)
    seg = c.wait_local_segments_ready()[0]
    print(f"python: segment {seg['segment_label']} {seg['len']} bytes, generation {seg['generation']}")
    run = f"pydemo-{time.time_ns()}"
    keys = [f"{run}:page-{i}" for i in range(8)]
    plan = c.local_fast_put_start(keys, 16384, fluxon.PutOptionalArgs(atomic_group_lens=[4, 4]))
    for i, addr in enumerate(fluxon.plan_pointers(plan)):
        ctypes.memset(addr, ord("a") + i, 16384)
    fut = c.local_fast_put_commit(plan)
    fut.result(10)
    print(f"python: put 8 pages, KvFuture done={fut.done()}")
    handle, r = c.get_start(keys + [f"{run}:missing"], atomic_group_lens=[4, 4, 1])
    print(f"python: {r}")
    rp = c.get_transfer(handle)
    ok = all(ctypes.string_at(a, 16384) == bytes([ord("a") + i]) * 16384
             for i, a in enumerate(fluxon.plan_pointers(rp)))
    c.release_views(rp)
    print(f"python: read back {r.transferable_len} pages, bytes verified: {ok}")
    print(f"python: stats {c.stats()}")
    c.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
