"""Fluxon as SGLang HiCache's storage backend.

Load it in SGLang with::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "fluxon",
        "module_path": "fluxon.sglang", "class_name": "FluxonHiCacheStorage",
        "interface_v1": true, "fluxon_config": "/path/to/client.yaml", "key_prefix": "sglang"}'

SGLang constructs it as ``FluxonHiCacheStorage(storage_config, kwargs)``. Keys follow the design:
``storage_key = key_prefix + ":" + logical_key`` with ``logical_key = page_hash + component suffix +
config suffix (model, ``_{tp_rank}_{tp_size}``, PP/CP when > 1) + extra_backend_tag``. For MLA only
TP rank 0 writes and every rank reads the same key. One Fluxon value holds one page: the page's
objects of ``mem_pool_host.get_page_buffer_meta`` (MHA: K then V; MLA: the latent) back to back.
Bytes move between SGLang's host pool and Fluxon values by one native call per batch.
"""

from __future__ import annotations

import threading
import time
from typing import Any, List, Optional

import fluxon
from fluxon import _fluxon

from ._compat import HAVE_SGLANG, HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo
from .admission import AdmissionConfig, admission_identity, admit

__all__ = ["FluxonHiCacheStorage", "HiCacheStorage", "HiCacheStorageConfig", "HiCacheStorageExtraInfo",
           "HAVE_SGLANG", "storage_key"]


def config_suffix(cfg: HiCacheStorageConfig) -> str:
    """The part of a key that pins the physical page layout: model, TP (not for MLA), PP, CP."""
    model = "-".join((cfg.model_name or "").split("/"))
    suffix = f"_{model}"
    if not cfg.is_mla_model:
        suffix += f"_{cfg.tp_rank}_{cfg.tp_size}"
    if getattr(cfg, "pp_size", 1) > 1:
        suffix += f"_{cfg.pp_size}_{cfg.pp_rank}"
    if getattr(cfg, "attn_cp_size", 1) > 1:
        suffix += f"_cp{cfg.attn_cp_rank}_{cfg.attn_cp_size}"
    return suffix


def storage_key(key_prefix: str, page_hash: str, cfg: HiCacheStorageConfig, component: Optional[str] = None,
                extra_backend_tag: Optional[str] = None) -> str:
    logical = page_hash
    if component and component not in ("__default__", "kv"):
        logical += f".{component}"
    logical += config_suffix(cfg)
    if extra_backend_tag:
        logical += f"_{extra_backend_tag}"
    return f"{key_prefix}:{logical}"


class FluxonHiCacheStorage(HiCacheStorage):
    """A HiCache storage backend over a Fluxon ``KvClient`` (interface v1, zero copy)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = dict(storage_config.extra_config or {})
        extra.update(kwargs or {})
        self.config = storage_config
        self.key_prefix = str(extra.get("key_prefix", "sglang"))
        self.extra_backend_tag = extra.get("extra_backend_tag")
        self.copy_threads = int(extra.get("copy_threads", 0))
        self.wait_timeout_s = float(extra.get("commit_timeout_s", 30.0))
        self.is_mla = bool(storage_config.is_mla_model)
        # MLA: every TP rank holds the same latent; only rank 0 writes it.
        self.writes = not (self.is_mla and storage_config.tp_rank != 0)
        # An existing KvClient may be shared (several pools or adapters in one process).
        shared = extra.get("client")
        self._owns_client = shared is None
        self.client = shared if shared is not None else fluxon.KvClient(extra.get("fluxon_config"))
        rt = dict(extra.get("replica_task") or {})
        self.admission = AdmissionConfig.from_dict(rt.get("admission")) if rt.get("enabled") else AdmissionConfig()
        self.mem_pool_host = None
        self._stats_lock = threading.Lock()
        self._stats = {"replica_admitted_pages": 0, "set_pages": 0, "set_bytes": 0, "set_exists": 0, "set_failed": 0, "get_pages": 0,
                       "get_bytes": 0, "get_misses": 0, "exists_calls": 0}

    # -- keys ---------------------------------------------------------------------------
    def _key(self, page_hash: str) -> str:
        return storage_key(self.key_prefix, page_hash, self.config, None, self.extra_backend_tag)

    def _keys(self, keys: List[str]) -> List[str]:
        return [self._key(k) for k in keys]

    def _replica_opts(self, skeys: List[str], extra_info) -> Optional["fluxon.PutOptionalArgs"]:
        if self.admission.policy == "none":
            return None
        scores = None
        if extra_info is not None and getattr(extra_info, "extra_info", None):
            scores = extra_info.extra_info.get("kv_scores")
        ids = [admission_identity(k, self.config.tp_rank, self.config.tp_size) for k in skeys]
        mask = admit(ids, self.admission, None, scores)
        self._count(replica_admitted_pages=sum(mask))
        return fluxon.PutOptionalArgs(make_replica_task=True, make_replica_task_mask=mask)

    def _count(self, **delta):
        with self._stats_lock:
            for k, v in delta.items():
                self._stats[k] += v

    # -- page geometry from the host pool ----------------------------------------------------
    def _page_meta(self, host_indices, pages: int):
        if self.mem_pool_host is None:
            raise fluxon.InvalidArgument("register_mem_pool_host was not called")
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        ptrs = list(ptrs)
        if pages == 0 or len(ptrs) % pages:
            raise fluxon.InvalidArgument(f"get_page_buffer_meta gave {len(ptrs)} objects for {pages} pages")
        per_page = len(ptrs) // pages
        if isinstance(sizes, int):
            sizes = [sizes] * per_page
        sizes = list(sizes)[:per_page]
        return ptrs, sizes, sum(sizes)

    # -- interface v1 -----------------------------------------------------------------------
    def batch_set_v1(self, keys: List[str], host_indices, extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        if not keys:
            return []
        if not self.writes:
            return [True] * len(keys)  # MLA: rank 0 writes the shared value
        ptrs, sizes, value_len = self._page_meta(host_indices, len(keys))
        per_page = len(sizes)
        results = [False] * len(keys)
        remaining = list(range(len(keys)))
        skeys = self._keys(keys)
        for _ in range(2):  # a second round after dropping keys that already exist
            try:
                batch_keys = [skeys[i] for i in remaining]
                plan = self.client.local_fast_put_start(batch_keys, value_len, self._replica_opts(batch_keys, extra_info))
            except fluxon.KeyConflict as e:
                exists = {remaining[i] for i, r in zip(e.indices, e.reasons) if r == "exists"}
                inflight = {remaining[i] for i, r in zip(e.indices, e.reasons) if r == "inflight"}
                for i in exists:
                    results[i] = True  # already stored: a duplicate write-back is a success
                self._count(set_exists=len(exists), set_failed=len(inflight))
                remaining = [i for i in remaining if i not in exists and i not in inflight]
                if not remaining:
                    return results
                continue
            except fluxon.Error:
                self._count(set_failed=len(remaining))
                return results
            sub = [ptrs[i * per_page + j] for i in remaining for j in range(per_page)] if len(remaining) != len(keys) else ptrs
            try:
                _fluxon.plan_copy(plan, sub, sizes, len(remaining), True, self.copy_threads)
            except fluxon.Error:
                self.client.put_abort(plan)
                raise
            fut = self.client.local_fast_put_commit(plan)
            try:
                fut.result(self.wait_timeout_s)
            except fluxon.Error:
                self._count(set_failed=len(remaining))
                return results
            for i in remaining:
                results[i] = True
            self._count(set_pages=len(remaining), set_bytes=len(remaining) * value_len)
            return results
        return results

    def batch_get_v1(self, keys: List[str], host_indices, extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        if not keys:
            return []
        ptrs, sizes, value_len = self._page_meta(host_indices, len(keys))
        handle, r = self.client.get_start(self._keys(keys))
        n = r.transferable_len
        if n == 0:
            self.client.cancel_get_transfer(handle)
            self._count(get_misses=len(keys))
            return [False] * len(keys)
        plan = self.client.get_transfer(handle)
        try:
            _fluxon.plan_copy(plan, ptrs[:n * len(sizes)], sizes, n, False, self.copy_threads)
        finally:
            self.client.release_views(plan)
        self._count(get_pages=n, get_bytes=n * value_len, get_misses=len(keys) - n)
        return [True] * n + [False] * (len(keys) - n)

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Pages of the contiguous hit prefix."""
        if not keys:
            return 0
        self._count(exists_calls=1)
        handle, r = self.client.get_start(self._keys(keys))
        self.client.cancel_get_transfer(handle)
        return r.transferable_len

    # -- legacy interface -------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        r = self.batch_get([key], [target_location] if target_location is not None else None,
                           [target_sizes] if target_sizes is not None else None)
        return r[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        """Legacy: with target locations (addresses) and sizes, fills them and returns per-key
        True/None; without, returns the values as bytes (or None)."""
        if not keys:
            return []
        handle, r = self.client.get_start(self._keys(keys))
        n = r.transferable_len
        if n == 0:
            self.client.cancel_get_transfer(handle)
            return [None] * len(keys)
        plan = self.client.get_transfer(handle)
        try:
            vptrs = fluxon.plan_pointers(plan)
            out: List[Any] = []
            import ctypes
            for i, k in enumerate(keys):
                if i >= n:
                    out.append(None)
                elif target_locations is not None:
                    size = int(target_sizes[i])
                    ctypes.memmove(int(target_locations[i]), vptrs[i], size)
                    out.append(True)
                else:
                    size = int(target_sizes[i]) if target_sizes is not None else None
                    out.append(ctypes.string_at(vptrs[i], size) if size is not None else None)
            return out
        finally:
            self.client.release_views(plan)

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value] if value is not None else None,
                              [target_location] if target_location is not None else None,
                              [target_sizes] if target_sizes is not None else None)

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Legacy: values as bytes-like objects, or (target_locations, target_sizes) addresses."""
        if not keys:
            return True
        if not self.writes:
            return True
        import ctypes
        if values is not None:
            blobs = [bytes(memoryview(v).cast("B")) for v in values]
        else:
            blobs = [ctypes.string_at(int(a), int(s)) for a, s in zip(target_locations, target_sizes)]
        ok = True
        # One put per distinct length: a plan's values share one value_len.
        by_len = {}
        for k, b in zip(keys, blobs):
            by_len.setdefault(len(b), []).append((k, b))
        for length, items in by_len.items():
            skeys = [self._key(k) for k, _ in items]
            try:
                plan = self.client.local_fast_put_start(skeys, length)
            except fluxon.KeyConflict as e:
                if any(r != "exists" for r in e.reasons) or len(e.indices) != len(items):
                    ok = False
                continue
            for addr, (_, b) in zip(fluxon.plan_pointers(plan), items):
                ctypes.memmove(addr, b, length)
            try:
                self.client.local_fast_put_commit(plan).result(self.wait_timeout_s)
            except fluxon.Error:
                ok = False
        return ok

    def clear(self) -> None:
        """Fluxon values are shared cluster state: clear() does not delete other workers' pages."""

    def get_stats(self):
        with self._stats_lock:
            s = dict(self._stats)
        s.update({f"fluxon_{k}": v for k, v in self.client.stats().items()})
        return s

    def close(self) -> None:
        if self._owns_client:
            self.client.close()
