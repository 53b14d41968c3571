#!/usr/bin/env python3
"""batch_set_v1 / batch_get_v1 of 128 pages x 4.5 MiB through fluxon.sglang against the native
KvClient path (put_start, one native copy, commit; get_start, get_transfer, one native copy)
on the same host pool, in the same run. Prints GB/s and the adapter/native ratio (medians).

    PYTHONPATH=build/python /usr/bin/python3 tools/sglang_bench.py [--pages 128] [--rounds 3]
"""

import argparse
import ctypes
import statistics
import sys
import time

import fluxon
from fluxon import _fluxon
from fluxon.sglang import FluxonHiCacheStorage, HiCacheStorageConfig


class Pool:
    """MHA page_first host pool: [K|V][token][layer][item]; a page's K and V are one object each."""

    def __init__(self, pages, page_size, layer_bytes_per_token):
        self.page_size = page_size
        self.obj = page_size * layer_bytes_per_token
        self.pages = pages
        self.buf = (ctypes.c_uint8 * (2 * pages * self.obj))()
        self.base = ctypes.addressof(self.buf)
        ctypes.memset(self.base, 7, len(self.buf))

    def get_page_buffer_meta(self, indices):
        ptrs = []
        for first in list(indices)[::self.page_size]:
            k = self.base + (first // self.page_size) * self.obj
            ptrs += [k, k + self.pages * self.obj]
        return ptrs, [self.obj] * len(ptrs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    page_size, per_token = 64, 36 * 1024  # 36 layers x 1 KiB: K and V of 2.25 MiB -> 4.5 MiB values
    pool = Pool(a.pages, page_size, per_token)
    value_len = 2 * pool.obj
    gib = 2 * (a.rounds + 1) * a.pages * value_len / 2**30 + 1
    conf = {"owners": [{"contribute_to_cluster_pool_size": {"dram": f"{int(gib) + 1}GiB"},
                        "local_reserve_grant_bytes": "512MiB"}]}
    client = fluxon.KvClient(conf)
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, model_name="bench")
    store = FluxonHiCacheStorage(cfg, {"client": client})  # the same store for both paths
    store.register_mem_pool_host(pool)
    idx = list(range(a.pages * page_size))
    ptrs, sizes = pool.get_page_buffer_meta(idx)
    total = a.pages * value_len / 1e9
    native_set, native_get, ad_set, ad_get = [], [], [], []

    def native(r):
        keys = [f"native-{r}-{i}" for i in range(a.pages)]
        t = time.perf_counter()
        plan = client.local_fast_put_start(keys, value_len)
        _fluxon.plan_copy(plan, ptrs, sizes[:2], a.pages, True, 0)
        client.local_fast_put_commit(plan).result(30)
        ts = total / (time.perf_counter() - t)
        t = time.perf_counter()
        h, res = client.get_start(keys)
        rp = client.get_transfer(h)
        _fluxon.plan_copy(rp, ptrs, sizes[:2], a.pages, False, 0)
        client.release_views(rp)
        return ts, total / (time.perf_counter() - t)

    def adapter(r):
        keys = [f"adapter-{r}-{i}" for i in range(a.pages)]
        t = time.perf_counter()
        assert all(store.batch_set_v1(keys, idx))
        ts = total / (time.perf_counter() - t)
        t = time.perf_counter()
        assert all(store.batch_get_v1(keys, idx))
        return ts, total / (time.perf_counter() - t)

    # Both paths write fresh slots every round (page faults included, equally); they alternate
    # which goes first; round 0 is a warm-up.
    for r in range(a.rounds + 1):
        order = [(native, native_set, native_get), (adapter, ad_set, ad_get)]
        if r % 2:
            order.reverse()
        for fn, sets, gets in order:
            s_, g_ = fn(r)
            if r > 0:
                sets.append(s_)
                gets.append(g_)
    store.close()
    client.close()
    m = statistics.median
    print(f"{a.pages} pages x {value_len} B, one embedded store, median of {a.rounds} rounds (fresh slots each round)")
    print(f"  set: native KvClient {m(native_set):6.2f} GB/s   adapter batch_set_v1 {m(ad_set):6.2f} GB/s   "
          f"ratio {m(ad_set) / m(native_set):.2f}")
    print(f"  get: native KvClient {m(native_get):6.2f} GB/s   adapter batch_get_v1 {m(ad_get):6.2f} GB/s   "
          f"ratio {m(ad_get) / m(native_get):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
