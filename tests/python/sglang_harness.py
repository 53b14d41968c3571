"""Drives fluxon.sglang the way SGLang does, with real torch on CPU.

- Host pools with SGLang's buffer geometry (``mem_cache/pool_host/mha.py`` and ``mla.py``): one
  ``kv_buffer`` tensor shaped per layout, ``get_page_buffer_meta`` giving the same pointers and
  sizes in the same order, ``get_split_heads_page_buffer_meta`` for ``page_head``. A restatement
  of the geometry: SGLang's pools need its device pools, which need a GPU.
- The backend is built by SGLang's dynamic-loading rules (``storage/backend_factory.py``):
  ``importlib.import_module(module_path)``, ``getattr(class_name)``, the ``issubclass`` check,
  ``cls(storage_config, {})`` then ``register_mem_pool_host``. The interface classes come from
  ``fluxon.sglang._compat``: SGLang's own wherever SGLang is importable.
- The controller's threads (``managers/cache_controller.py``): the prefetch thread asks
  ``batch_exists`` per batch of <= 128 pages and stops at the first short batch, the ranks take the
  MIN of the hit tokens; the I/O thread reads with ``batch_get_v1`` (leading True values count), the
  ranks take the MIN of the completed tokens; the backup thread writes with ``all(batch_set_v1)``
  per batch and stops at the first failure. An exception escaping into a thread is recorded: it is
  what kills SGLang's daemon threads.
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from typing import List, Optional

import torch

from fluxon.sglang._compat import STORAGE_BATCH_SIZE, HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo


def _itemsize(dtype) -> int:
    """torch.dtype.itemsize of newer torch (SGLang's), on any torch."""
    return torch.empty((), dtype=dtype).element_size()


class MHAHostPool:
    def __init__(self, layout: str, pages: int, page_size: int, layer_num: int, head_num: int, head_dim: int,
                 dtype=torch.bfloat16):
        self.layout, self.page_size, self.layer_num = layout, page_size, layer_num
        self.head_num, self.head_dim, self.dtype = head_num, head_dim, dtype
        self.page_num = pages
        self.size = pages * page_size
        dims = {"layer_first": (2, layer_num, self.size, head_num, head_dim),
                "page_first": (2, self.size, layer_num, head_num, head_dim),
                "page_first_direct": (2, pages, layer_num, page_size, head_num, head_dim),
                "page_head": (2, pages, head_num, page_size, layer_num, head_dim)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def get_size_per_token(self):
        return self.head_dim * self.head_num * self.layer_num * _itemsize(self.dtype) * 2

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        ptrs = []
        base = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        item = _itemsize(self.dtype)
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        if self.layout == "layer_first":
            for index in range(0, len(indices), self.page_size):
                for layer_id in range(self.layer_num):
                    k = (base + indices[index] * self.head_num * self.head_dim * item
                         + layer_id * self.size * self.head_num * self.head_dim * item)
                    ptrs += [k, k + v_offset]
            element = item * self.page_size * self.head_num * self.head_dim
        else:
            for index in range(0, len(indices), self.page_size):
                k = base + indices[index] * self.layer_num * self.head_num * self.head_dim * item
                ptrs += [k, k + v_offset]
            element = self.layer_num * item * self.page_size * self.head_num * self.head_dim
        return ptrs, [element] * len(ptrs)

    def get_split_heads_page_buffer_meta(self, indices, split_factor):
        assert self.layout == "page_head"
        ptrs = []
        base = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        item = _itemsize(self.dtype)
        v_offset = self.layer_num * self.size * self.head_num * self.head_dim * item
        for index in range(0, len(indices), self.page_size):
            for head_id in range(0, self.head_num, self.head_num // split_factor):
                k = (base + indices[index] * self.layer_num * self.head_num * self.head_dim * item
                     + head_id * self.page_size * self.layer_num * self.head_dim * item)
                ptrs += [k, k + v_offset]
        element = self.layer_num * item * self.page_size * self.head_num * self.head_dim // split_factor
        return ptrs, [element] * len(ptrs)

    def page_view(self, page: int) -> bytes:
        return page_bytes(self, page)


class MLAHostPool:
    def __init__(self, layout: str, pages: int, page_size: int, layer_num: int, kv_cache_dim: int,
                 dtype=torch.bfloat16):
        self.layout, self.page_size, self.layer_num, self.kv_cache_dim, self.dtype = \
            layout, page_size, layer_num, kv_cache_dim, dtype
        self.page_num = pages
        self.size = pages * page_size
        dims = {"layer_first": (layer_num, self.size, 1, kv_cache_dim),
                "page_first": (self.size, layer_num, 1, kv_cache_dim),
                "page_first_direct": (pages, layer_num, page_size, 1, kv_cache_dim)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def get_page_buffer_meta(self, indices):
        assert len(indices) % self.page_size == 0
        ptrs = []
        base = self.kv_buffer.data_ptr()
        indices = indices.tolist()
        item = _itemsize(self.dtype)
        if self.layout == "layer_first":
            for index in range(0, len(indices), self.page_size):
                for layer_id in range(self.layer_num):
                    ptrs.append(base + indices[index] * self.kv_cache_dim * item
                                + layer_id * self.size * self.kv_cache_dim * item)
            element = item * self.page_size * self.kv_cache_dim
        else:
            for index in range(0, len(indices), self.page_size):
                ptrs.append(base + indices[index] * self.layer_num * self.kv_cache_dim * item)
            element = self.layer_num * item * self.page_size * self.kv_cache_dim
        return ptrs, [element] * len(ptrs)


class StateHostPool:
    """A hybrid pool (Mamba-like): one state per index, two objects of different sizes."""

    def __init__(self, slots: int, temporal_bytes: int, conv_bytes: int):
        self.page_size = 1
        self.layout = "state"
        self.dtype = torch.float32
        self.temporal = torch.zeros((slots, temporal_bytes), dtype=torch.uint8)
        self.conv = torch.zeros((slots, conv_bytes), dtype=torch.uint8)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        t, c = self.temporal, self.conv
        for i in indices.tolist():
            ptrs += [t.data_ptr() + i * t.shape[1], c.data_ptr() + i * c.shape[1]]
            sizes += [t.shape[1], c.shape[1]]
        return ptrs, sizes


def page_bytes(pool, page: int) -> bytes:
    """The bytes of page `page`, object by object in get_page_buffer_meta order."""
    import ctypes
    ptrs, sizes = pool.get_page_buffer_meta(page_indices(pool, [page]))
    return b"".join(ctypes.string_at(p, s) for p, s in zip(ptrs, sizes))


def fill_page(pool, page: int, seed: str) -> bytes:
    """Writes deterministic bytes (from `seed`) into page `page`; returns them."""
    import ctypes
    ptrs, sizes = pool.get_page_buffer_meta(page_indices(pool, [page]))
    out = []
    for j, (p, s) in enumerate(zip(ptrs, sizes)):
        data = _stream(f"{seed}/{j}", s)
        ctypes.memmove(p, data, s)
        out.append(data)
    return b"".join(out)


def _stream(seed: str, n: int) -> bytes:
    out, i = bytearray(), 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}#{i}".encode()).digest()
        i += 1
    return bytes(out[:n])


def page_indices(pool, pages: List[int]):
    ps = pool.page_size
    return torch.tensor([p * ps + t for p in pages for t in range(ps)], dtype=torch.int64)


def storage_config(tp_rank=0, tp_size=1, mla=False, model="Qwen/Qwen3-8B", layout="page_first", extra=None,
                   tp_lcm_size=None, should_split_heads=False, dp_rank=0, dp_size=1):
    """Built the way cache_controller._generate_storage_config builds it."""
    return HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=True,
                                is_page_first_layout=layout == "page_first", model_name=model, dp_rank=dp_rank,
                                dp_size=dp_size, tp_lcm_size=tp_lcm_size, should_split_heads=should_split_heads,
                                extra_config=dict(extra or {}))


def load_backend(cfg: HiCacheStorageConfig, pool) -> HiCacheStorage:
    """StorageBackendFactory._create_dynamic_backend, then attach_storage_backend's registration."""
    ec = cfg.extra_config
    for field in ("backend_name", "module_path", "class_name"):
        if field not in ec:
            raise ValueError(f"Missing required field '{field}' in backend config for 'dynamic' backend")
    module = importlib.import_module(ec["module_path"])
    cls = getattr(module, ec["class_name"])
    if not issubclass(cls, HiCacheStorage):
        raise TypeError(f"Backend class {ec['class_name']} must inherit from HiCacheStorage")
    backend = cls(cfg, {})
    backend.register_mem_pool_host(pool)
    return backend


def dynamic_extra(fluxon_config, **more) -> dict:
    d = {"backend_name": "fluxon", "module_path": "fluxon.sglang", "class_name": "FluxonHiCacheStorage",
         "interface_v1": True, "fluxon_config": fluxon_config}
    d.update(more)
    return d


class Controller:
    """The storage side of one rank's HiCacheController."""

    def __init__(self, backend, pool, group=None):
        self.backend, self.pool, self.group = backend, pool, group
        self.thread_errors: List[BaseException] = []

    def _min(self, v: int) -> int:
        if self.group is None:
            return v
        import torch.distributed as dist
        t = torch.tensor([v], dtype=torch.int)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def _on_thread(self, fn):
        """Runs fn on a thread of its own, as SGLang's daemon threads do; records what escapes."""
        box = {}

        def run():
            try:
                box["r"] = fn()
            except BaseException as e:  # noqa: BLE001 - what would kill SGLang's thread
                self.thread_errors.append(e)
                box["r"] = None
        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join()
        return box["r"]

    def backup(self, hashes: List[str], pages: List[int], prefix_keys: Optional[List[str]] = None) -> int:
        """Pages backed up (the backup thread stops at the first failed batch)."""
        ps = self.pool.page_size

        def run():
            done = 0
            prefix = list(prefix_keys or [])
            idx = page_indices(self.pool, pages)
            for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
                batch = hashes[i:i + STORAGE_BATCH_SIZE]
                hi = idx[i * ps:(i + len(batch)) * ps]
                info = HiCacheStorageExtraInfo(prefix_keys=list(prefix) if prefix else None)
                if not all(self.backend.batch_set_v1(batch, hi, info)):
                    break
                if prefix:
                    prefix += batch
                done += len(batch)
            return done
        return self._on_thread(run)

    def prefetch(self, hashes: List[str], pages: List[int]) -> int:
        """Pages restored into `pages` on every rank (hit query + MIN, I/O + MIN)."""
        ps = self.pool.page_size

        def query():
            hit = []
            for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
                batch = hashes[i:i + STORAGE_BATCH_SIZE]
                n = self.backend.batch_exists(batch, HiCacheStorageExtraInfo())
                hit += batch[:n]
                if n < len(batch):
                    break
            return len(hit)
        hit = self._on_thread(query)
        hit = self._min(hit if hit is not None else 0)

        def io():
            completed = 0
            idx = page_indices(self.pool, pages[:hit])
            for i in range(0, hit, STORAGE_BATCH_SIZE):
                batch = hashes[i:min(hit, i + STORAGE_BATCH_SIZE)]
                res = self.backend.batch_get_v1(batch, idx[i * ps:(i + len(batch)) * ps], HiCacheStorageExtraInfo())
                inc = 0
                for r in res:
                    if not r:
                        break
                    inc += 1
                completed += inc
                if inc != len(batch):
                    break
            return completed
        done = self._on_thread(io) if hit else 0
        return self._min(done if done is not None else 0)
