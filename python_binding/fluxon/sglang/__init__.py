"""Fluxon as SGLang HiCache's storage backend.

Load it in SGLang with::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "fluxon",
        "module_path": "fluxon.sglang", "class_name": "FluxonHiCacheStorage",
        "interface_v1": true, "fluxon_config": "/etc/fluxon/client.yaml"}'

SGLang builds it as ``FluxonHiCacheStorage(storage_config, kwargs)`` with every setting in
``storage_config.extra_config``. See ``backend.py`` for what it guarantees SGLang's threads and
``keys.py`` for the storage keys.
"""

from ._compat import (FROM_SGLANG, HAVE_SGLANG, STORAGE_BATCH_SIZE, HiCacheStorage, HiCacheStorageConfig,
                      HiCacheStorageExtraInfo, PoolHitPolicy, PoolName, PoolTransfer, PoolTransferResult,
                      RankConfig, StorageMetrics, rank_config)
from .backend import FLUXON_KEYS, SGLANG_KEYS, FluxonHiCacheStorage
from .keys import storage_key

__all__ = ["FluxonHiCacheStorage", "HiCacheStorage", "HiCacheStorageConfig", "HiCacheStorageExtraInfo",
           "PoolHitPolicy", "PoolName", "PoolTransfer", "PoolTransferResult", "StorageMetrics", "HAVE_SGLANG",
           "FROM_SGLANG", "RankConfig", "rank_config",
           "STORAGE_BATCH_SIZE", "FLUXON_KEYS", "SGLANG_KEYS", "storage_key"]
