"""One SGLang generation, in a fresh interpreter: loads Fluxon through that tree's factory and
round-trips bytes the way that tree's controller calls the backend.

    python sglang_version_probe.py SGLANG_TREE CLIENT_CONFIG TAG

SGLANG_TREE is a folder holding an importable ``sglang`` package (a restated generation from
``sglang_versions/``, or SGLang's own files laid out by the test). Prints one JSON object last:
what ``fluxon.sglang`` took from SGLang, the storage keys of a few deployments, and the checks run.
Any failed check raises (the test reads the exit status and the traceback).
"""

import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE, CLIENT_CONFIG, TAG = sys.argv[1:4]
BUILD = Path(os.environ.get("FLUXON_BUILD_DIR", HERE.parents[1] / "build"))
sys.path[:0] = [TREE, str(HERE / "sglang_versions"), str(HERE), str(BUILD / "python")]

import torch  # noqa: E402

sg = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
factory = importlib.import_module("sglang.srt.mem_cache.storage.backend_factory").StorageBackendFactory
metrics = None
for name in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
    try:
        metrics = importlib.import_module(name)
        break
    except ImportError:
        pass
assert metrics is not None, "the tree declares no StorageMetrics"

import fluxon.sglang as fs  # noqa: E402
from sglang_harness import MHAHostPool, StateHostPool, fill_page, page_bytes, page_indices  # noqa: E402

checks = []


def check(what: str, ok: bool, detail="") -> None:
    if not ok:
        raise AssertionError(f"{what}: {detail}")
    checks.append(what)


check("SGLang importable", fs.HAVE_SGLANG)
check("the backend subclasses this tree's HiCacheStorage", issubclass(fs.FluxonHiCacheStorage, sg.HiCacheStorage))
check("StorageMetrics is this tree's", fs.StorageMetrics is metrics.StorageMetrics)
FIELDS = [f.name for f in dataclasses.fields(sg.HiCacheStorageConfig)]


def config(tp_rank=0, tp_size=1, mla=False, extra=None):
    """A config of this generation's fields only, as its cache controller fills them."""
    values = dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                  is_mla_model=mla, enable_storage_metrics=True, is_page_first_layout=True,
                  model_name="Qwen/Qwen3-8B", tp_lcm_size=None, should_split_heads=False, extra_config=extra)
    unknown = [n for n in FIELDS if n not in values]
    assert not unknown, f"a config field this probe does not know: {unknown}"
    return sg.HiCacheStorageConfig(**{n: values[n] for n in FIELDS})


def extra(**more):
    d = {"backend_name": "fluxon", "module_path": "fluxon.sglang", "class_name": "FluxonHiCacheStorage",
         "interface_v1": True, "fluxon_config": CLIENT_CONFIG, "extra_backend_tag": TAG}
    d.update(more)
    return d


def build(pool, ext=None, **kw):
    b = factory.create_backend("dynamic", config(extra=ext or extra(), **kw), pool)
    b.register_mem_pool_host(pool)  # what attach_storage_backend does next
    return b


pool = MHAHostPool("page_first", pages=32, page_size=16, layer_num=2, head_num=2, head_dim=32)
b = build(pool)
check("built through the factory", isinstance(b, fs.FluxonHiCacheStorage))

# v1: the backup thread writes two batches (the second carries the first as prefix_keys), the
# prefetch thread asks batch_exists, the I/O thread reads into other pages.
hashes = [f"{TAG}-p{i}" for i in range(10)]
want = [fill_page(pool, i, f"{TAG}/{i}") for i in range(10)]
r = b.batch_set_v1(hashes[:6], page_indices(pool, range(6)), sg.HiCacheStorageExtraInfo())
check("batch_set_v1 with the tree's default extra info", r == [True] * 6, r)
r = b.batch_set_v1(hashes[6:], page_indices(pool, range(6, 10)), sg.HiCacheStorageExtraInfo(prefix_keys=hashes[:6]))
check("batch_set_v1 with prefix_keys", r == [True] * 4, r)
n = b.batch_exists(hashes + [f"{TAG}-absent"], sg.HiCacheStorageExtraInfo())
check("batch_exists counts the leading hits", n == 10, n)
r = b.batch_get_v1(hashes, page_indices(pool, range(16, 26)), sg.HiCacheStorageExtraInfo())
check("batch_get_v1", r == [True] * 10, r)
check("batch_get_v1 lands the bytes", [page_bytes(pool, 16 + i) for i in range(10)] == want)

# The legacy tensor calls (SGLang's generic path).
value = torch.arange(256, dtype=torch.uint8)
check("set", b.set(f"{TAG}-flat", value) is True)
check("exists", b.exists(f"{TAG}-flat") and not b.exists(f"{TAG}-flat-absent"))
target = torch.zeros(256, dtype=torch.uint8)
got = b.get(f"{TAG}-flat", target)
check("get fills the target", got is not None and torch.equal(target, value))
check("batch_set", b.batch_set([f"{TAG}-f1", f"{TAG}-f2"], [value, value + 1]) is True)
got = b.batch_get([f"{TAG}-f1", f"{TAG}-f2", f"{TAG}-f3"])
check("batch_get", torch.equal(got[0], value) and torch.equal(got[1], value + 1) and got[2] is None, got)

stats = b.get_stats()
check("get_stats is this tree's StorageMetrics", isinstance(stats, metrics.StorageMetrics), type(stats))
check("get_stats counts the pages", sum(stats.backup_pgs) == 10 and sum(stats.prefetch_pgs) == 10,
      (stats.backup_pgs, stats.prefetch_pgs))

# v2 where the tree has it; where it has not, SGLang never calls it.
HAS_V2 = hasattr(sg, "PoolTransfer")
check("v2 in the base class exactly where the tree has pools", hasattr(sg.HiCacheStorage, "batch_get_v2") == HAS_V2)
if HAS_V2:
    state = StateHostPool(8, 64, 32)
    b.register_mem_host_pool_v2(state, sg.PoolName.MAMBA)
    fill_page(state, 1, f"{TAG}/s")
    state_bytes = page_bytes(state, 1)
    r = b.batch_set_v2([sg.PoolTransfer(sg.PoolName.MAMBA, page_indices(state, [1]), keys=hashes[9:10])])
    check("batch_set_v2", r == {sg.PoolName.MAMBA: [True]}, r)
    res = b.batch_exists_v2(hashes, [sg.PoolTransfer(sg.PoolName.MAMBA, keys=["w"],
                                                     hit_policy=sg.PoolHitPolicy.TRAILING_PAGES)])
    check("batch_exists_v2 is this tree's PoolTransferResult", isinstance(res, sg.PoolTransferResult), type(res))
    check("batch_exists_v2", res.kv_hit_pages == 10, res)
    r = b.batch_get_v2([sg.PoolTransfer(sg.PoolName.MAMBA, page_indices(state, [5]), keys=hashes[9:10])])
    check("batch_get_v2", r == {sg.PoolName.MAMBA: [True]} and page_bytes(state, 5) == state_bytes, r)

failures = b.fluxon_stats()["failures"]
check("no call failed inside the backend", not failures, failures)
b.close()

# The keys of a few deployments: the test compares them across generations.
keys = {}
for label, kw in {"tp0of1": {}, "tp1of2": dict(tp_rank=1, tp_size=2), "mla": dict(mla=True)}.items():
    k = build(MHAHostPool("page_first", pages=1, page_size=16, layer_num=2, head_num=2, head_dim=32),
              extra(extra_backend_tag="pin"), **kw)
    keys[label] = k.storage_keys(["h"])
    k.close()

print(json.dumps({"from_sglang": fs.FROM_SGLANG, "config_fields": FIELDS, "has_v2": HAS_V2, "keys": keys,
                  "checks": checks}))
