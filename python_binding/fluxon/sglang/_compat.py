"""The one import seam between Fluxon and SGLang.

When SGLang is importable, every name here is SGLang's own class (``HiCacheStorage`` and its
companions from ``sglang.srt.mem_cache.hicache_storage``, ``StorageMetrics`` from
``sglang.srt.observability.metrics_collector`` or, in older trees, ``sglang.srt.metrics.collector``):
SGLang's factory checks ``issubclass(cls, HiCacheStorage)`` and its metrics collector asserts
``isinstance(stats, StorageMetrics)``, so nothing else would do.

Otherwise the names are a restatement of the same signatures (checked against sgl-project/sglang
``hicache_storage.py`` at 001067ff and ``observability/metrics_collector.py`` at 44cedc2b): the
same fields in the same order, the ten leading fields of ``HiCacheStorageConfig`` without
defaults, the same enum values, the same abstract methods. Signatures only: no behaviour of
SGLang's is copied here beyond the base class's documented defaults.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

HAVE_SGLANG = False
if os.environ.get("FLUXON_SGLANG_STANDIN") != "1":
    try:  # pragma: no cover - exercised where SGLang is installed
        from sglang.srt.mem_cache.hicache_storage import (STORAGE_BATCH_SIZE, HiCacheStorage,  # noqa: F401
                                                          HiCacheStorageConfig, HiCacheStorageExtraInfo,
                                                          PoolHitPolicy, PoolName, PoolTransfer,
                                                          PoolTransferResult)
        try:
            from sglang.srt.observability.metrics_collector import StorageMetrics  # noqa: F401
        except ImportError:
            from sglang.srt.metrics.collector import StorageMetrics  # noqa: F401
        try:  # newer trees only
            from sglang.srt.mem_cache.hicache_storage import (PrefetchTimeoutConfig,  # noqa: F401
                                                              SidecarPoolSpec, count_pool_hits)
        except ImportError:
            pass
        HAVE_SGLANG = True
    except ImportError:
        HAVE_SGLANG = False

if not HAVE_SGLANG:
    STORAGE_BATCH_SIZE = 128

    @dataclass
    class HiCacheStorageConfig:
        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        dp_rank: int = 0
        dp_size: int = 1
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    @dataclass
    class HiCacheStorageExtraInfo:
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class PoolName(str, Enum):
        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DEEPSEEK_V4_C4 = "deepseek_v4_c4"
        DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
        DEEPSEEK_V4_C128 = "deepseek_v4_c128"
        DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
        DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
        DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
        DRAFT = "draft"
        DRAFT_INDEXER = "draft_indexer"
        DRAFT_SWA = "draft_swa"

        def __str__(self) -> str:
            return self.value

    class PoolHitPolicy(str, Enum):
        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"

    @dataclass
    class PoolTransfer:
        name: PoolName
        host_indices: Optional[Any] = None
        device_indices: Optional[Any] = None
        keys: Optional[List[str]] = None
        hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Optional[PoolName] = None

    @dataclass
    class SidecarPoolSpec:
        pool_name: PoolName
        indices_from_pool: PoolName
        hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES

    @dataclass
    class PoolTransferResult:
        kv_hit_pages: int
        extra_pool_hit_pages: dict

        @classmethod
        def empty(cls) -> "PoolTransferResult":
            return cls(0, {})

        def update_kv_hit_pages(self, kv_hit_pages: int) -> None:
            self.kv_hit_pages = max(self.kv_hit_pages, kv_hit_pages)

        def update_extra_pool_hit_pages(self, results: dict) -> None:
            self.extra_pool_hit_pages.update(results)

    def count_pool_hits(results: dict) -> dict:
        return {name: (rs.index(False) if False in rs else len(rs)) for name, rs in results.items()}

    @dataclass(frozen=True)
    class PrefetchTimeoutConfig:
        base: float = 2.0
        per_ki_token: float = 0.1
        max: float = 30.0

    @dataclass
    class StorageMetrics:
        prefetch_pgs: List[int] = field(default_factory=list)
        backup_pgs: List[int] = field(default_factory=list)
        prefetch_bandwidth: List[float] = field(default_factory=list)
        backup_bandwidth: List[float] = field(default_factory=list)

    class HiCacheStorage(ABC):
        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool, host_pool_name):
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                            extra_info: Optional[HiCacheStorageExtraInfo] = None) -> PoolTransferResult:
            raise NotImplementedError()

        def batch_get_v2(self, transfers: List[PoolTransfer],
                         extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
            raise NotImplementedError()

        def batch_set_v2(self, transfers: List[PoolTransfer],
                         extra_info: Optional[HiCacheStorageExtraInfo] = None) -> dict:
            raise NotImplementedError()

        def batch_get_v1(self, keys: List[str], host_indices: Any,
                         extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
            raise NotImplementedError()

        def batch_set_v1(self, keys: List[str], host_indices: Any,
                         extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
            raise NotImplementedError()

        @abstractmethod
        def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
            pass

        @abstractmethod
        def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                      target_sizes: Optional[Any] = None):
            pass

        @abstractmethod
        def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
                target_sizes: Optional[Any] = None) -> bool:
            pass

        @abstractmethod
        def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                      target_sizes: Optional[Any] = None) -> bool:
            pass

        @abstractmethod
        def exists(self, key: str) -> bool:
            pass

        def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
            for i in range(len(keys)):
                if not self.exists(keys[i]):
                    return i
            return len(keys)

        def clear(self) -> None:
            pass

        def get_stats(self):
            return None


def pool_transfer_result(kv_hit_pages: int, extra_pool_hit_pages: dict):
    """A PoolTransferResult of whichever SGLang tree is loaded (newer trees add optional fields)."""
    return PoolTransferResult(kv_hit_pages, extra_pool_hit_pages)
