"""fluxon.sglang: the HiCache storage backend against stand-ins of SGLang's host pools written
from its published interfaces (get_page_buffer_meta of page_first, page_first_direct,
layer_first and MLA pools)."""

import ctypes
import importlib
import random

import pytest

import fluxon
from fluxon.sglang import FluxonHiCacheStorage, HiCacheStorage, HiCacheStorageConfig, storage_key


class HostPool:
    """A host KV pool of `pages` pages; indices are token slots, as SGLang passes them."""

    def __init__(self, layout, pages=16, page_size=4, layers=3, heads=2, dim=8, dtype_size=2, mla=False):
        self.layout, self.page_size, self.layer_num = layout, page_size, layers
        self.mla = mla
        self.per_token = heads * dim * dtype_size  # one layer, K or V
        self.tokens = pages * page_size
        parts = 1 if mla else 2
        self.buf = (ctypes.c_uint8 * (parts * self.tokens * layers * self.per_token))()
        self.base = ctypes.addressof(self.buf)

    def fill(self, seed):
        rng = random.Random(seed)
        ctypes.memmove(self.base, bytes(rng.randrange(256) for _ in range(len(self.buf))), len(self.buf))

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        L, P, T, item = self.layer_num, self.page_size, self.tokens, self.per_token
        for first in list(indices)[::P]:
            page = first // P
            if self.mla:  # [token][layer][kv_dim]
                ptrs.append(self.base + first * L * item)
                sizes.append(P * L * item)
            elif self.layout == "page_first":  # [K|V][token][layer][head][dim]
                k = self.base + first * L * item
                ptrs += [k, k + T * L * item]
                sizes += [P * L * item] * 2
            elif self.layout == "page_first_direct":  # [K|V][page][layer][token in page][head][dim]
                k = self.base + page * L * P * item
                ptrs += [k, k + T * L * item]
                sizes += [L * P * item] * 2
            else:  # layer_first: [K|V][layer][token][head][dim]: 2 objects per layer
                for layer in range(L):
                    k = self.base + (layer * T + first) * item
                    ptrs += [k, k + L * T * item]
                    sizes += [P * item] * 2
        return ptrs, sizes

    def page_bytes(self, page):
        ptrs, sizes = self.get_page_buffer_meta(list(range(page * self.page_size, (page + 1) * self.page_size)))
        return b"".join(ctypes.string_at(p, s) for p, s in zip(ptrs, sizes))


def cfg(tp_rank=0, tp_size=1, mla=False, **extra):
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                                is_page_first_layout=True, model_name="Qwen/Qwen3-8B", extra_config=extra)


def indices(pages, page_size):
    return [p * page_size + t for p in pages for t in range(page_size)]


def test_dynamic_loading_contract(shared_cluster):
    mod = importlib.import_module("fluxon.sglang")
    cls = getattr(mod, "FluxonHiCacheStorage")
    store = cls(cfg(), {"backend_name": "fluxon", "interface_v1": True,
                        "fluxon_config": shared_cluster.client_config()})
    assert isinstance(store, HiCacheStorage)
    assert store.batch_exists(["nothing-here"]) == 0
    store.close()


def test_storage_key_scheme():
    c = cfg(tp_rank=1, tp_size=2)
    assert storage_key("sglang", "abc", c) == "sglang:abc_Qwen-Qwen3-8B_1_2"
    assert storage_key("p", "abc", c, component="mamba", extra_backend_tag="exp7") == "p:abc.mamba_Qwen-Qwen3-8B_1_2_exp7"
    assert storage_key("p", "abc", cfg(tp_rank=1, tp_size=2, mla=True)) == "p:abc_Qwen-Qwen3-8B"


@pytest.mark.parametrize("layout,mla", [("page_first", False), ("page_first_direct", False),
                                        ("layer_first", False), ("page_first", True)])
def test_set_then_get_bit_exact_in_a_fresh_client(shared_cluster, layout, mla):
    tag = f"{layout}{mla}{random.random()}"
    writer = FluxonHiCacheStorage(cfg(mla=mla), {"fluxon_config": shared_cluster.client_config(),
                                                 "extra_backend_tag": tag})
    src = HostPool(layout, mla=mla)
    src.fill(1)
    writer.register_mem_pool_host(src)
    hashes = [f"h{i}" for i in range(6)]
    pages = [3, 9, 0, 14, 7, 5]
    assert writer.batch_set_v1(hashes, indices(pages, 4)) == [True] * 6
    assert writer.batch_set_v1(hashes, indices(pages, 4)) == [True] * 6  # duplicates: already stored
    writer.close()

    reader = FluxonHiCacheStorage(cfg(mla=mla), {"fluxon_config": shared_cluster.client_config(),
                                                 "extra_backend_tag": tag})
    dst = HostPool(layout, mla=mla)
    reader.register_mem_pool_host(dst)
    assert reader.batch_exists(hashes + ["missing"]) == 6
    assert reader.batch_exists(["missing"] + hashes) == 0
    into = [1, 2, 4, 6, 8, 10]
    got = reader.batch_get_v1(hashes[:4] + ["missing"] + hashes[4:], indices(into[:4] + [11] + into[4:], 4))
    assert got == [True] * 4 + [False] * 3  # prefix semantics: nothing past the first miss
    for h_page, d_page in zip(pages[:4], into[:4]):
        assert dst.page_bytes(d_page) == src.page_bytes(h_page)
    assert dst.page_bytes(11) == bytes(len(dst.page_bytes(11)))  # untouched
    stats = reader.get_stats()
    assert stats["get_pages"] == 4 and stats["fluxon_holders"] == 0
    reader.close()


def test_mla_only_rank0_writes_and_every_rank_reads(shared_cluster):
    tag = f"mla{random.random()}"
    conf = {"fluxon_config": shared_cluster.client_config(), "extra_backend_tag": tag}
    r1 = FluxonHiCacheStorage(cfg(tp_rank=1, tp_size=2, mla=True), conf)
    pool = HostPool("page_first", mla=True)
    pool.fill(3)
    r1.register_mem_pool_host(pool)
    assert r1.batch_set_v1(["m0"], indices([2], 4)) == [True]
    assert r1.batch_exists(["m0"]) == 0  # rank 1 wrote nothing
    r0 = FluxonHiCacheStorage(cfg(tp_rank=0, tp_size=2, mla=True), conf)
    r0.register_mem_pool_host(pool)
    assert r0.batch_set_v1(["m0"], indices([2], 4)) == [True]
    assert r1.batch_exists(["m0"]) == 1  # the same key for every rank
    dst = HostPool("page_first", mla=True)
    r1.register_mem_pool_host(dst)
    assert r1.batch_get_v1(["m0"], indices([5], 4)) == [True]
    assert dst.page_bytes(5) == pool.page_bytes(2)
    r0.close()
    r1.close()


def test_legacy_interface(shared_cluster):
    s = FluxonHiCacheStorage(cfg(), {"fluxon_config": shared_cluster.client_config(),
                                     "extra_backend_tag": f"legacy{random.random()}"})
    assert s.set("a", b"x" * 100)
    assert s.batch_set(["b", "c"], [b"y" * 50, b"z" * 70])
    assert s.exists("a") and not s.exists("nope")
    assert s.batch_exists(["a", "b", "c", "d"]) == 3
    assert s.get("a", target_sizes=100) == b"x" * 100
    assert s.batch_get(["b", "c"], target_sizes=[50, 70]) == [b"y" * 50, b"z" * 70]
    buf = ctypes.create_string_buffer(70)
    assert s.batch_get(["c", "nope"], [ctypes.addressof(buf), 0], [70, 1]) == [True, None]
    assert buf.raw == b"z" * 70
    assert s.set("a", b"x" * 100)  # already stored is success
    s.clear()
    assert s.get_stats()["fluxon_holders"] == 0
    s.close()


def test_requires_a_registered_pool(shared_cluster):
    s = FluxonHiCacheStorage(cfg(), {"fluxon_config": shared_cluster.client_config()})
    with pytest.raises(fluxon.InvalidArgument):
        s.batch_set_v1(["x"], [0, 1, 2, 3])
    s.close()


def test_replica_admission_is_carried_into_the_put(shared_cluster):
    s = FluxonHiCacheStorage(cfg(), {"fluxon_config": shared_cluster.client_config(),
                                     "extra_backend_tag": f"adm{random.random()}",
                                     "replica_task": {"enabled": True, "admission": {
                                         "policy": "kv_score_low_only", "score_threshold": 0.5}}})
    pool = HostPool("page_first")
    pool.fill(4)
    s.register_mem_pool_host(pool)
    from fluxon.sglang import HiCacheStorageExtraInfo
    info = HiCacheStorageExtraInfo(extra_info={"kv_scores": [0.1, 0.9, 0.5]})
    assert s.batch_set_v1(["r0", "r1", "r2"], indices([0, 1, 2], 4), info) == [True] * 3
    assert s.get_stats()["replica_admitted_pages"] == 2
    with pytest.raises(fluxon.InvalidArgument):
        FluxonHiCacheStorage(cfg(), {"fluxon_config": shared_cluster.client_config(),
                                     "replica_task": {"enabled": True, "admission": {"policy": "maybe"}}})
    s.close()
