"""The KV page copies from Python: the CPU reference through a real KvClient plan, and the GPU
entry points failing cleanly where there is no GPU."""

import ctypes
import random
import subprocess

import pytest

import fluxon
from fluxon import kv


def buffers(layers, pages, chunk, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(layers):
        b = (ctypes.c_uint8 * (pages * chunk))(*[rng.randrange(256) for _ in range(pages * chunk)])
        out.append(b)
    return out


@pytest.mark.parametrize("layout", ["page_first", "layer_first", "mla"])
def test_backup_and_restore_through_a_kvclient_plan(layout):
    layers, page, item = 3, 4, 32
    chunk = page * item
    k = buffers(layers, 16, chunk, 1)
    v = buffers(layers, 16, chunk, 2)
    kp = [ctypes.addressof(b) for b in k]
    vp = None if layout == "mla" else [ctypes.addressof(b) for b in v]
    pages = [9, 2, 14, 5]
    vb = kv.value_bytes(layout, layers, page, item)
    with fluxon.KvClient() as c:
        keys = [f"kv-{layout}-{p}" for p in pages]
        plan = c.local_fast_put_start(keys, vb)
        kv.copy_pages_cpu("backup", plan, layout, layers, page, item, kp, vp, pages)
        c.local_fast_put_commit(plan).result(10)
        originals = [bytes(b) for b in k]
        for b in k:
            ctypes.memset(b, 0, len(b))
        h, r = c.get_start(keys)
        rp = c.get_transfer(h)
        import array
        kv.copy_pages_cpu("restore", rp, layout, layers, page, item, kp, vp, array.array("q", pages))
        c.release_views(rp)
        for layer in range(layers):
            for p in pages:
                assert bytes(k[layer])[p * chunk:(p + 1) * chunk] == originals[layer][p * chunk:(p + 1) * chunk]


def test_bad_arguments_raise():
    with pytest.raises(fluxon.InvalidArgument):
        kv.value_bytes("sideways", 1, 1, 1)
    with fluxon.KvClient() as c:
        plan = c.local_fast_put_start(["x"], 4096)
        with pytest.raises(fluxon.InvalidArgument):  # one base pointer per layer
            kv.copy_pages_cpu("backup", plan, "page_first", 2, 4, 32, [1], [1], [0])
        with pytest.raises(fluxon.InvalidArgument):  # two page indices for a plan of one value
            kv.copy_pages_cpu("backup", plan, "mla", 1, 4, 32, [1], None, [0, 1])
        c.put_abort(plan)


def test_gpu_copier_without_a_gpu_fails_cleanly():
    has_gpu = subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0
    if has_gpu or not kv.HAVE_CUDA:
        pytest.skip("a GPU is present or CUDA was not built: covered by tests/gpu")
    g = kv.GpuCopier()
    with pytest.raises(fluxon.Internal, match="CUDA"):
        g.write_pages_to_values(1, "mla", 1, 4, 32, [1], None, [0])


def test_auto_path_takes_the_copy_engines_from_64_kib_chunks():
    """path="auto" (the GpuCopier default): the measured rule — the copy engines for (page, layer,
    K|V) chunks of 64 KiB and more (they run beside the model's GEMMs without slowing them), the few-SM
    bulk-copy kernel below (the copy engines' per-chunk cost; the all-SM kernel slows the GEMM 3x)."""
    assert kv.choose_path(64, 1024) == "copy_engine"    # 64 tokens x 1 KiB: 64 KiB
    assert kv.choose_path(64, 1024 - 2) == "few_sm"
    assert kv.choose_path(16, 4096) == "copy_engine"
    assert kv.choose_path(64, 512) == "few_sm"          # 32 KiB
    import inspect
    for m in (kv.GpuCopier.write_pages_to_values, kv.GpuCopier.restore_pages_from_values):
        assert inspect.signature(m).parameters["path"].default == "auto"
