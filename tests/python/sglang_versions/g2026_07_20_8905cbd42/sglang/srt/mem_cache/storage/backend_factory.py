"""The dynamic loader of sgl-project/sglang 8905cbd42 (its rule is the same at every commit restated
here: ../dynamic_loading.py, which the version tests put on sys.path)."""

from dynamic_loading import StorageBackendFactory  # noqa: F401
