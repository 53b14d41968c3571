#!/usr/bin/env python3
"""The SGLang backend's per-batch cost against raw copies of the same pages, in one run.

A master and an owner daemon are started (the deployment SGLang uses), the backend is built the
way SGLang builds it (``HiCacheStorageConfig`` as ``cache_controller._generate_storage_config``
fills it, the dynamic loader, ``register_mem_pool_host``), over a real torch host pool with the
shapes of Llama-3-8B at TP 2 (32 layers, 4 KV heads per rank, head_dim 128, bf16; pages of 64
tokens: 4 MiB per page, K and V of 2 MiB). Per round (fresh keys, cleared afterwards):

- ``batch_set_v1`` of 128 pages against ``memmove`` of the same 256 objects into a warm buffer;
- ``batch_get_v1`` of them into other pages against ``memmove`` of the same bytes;
- ``batch_exists`` of the 128 local pages (one ``exists_prefix``) against one owner round trip
  (``ping``) and against the old way (``get_start`` + ``cancel_get_transfer``).

Then the per-batch overhead with small pages (8 KiB: the bytes cost nothing, the calls are what is
left): ``batch_set_v1``, ``batch_exists`` and ``batch_get_v1`` of 1 and of 128 fresh pages, p50 of
``--calls`` batches each, beside one owner round trip (``ping``). ``--channel auto|caf`` chooses
how the backend's client reaches the owner (the shared-memory channel or CAF).

Medians over rounds; every result is checked (all True, the exact hit count).

    FLUXON_BUILD_DIR=build /usr/bin/python3 tools/sglang_bench.py [--rounds 5] [--pages 128] [--channel auto]
"""

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("FLUXON_BUILD_DIR", ROOT / "build"))
sys.path.insert(0, str(BUILD / "python"))
sys.path.insert(0, str(ROOT / "tests" / "python"))

import torch  # noqa: E402

from sglang_harness import MHAHostPool, dynamic_extra, load_backend, page_indices, storage_config  # noqa: E402


def p50(xs):
    return statistics.median(xs)


def overhead(client_cfg, calls: int, channel: str) -> None:
    """Per-batch cost of the three calls with pages too small for their bytes to matter."""
    small = MHAHostPool("page_first", pages=257, page_size=16, layer_num=2, head_num=2, head_dim=32,
                        dtype=torch.bfloat16)
    small.kv_buffer.view(torch.uint8).fill_(3)
    b = load_backend(storage_config(0, 2, model="meta-llama/Meta-Llama-3-8B", layout="page_first",
                                    extra=dynamic_extra(str(client_cfg), key_prefix="ovh")), small)
    ping = []
    for _ in range(calls):
        t = time.perf_counter()
        b.client.ping()
        ping.append(time.perf_counter() - t)
    print(f"  per-batch overhead, pages of {small.get_size_per_token() * 16} bytes, client.channel {channel}, "
          f"p50 of {calls} batches (ping p50 {p50(ping) * 1e6:.1f} us):")
    for n in (1, 128):
        st, ex, gt = [], [], []
        for c in range(calls):
            keys = [f"{n:03d}{c:05d}{i:056x}" for i in range(n)]
            t = time.perf_counter()
            res = b.batch_set_v1(keys, page_indices(small, list(range(n))))
            st.append(time.perf_counter() - t)
            assert res == [True] * n, res
            t = time.perf_counter()
            assert b.batch_exists(keys) == n
            ex.append(time.perf_counter() - t)
            t = time.perf_counter()
            res = b.batch_get_v1(keys, page_indices(small, list(range(128, 128 + n))))
            gt.append(time.perf_counter() - t)
            assert res == [True] * n, res
        print(f"    {n:3d} pages: batch_set_v1 {p50(st) * 1e6:7.1f} us, batch_exists {p50(ex) * 1e6:7.1f} us, "
              f"batch_get_v1 {p50(gt) * 1e6:7.1f} us")
    assert b.flush(30)
    b.clear()
    failures = b.fluxon_stats()["failures"]
    assert not failures, failures
    b.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--exists-calls", type=int, default=300)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--channel", choices=("auto", "shm", "caf"), default="auto")
    a = ap.parse_args()
    n = a.pages
    pool = MHAHostPool("page_first", pages=2 * n + 1, page_size=64, layer_num=32, head_num=4, head_dim=128,
                       dtype=torch.bfloat16)
    pool.kv_buffer.view(torch.uint8).fill_(7)  # touched: no first-use page faults in any path
    src_pages, dst_pages = list(range(n)), list(range(n, 2 * n))
    src, dst = page_indices(pool, src_pages), page_indices(pool, dst_pages)
    s_ptrs, sizes = pool.get_page_buffer_meta(src)
    d_ptrs, _ = pool.get_page_buffer_meta(dst)
    page_bytes = sum(sizes[:2])
    total = n * page_bytes
    scratch = torch.empty(total, dtype=torch.uint8)
    scratch.fill_(1)
    sbase = scratch.data_ptr()

    seg_mib = (2 * total) // 2**20 + 1024
    from fluxon.testing import LocalCluster
    cluster = LocalCluster({"owners": [{"contribute_to_cluster_pool_size": {"dram": f"{seg_mib}MiB"},
                                        "local_reserve_grant_bytes": "512MiB"}]},
                           fluxon_bin=str(BUILD / "tools" / "fluxon")).up()
    client_cfg = cluster.client_config_file(0, channel=a.channel)
    try:
        rows = {}
        for threads in (1, 0):
            b = load_backend(storage_config(0, 2, model="meta-llama/Meta-Llama-3-8B", layout="page_first",
                                            extra=dynamic_extra(str(client_cfg), copy_threads=threads)), pool)
            mc_set, mc_get, f_set, f_get, ex, ping, old = [], [], [], [], [], [], []
            for r in range(a.rounds + 1):
                keys = [f"{r:02d}{i:062x}" for i in range(n)]  # SGLang's 64-hex page hashes
                t = time.perf_counter()
                for i in range(2 * n):  # the same objects into a warm buffer
                    ctypes.memmove(sbase + (i * sizes[0]), s_ptrs[i], sizes[i])
                t_mc_set = time.perf_counter() - t
                t = time.perf_counter()
                res = b.batch_set_v1(keys, src)
                t_set = time.perf_counter() - t
                assert res == [True] * n, res
                t = time.perf_counter()
                for i in range(2 * n):
                    ctypes.memmove(d_ptrs[i], sbase + (i * sizes[0]), sizes[i])
                t_mc_get = time.perf_counter() - t
                t = time.perf_counter()
                res = b.batch_get_v1(keys, dst)
                t_get = time.perf_counter() - t
                assert res == [True] * n, res
                if r == a.rounds:  # existence of the 128 local pages, last round
                    for _ in range(a.exists_calls):
                        t = time.perf_counter()
                        assert b.batch_exists(keys) == n
                        ex.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        b.client.ping()
                        ping.append(time.perf_counter() - t)
                        skeys = b.storage_keys(keys)
                        t = time.perf_counter()
                        h, gr = b.client.get_start(skeys)
                        b.client.cancel_get_transfer(h)
                        old.append(time.perf_counter() - t)
                        assert gr.transferable_len == n
                assert b.flush(30)
                b.clear()
                if r > 0:
                    mc_set.append(total / t_mc_set / 1e9)
                    mc_get.append(total / t_mc_get / 1e9)
                    f_set.append(total / t_set / 1e9)
                    f_get.append(total / t_get / 1e9)
            failures = b.fluxon_stats()["failures"]
            assert not failures, failures
            b.close()
            rows[threads] = (mc_set, f_set, mc_get, f_get)
        print(f"{n} pages x {page_bytes >> 20} MiB (Llama-3-8B, TP 2, page 64, bf16, page_first), owner daemon, "
              f"median of {a.rounds} rounds")
        for threads, (mc_set, f_set, mc_get, f_get) in rows.items():
            label = "1 copy thread " if threads == 1 else f"auto threads ({os.cpu_count()} cores)"
            print(f"  {label}: batch_set_v1 {p50(f_set):6.2f} GB/s vs memmove {p50(mc_set):6.2f} GB/s = "
                  f"{p50(f_set) / p50(mc_set):.2f}x   batch_get_v1 {p50(f_get):6.2f} GB/s vs memmove "
                  f"{p50(mc_get):6.2f} GB/s = {p50(f_get) / p50(mc_get):.2f}x")
        print(f"  batch_exists of {n} local pages: p50 {p50(ex) * 1e6:7.1f} us = {p50(ex) / p50(ping):.2f}x one owner "
              f"round trip (ping p50 {p50(ping) * 1e6:.1f} us); get_start+cancel p50 {p50(old) * 1e6:.1f} us "
              f"({p50(old) / p50(ex):.2f}x exists)")
        overhead(client_cfg, a.calls, a.channel)
    finally:
        failed = sys.exc_info()[0] is not None
        cluster.down(keep_run_dir=failed)  # leaves nothing behind; a failed run keeps its logs
        if failed:
            print(f"sglang_bench: the daemons' logs are in {cluster.run_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
