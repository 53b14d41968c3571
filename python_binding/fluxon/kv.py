"""KV page copies between a KV cache and Fluxon values through plan blobs.

Layouts (the byte contract with the SGLang side; see docs/gpu.md): ``page_first``
``[K|V][layer][token][item]``, ``layer_first`` ``[layer][K|V][token][item]``, ``mla``
``[layer][token][item]``; one value per page key, ``item`` bytes per token per layer.

``copy_pages_cpu`` is the reference (and the path of a machine without a GPU): ``k_ptrs`` /
``v_ptrs`` are host base addresses of per-layer buffers ``[token_slot][item]``. ``GpuCopier`` runs
the CUDA kernel on every SM (``path="sm"``), the copy engines (``path="copy_engine"``) or a kernel
on a few SMs (4 CTAs) moving chunks with Hopper's bulk copies (TMA) through shared memory
(``path="few_sm"``: leaves the other SMs to compute, without the copy engines' per-chunk cost; chunks
whose size or addresses are not multiples of 16 bytes go through a plain loop) on a stream, with
device base addresses; the values must be registered (``KvClient.register_segments_with_cuda``).
The default ``path="auto"`` picks per call (``choose_path``) and each call returns the path it used.
"""

from __future__ import annotations

from . import _fluxon

HAVE_CUDA = bool(_fluxon.HAVE_CUDA)


# path="auto": the copy engines for chunks of at least this many bytes, the few-SM bulk-copy kernel
# below. Measured on the H200 beside a saturating bf16 GEMM (docs/gpu.md): at 64 KiB the
# copy engines restore at 49 GB/s and back up at 45 GB/s with the GEMM unslowed; below, their per-chunk
# cost (under 5 GB/s at 16 KiB) rules them out, and the few-SM kernel (4 CTAs) restores 16 KiB pages at
# 42 GB/s and backs them up at 47 GB/s beside the GEMM (it slows by -3% / +10%), where the all-SM
# kernel keeps 42 GB/s but slows the GEMM 3x. Idle, the few-SM kernel matches the SM kernel (50 GB/s).
COPY_ENGINE_MIN_CHUNK = 64 << 10


def choose_path(page_size: int, item_bytes: int) -> str:
    """The path ``path="auto"`` takes for a layout's (page, layer, K|V) chunk of ``page_size *
    item_bytes`` contiguous bytes: ``"copy_engine"`` from COPY_ENGINE_MIN_CHUNK, else ``"few_sm"``."""
    return "copy_engine" if page_size * item_bytes >= COPY_ENGINE_MIN_CHUNK else "few_sm"


def value_bytes(layout: str, layer_num: int, page_size: int, item_bytes: int) -> int:
    return _fluxon.kv_value_bytes(layout, layer_num, page_size, item_bytes)


def copy_pages_cpu(direction: str, plan_ptr: int, layout: str, layer_num: int, page_size: int, item_bytes: int,
                   k_ptrs, v_ptrs, page_indices, layer: int = -1) -> None:
    """``direction``: ``"backup"`` (KV cache -> values) or ``"restore"`` (values -> KV cache)."""
    _fluxon.kv_copy_pages_cpu(direction, plan_ptr, layout, layer_num, page_size, item_bytes, k_ptrs, v_ptrs,
                              page_indices, layer)


class GpuCopier:
    """One per CUDA stream: keeps the device scratch for plan pointers and page indices."""

    def __init__(self):
        if not HAVE_CUDA:
            from .errors import Internal
            raise Internal("this build of Fluxon has no CUDA support (nvcc was not found at build time)")
        self._g = _fluxon._GpuCopier()

    def write_pages_to_values(self, plan_ptr, layout, layer_num, page_size, item_bytes, k_ptrs, v_ptrs,
                              page_indices, *, layer=-1, stream=0, path="auto") -> str:
        """Returns the path it used (``path="auto"``: ``choose_path``)."""
        used = choose_path(page_size, item_bytes) if path == "auto" else path
        self._g.copy("backup", plan_ptr, layout, layer_num, page_size, item_bytes, k_ptrs, v_ptrs, page_indices,
                     layer, stream, used)
        return used

    def restore_pages_from_values(self, plan_ptr, layout, layer_num, page_size, item_bytes, k_ptrs, v_ptrs,
                                  page_indices, *, layer=-1, stream=0, path="auto") -> str:
        """Returns the path it used (``path="auto"``: ``choose_path``)."""
        used = choose_path(page_size, item_bytes) if path == "auto" else path
        self._g.copy("restore", plan_ptr, layout, layer_num, page_size, item_bytes, k_ptrs, v_ptrs, page_indices,
                     layer, stream, used)
        return used
