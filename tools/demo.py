#!/usr/bin/env python3
"""A short hostless workload through the Python API: put with ctypes writes, get, verify, stats."""

import ctypes
import sys
import time

import fluxon


def main(config=None, all_stats=False):
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
    print(f"python: get_start of 9 keys: {r.transferable_len} transferable (a prefix of {r.prefix_hit_groups} whole "
          f"groups), first miss at {r.first_miss_index}")
    rp = c.get_transfer(handle)
    ok = all(ctypes.string_at(a, 16384) == bytes([ord("a") + i]) * 16384
             for i, a in enumerate(fluxon.plan_pointers(rp)))
    c.release_views(rp)
    print(f"python: read back {r.transferable_len} pages, bytes verified: {ok}")
    st = c.stats()
    if all_stats:
        print(f"python: stats {st}")
    else:
        print(f"python: owner {st['put_keys_total']} keys put, {st['get_keys_total']} read "
              f"({st['get_hit_keys_total']} hits), {st['slots_committed']} slots committed, {st['errors_total']} errors "
              f"(every figure: --stats)")
    c.close()
    return 0 if ok else 1


if __name__ == "__main__":
    args = [x for x in sys.argv[1:] if x != "--stats"]
    sys.exit(main(args[0] if args else None, "--stats" in sys.argv[1:]))
