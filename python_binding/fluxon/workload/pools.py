"""A rank's KV pools: the bounded "GPU" pool (L1, host memory here or real GPU memory with --gpu) and
split HiCache's host pool (its L2), both LRU over radix-node pages."""

from __future__ import annotations

import ctypes
import hashlib
from collections import OrderedDict

from .requests import lru_prefix


class GpuPool:
    """The bounded per-rank KV pool with a radix/LRU index: host memory standing in for the GPU, or
    (--gpu) real GPU memory, whose pages move to and from Fluxon values with the CUDA kernels
    (layout ``mla``, one layer: a page is ``page_tokens`` tokens of ``item_bytes``)."""

    def __init__(self, pages, page_bytes, page_tokens=0, item_bytes=0, gpu=False):
        self.page_bytes = page_bytes
        self.page_tokens, self.item_bytes = page_tokens, item_bytes
        self.gpu = gpu
        self.free = list(range(pages))
        self.index = OrderedDict()  # page hash -> (slot, backed)
        if gpu:
            import torch
            from fluxon.kv import GpuCopier
            self.torch = torch
            self.tensor = torch.zeros(pages * page_bytes, dtype=torch.uint8, device="cuda")
            self.base = self.tensor.data_ptr()
            self.copier = GpuCopier()
        else:
            self.buf = (ctypes.c_uint8 * (pages * page_bytes))()
            self.base = ctypes.addressof(self.buf)

    def backup(self, plan, slots):
        """Pool pages -> the plan's values (the backup kernel), complete on return."""
        if self.gpu:
            self.copier.write_pages_to_values(plan, "mla", 1, self.page_tokens, self.item_bytes, [self.base], [],
                                              list(slots))
            self.torch.cuda.synchronize()
        else:
            from fluxon import _fluxon
            _fluxon.plan_copy(plan, [self.slot_ptr(s) for s in slots], [self.page_bytes], len(slots), True)

    def restore(self, plan, slots):
        """The plan's values -> pool pages (the restore kernel), complete on return."""
        if self.gpu:
            self.copier.restore_pages_from_values(plan, "mla", 1, self.page_tokens, self.item_bytes, [self.base], [],
                                                  list(slots))
            self.torch.cuda.synchronize()
        else:
            from fluxon import _fluxon
            _fluxon.plan_copy(plan, [self.slot_ptr(s) for s in slots], [self.page_bytes], len(slots), False)

    def read(self, slot) -> bytes:
        if self.gpu:
            pb = self.page_bytes
            return self.tensor[slot * pb:(slot + 1) * pb].cpu().numpy().tobytes()
        return ctypes.string_at(self.slot_ptr(slot), self.page_bytes)

    def write(self, slot, data: bytes) -> None:
        if self.gpu:
            pb = self.page_bytes
            self.tensor[slot * pb:(slot + 1) * pb].copy_(self.torch.frombuffer(bytearray(data), dtype=self.torch.uint8))
        else:
            ctypes.memmove(self.slot_ptr(slot), data, self.page_bytes)

    def lookup_prefix(self, hashes):
        return lru_prefix(self.index, hashes)

    def slot_ptr(self, slot):
        return self.base + slot * self.page_bytes


class HostPool:
    """Split mode's L2 (``--mode split``): the rank's own host-memory pool, a plain LRU of pages, as
    HiCache's host pool is. Every rank of an instance runs the same operations on its own pool."""

    def __init__(self, pages, page_bytes):
        self.page_bytes = page_bytes
        self.buf = (ctypes.c_uint8 * max(1, pages * page_bytes))()
        self.base = ctypes.addressof(self.buf)
        self.free = list(range(pages))
        self.index = OrderedDict()  # page hash -> slot
        self.evicted = 0

    def lookup_prefix(self, hashes):
        return lru_prefix(self.index, hashes)

    def read(self, h) -> bytes:
        return ctypes.string_at(self.base + self.index[h] * self.page_bytes, self.page_bytes)

    def insert(self, h, data: bytes) -> None:
        if h in self.index:
            self.index.move_to_end(h)
            return
        if not self.free:
            if not self.index:
                return  # a pool of no pages
            self.free.append(self.index.popitem(last=False)[1])
            self.evicted += 1
        slot = self.free.pop()
        ctypes.memmove(self.base + slot * self.page_bytes, data, self.page_bytes)
        self.index[h] = slot


def expected_page(h: str, rank: int, size: int) -> bytes:
    seed = hashlib.sha256(bytes.fromhex(h) + bytes([rank])).digest()
    return (seed * (size // len(seed) + 1))[:size]
