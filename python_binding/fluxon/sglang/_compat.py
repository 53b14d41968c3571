"""The one import seam between Fluxon and SGLang, for every SGLang tree people run.

Each name is taken from the loaded SGLang on its own, and only a name that tree lacks is replaced
by Fluxon's restatement (``_restated.py``). So the backend subclasses SGLang's own
``HiCacheStorage`` whenever SGLang is importable — SGLang's factory checks
``issubclass(cls, HiCacheStorage)`` and its metrics collector asserts
``isinstance(stats, StorageMetrics)`` — whatever else that tree has. What came from where is in
``FROM_SGLANG``.

The generations (``tests/python/sglang_versions/`` restates each one's signatures):

- 2025-12 (``60d36e7be``): a config of six fields, v1 and the legacy calls, ``StorageMetrics`` in
  ``sglang.srt.metrics.collector``;
- 2026-02 (``64bca5315``): + ``pp_rank``, ``pp_size``;
- 2026-03 (``0986bed8e``): pool transfers and v2 (``PoolName``, ``PoolTransfer``, ...),
  ``tp_lcm_size`` / ``should_split_heads``, ``StorageMetrics`` in ``sglang.srt.observability``;
- recent main: + ``attn_cp_rank`` / ``attn_cp_size``, ``STORAGE_BATCH_SIZE``, ``SidecarPoolSpec``.

``rank_config`` reads a config of any generation with the meaning SGLang gave a missing field then:
no pp / cp / dp field is a single rank of each, no ``tp_lcm_size`` is no head split.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional

from . import _restated

_INTERFACE = "sglang.srt.mem_cache.hicache_storage"
# Where StorageMetrics lives, newest first.
_METRICS = ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector")


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_interface = None if os.environ.get("FLUXON_SGLANG_STANDIN") == "1" else _module(_INTERFACE)
HAVE_SGLANG = _interface is not None and hasattr(_interface, "HiCacheStorage")
if not HAVE_SGLANG:
    _interface = None

FROM_SGLANG: Dict[str, bool] = {}  # name -> taken from the loaded SGLang (else Fluxon's restatement)


def _pick(name: str, modules) -> Any:
    for m in modules:
        obj = getattr(m, name, None) if m is not None else None
        if obj is not None:
            FROM_SGLANG[name] = True
            return obj
    FROM_SGLANG[name] = False
    return getattr(_restated, name)


_here = (_interface,)
STORAGE_BATCH_SIZE = _pick("STORAGE_BATCH_SIZE", _here)
HiCacheStorage = _pick("HiCacheStorage", _here)
HiCacheStorageConfig = _pick("HiCacheStorageConfig", _here)
HiCacheStorageExtraInfo = _pick("HiCacheStorageExtraInfo", _here)
PoolName = _pick("PoolName", _here)
PoolHitPolicy = _pick("PoolHitPolicy", _here)
PoolTransfer = _pick("PoolTransfer", _here)
PoolTransferResult = _pick("PoolTransferResult", _here)
SidecarPoolSpec = _pick("SidecarPoolSpec", _here)
PrefetchTimeoutConfig = _pick("PrefetchTimeoutConfig", _here)
count_pool_hits = _pick("count_pool_hits", _here)
StorageMetrics = _pick("StorageMetrics", tuple(_module(m) for m in _METRICS) if HAVE_SGLANG else ())


def pool_transfer_result(kv_hit_pages: int, extra_pool_hit_pages: dict):
    """A PoolTransferResult of whichever SGLang tree is loaded (newer trees add optional fields)."""
    return PoolTransferResult(kv_hit_pages, extra_pool_hit_pages)


@dataclass(frozen=True)
class RankConfig:
    """What the backend reads of a ``HiCacheStorageConfig``, with every field an older SGLang lacks
    at the meaning SGLang gave it then."""

    tp_rank: int
    tp_size: int
    is_mla_model: bool
    model_name: Optional[str]
    pp_rank: int = 0             # before 2026-02: no pipeline-parallel storage, one stage
    pp_size: int = 1
    attn_cp_rank: int = 0        # before context parallelism reached the storage config: one rank
    attn_cp_size: int = 1
    dp_rank: int = 0             # attention DP: every DP rank computes the same bytes
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None   # before 2026-03: no head split
    should_split_heads: bool = False


def rank_config(cfg) -> RankConfig:
    """``cfg`` (a ``HiCacheStorageConfig`` of any generation, or a ``RankConfig``) read field by field."""
    if isinstance(cfg, RankConfig):
        return cfg

    def get(name: str, default):
        v = getattr(cfg, name, None)
        return default if v is None else v
    return RankConfig(tp_rank=int(cfg.tp_rank), tp_size=int(cfg.tp_size), is_mla_model=bool(cfg.is_mla_model),
                      model_name=cfg.model_name, pp_rank=int(get("pp_rank", 0)), pp_size=int(get("pp_size", 1)),
                      attn_cp_rank=int(get("attn_cp_rank", 0)), attn_cp_size=int(get("attn_cp_size", 1)),
                      dp_rank=int(get("dp_rank", 0)), dp_size=int(get("dp_size", 1)),
                      tp_lcm_size=getattr(cfg, "tp_lcm_size", None),
                      should_split_heads=bool(get("should_split_heads", False)))


def prefix_keys(extra_info) -> list:
    """SGLang's ``extra_info.prefix_keys`` as a list of page hashes. Trees before recent main
    default the field to ``(None,)`` (a tuple holding None), which means none."""
    keys = getattr(extra_info, "prefix_keys", None) if extra_info is not None else None
    if not keys:
        return []
    return [k for k in keys if isinstance(k, str)]
