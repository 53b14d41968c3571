"""The rule of SGLang's StorageBackendFactory for ``--hicache-storage-backend dynamic``, the same at
every commit restated here (``python/sglang/srt/mem_cache/storage/backend_factory.py``): the
extra config names ``backend_name``, ``module_path`` and ``class_name``; the class is imported,
must subclass the tree's own ``HiCacheStorage`` (else ``TypeError``), and is built as
``backend_class(storage_config, kwargs)``."""

import importlib


class StorageBackendFactory:
    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
        if backend_name != "dynamic" or storage_config.extra_config is None:
            raise ValueError(f"Unknown storage backend '{backend_name}'")
        ec = storage_config.extra_config
        for field in ("backend_name", "module_path", "class_name"):
            if field not in ec:
                raise ValueError(f"Missing required field '{field}' in backend config for 'dynamic' backend")
        backend_class = getattr(importlib.import_module(ec["module_path"]), ec["class_name"])
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError(f"Backend class {ec['class_name']} must inherit from HiCacheStorage")
        return backend_class(storage_config, kwargs)
