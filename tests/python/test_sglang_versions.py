"""Fluxon in the SGLang trees people run, not only current main (issue 27).

Each generation of SGLang's storage interface (``sglang_versions/``: 2025-12 ``60d36e7be``, 2026-02
``64bca5315``, 2026-03 ``0986bed8e``, the first with pool transfers, and recent main ``8905cbd42``)
is loaded in a fresh interpreter; ``sglang_version_probe.py`` builds the backend through that
tree's factory against a real owner and round-trips bytes (v1, the legacy calls, v2 where the tree
has it, ``get_stats`` as that tree's ``StorageMetrics``). Where ``../shared/sglang-interfaces``
holds SGLang's own files of those commits, the same probe runs over them too: the restatements
are checked against the originals.
"""

import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
VERSIONS = HERE / "sglang_versions"
GENERATIONS = sorted(p.name for p in VERSIONS.iterdir() if p.is_dir() and p.name.startswith("g"))
ORIGINALS = HERE.parents[2] / "shared" / "sglang-interfaces"  # SGLang's own files, where present
OLD = GENERATIONS[:2]  # before pool transfers


def _probe(tree: Path, client_config: str) -> dict:
    tag = f"v{random.randrange(1 << 30)}"
    p = subprocess.run([sys.executable, str(HERE / "sglang_version_probe.py"), str(tree), client_config, tag],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    if p.returncode != 0:
        return {"error": p.stderr[-4000:] + p.stdout[-2000:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _run_all(trees: dict, client_config: str) -> dict:
    with ThreadPoolExecutor(2) as ex:
        futures = {g: ex.submit(_probe, t, client_config) for g, t in trees.items()}
        return {g: f.result() for g, f in futures.items()}


@pytest.fixture(scope="module")
def restated(shared_cluster):
    return _run_all({g: VERSIONS / g for g in GENERATIONS}, shared_cluster.client_config_file())


def _lay_out_originals(folder: Path, dest: Path) -> Path:
    """SGLang's own interface files of one commit as an importable tree; only their imports that
    need SGLang's runtime (a host-pool class, the environment registry) are empty stand-ins."""
    root = dest / folder.name
    mem = root / "sglang" / "srt" / "mem_cache"
    (mem / "storage").mkdir(parents=True)
    (root / "sglang" / "__init__.py").write_text("")
    (root / "sglang" / "srt" / "environ.py").write_text(
        "class _Var:\n    def get(self):\n        return None\n\n\n"
        "class _Envs:\n    def __getattr__(self, name):\n        return _Var()\n\n\nenvs = _Envs()\n")
    (mem / "memory_pool_host.py").write_text("class HostKVCache:\n    pass\n")
    (mem / "hicache_storage.py").write_text((folder / "hicache_storage.py").read_text())
    (mem / "storage" / "backend_factory.py").write_text((folder / "backend_factory.py").read_text())
    module = (folder / "STORAGE_METRICS_MODULE").read_text().strip()  # python/sglang/srt/...
    target = root / module.split("/", 1)[1]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("from dataclasses import dataclass, field\nfrom typing import List\n\n\n@dataclass\n"
                      + (folder / "StorageMetrics.py").read_text())
    return root


@pytest.fixture(scope="module")
def originals(shared_cluster, tmp_path_factory):
    if not ORIGINALS.is_dir():
        pytest.skip(f"SGLang's own interface files are not at {ORIGINALS}")
    dest = tmp_path_factory.mktemp("sglang-originals")
    trees = {}
    for g in GENERATIONS:
        commit = g.rsplit("_", 1)[1]
        folder = next(p for p in ORIGINALS.iterdir() if p.name.endswith(commit))
        trees[g] = _lay_out_originals(folder, dest)
    return _run_all(trees, shared_cluster.client_config_file())


def _ok(run: dict) -> dict:
    assert "error" not in run, run.get("error")
    return run


def test_the_four_generations_are_restated():
    assert [g.split("_", 3)[3] for g in GENERATIONS] == ["60d36e7be", "64bca5315", "0986bed8e", "8905cbd42"]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_loads_through_the_factory_and_round_trips_bytes(restated, generation):
    run = _ok(restated[generation])
    assert {"the backend subclasses this tree's HiCacheStorage", "batch_get_v1 lands the bytes", "batch_get",
            "get_stats is this tree's StorageMetrics", "no call failed inside the backend"} <= set(run["checks"])
    assert run["from_sglang"]["HiCacheStorage"] and run["from_sglang"]["HiCacheStorageConfig"]
    assert run["from_sglang"]["StorageMetrics"]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_sglangs_own_files_agree_with_the_restatement(originals, restated, generation):
    own, ours = _ok(originals[generation]), _ok(restated[generation])
    for k in ("from_sglang", "config_fields", "has_v2", "checks"):
        assert own[k] == ours[k], k


def test_each_missing_name_alone_falls_back_to_the_restatement(restated):
    """Trees before pool transfers lack PoolName & co.: only those are Fluxon's restatement."""
    for g in GENERATIONS:
        fs = _ok(restated[g])["from_sglang"]
        pools = g not in OLD
        assert fs["PoolName"] == fs["PoolTransfer"] == fs["PoolTransferResult"] == fs["PoolHitPolicy"] == pools, g
        assert fs["STORAGE_BATCH_SIZE"] == (g == GENERATIONS[-1]) == fs["SidecarPoolSpec"], g
        assert fs["HiCacheStorage"] and fs["HiCacheStorageExtraInfo"], g


def test_v2_only_where_sglang_has_it(restated):
    assert [_ok(restated[g])["has_v2"] for g in GENERATIONS] == [False, False, True, True]
    for g in GENERATIONS[2:]:
        assert "batch_get_v2" in restated[g]["checks"]


def test_keys_pin_the_bytes_on_every_generation(restated):
    """A deployment's keys are the same whichever SGLang generation runs it (a field a tree lacks
    reads as SGLang meant it: one pp / cp rank), and differ between ranks and with MLA."""
    keys = {g: _ok(restated[g])["keys"] for g in GENERATIONS}
    first = keys[GENERATIONS[0]]
    for g in GENERATIONS[1:]:
        assert keys[g] == first, g
    assert len({first["tp0of1"][0], first["tp1of2"][0], first["mla"][0]}) == 3


def test_config_fields_an_older_tree_lacks_read_as_sglang_meant_them():
    from fluxon.sglang import rank_config
    from fluxon.sglang._compat import prefix_keys

    class SixFields:  # 60d36e7be's HiCacheStorageConfig
        tp_rank, tp_size, is_mla_model, is_page_first_layout, model_name, extra_config = 1, 2, False, True, "m", {}
    r = rank_config(SixFields())
    assert (r.pp_rank, r.pp_size, r.attn_cp_rank, r.attn_cp_size, r.dp_rank, r.dp_size) == (0, 1, 0, 1, 0, 1)
    assert (r.tp_lcm_size, r.should_split_heads) == (None, False)
    assert (r.tp_rank, r.tp_size) == (1, 2)

    class Info:  # HiCacheStorageExtraInfo() before recent main: prefix_keys defaults to (None,)
        prefix_keys = (None,)
    assert prefix_keys(Info()) == [] and prefix_keys(None) == []
    Info.prefix_keys = ["a", "b"]
    assert prefix_keys(Info()) == ["a", "b"]
