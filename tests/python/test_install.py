"""`pip install .` into a venv of another CPython (offline, --no-build-isolation): the native
module is built for that interpreter, `python -m fluxon --version` works there, the bundled CLI
starts a cluster, and SGLang's loader finds `fluxon.sglang` in that environment."""

import glob
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT, free_port


def other_cpython():
    """A CPython >= 3.10 that is not the one running the tests (SGLang lives in its own venv)."""
    me = os.path.realpath(sys.executable)
    cands = sorted(glob.glob("/root/.pyenv/versions/3.1[0-9]*/bin/python3"), reverse=True)
    cands += [shutil.which(f"python3.{m}") for m in range(13, 9, -1)]
    for c in cands:
        if not c or os.path.realpath(c) == me:
            continue
        out = subprocess.run([c, "-c", "import sys, venv; print(sys.version_info >= (3, 10))"], capture_output=True,
                             text=True)
        if out.stdout.strip() == "True":
            return c
    return sys.executable  # no other interpreter on this machine: a venv of this one


def test_pip_install_into_a_venv_of_another_python(tmp_path):
    py = other_cpython()
    venv = tmp_path / "venv"
    subprocess.run([py, "-m", "venv", str(venv)], check=True)
    vpy = str(venv / "bin" / "python")
    r = subprocess.run([vpy, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--quiet", str(ROOT)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    v = subprocess.run([vpy, "-m", "fluxon", "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert v.returncode == 0 and v.stdout.startswith("fluxon 0.2.0"), v.stdout + v.stderr
    assert str(venv) in v.stdout  # the native module of that environment, not the build tree's

    # The README's steps in that environment: the daemons from the bundled CLI, SGLang's loader.
    mport, oport = free_port(), free_port()
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(textwrap.dedent(f"""\
        cluster_name: inst{oport}
        run_dir: {tmp_path}/run
        master: {{port: {mport}, metrics_port: 0}}
        owners:
          - {{node_id: 1, port: {oport}, metrics_port: 0, contribute_to_cluster_pool_size: {{dram: 64MiB}},
             local_reserve_grant_bytes: 16MiB}}
        """))
    client = tmp_path / "client.yaml"
    client.write_text(f"cluster_name: inst{oport}\nclient: {{owner_address: 127.0.0.1:{oport}}}\n")
    up = subprocess.run([vpy, "-m", "fluxon", "cluster", "up", str(cfg)], capture_output=True, text=True)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        script = textwrap.dedent(f"""\
            import importlib, ctypes
            from fluxon.sglang import HiCacheStorage, HiCacheStorageConfig, StorageMetrics
            cls = getattr(importlib.import_module("fluxon.sglang"), "FluxonHiCacheStorage")
            assert issubclass(cls, HiCacheStorage)
            extra = {{"backend_name": "fluxon", "module_path": "fluxon.sglang", "class_name": "FluxonHiCacheStorage",
                     "interface_v1": True, "fluxon_config": "{client}"}}
            cfg = HiCacheStorageConfig(0, 1, 0, 1, 0, 1, False, False, True, "m", extra_config=extra)
            b = cls(cfg, {{}})
            assert b.batch_exists(["x"]) == 0 and isinstance(b.get_stats(), StorageMetrics)
            c = b.client
            plan = c.local_fast_put_start(["k"], 4096)
            ctypes.memset(__import__("fluxon").plan_pointers(plan)[0], 7, 4096)
            c.local_fast_put_commit(plan).result(5)
            assert c.exists_prefix(["k"]).prefix_len == 1
            b.close()
            print("ok")
            """)
        run = subprocess.run([vpy, "-c", script], capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
    finally:
        subprocess.run([vpy, "-m", "fluxon", "cluster", "down", str(cfg)], capture_output=True, text=True)


def test_every_entry_point_says_one_version():
    """`fluxon --version`, the Python package and pyproject.toml name the same release (CMake's
    project version is where the binary's comes from)."""
    import re
    import tomllib
    from conftest import FLUXON_BIN
    import fluxon
    out = subprocess.run([FLUXON_BIN, "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    cmake = re.search(r"project\(fluxon [^)]*VERSION ([0-9.]+)\)", (ROOT / "CMakeLists.txt").read_text()).group(1)
    assert out.stdout.strip() == f"fluxon {fluxon.__version__}" == f"fluxon {py}" == f"fluxon {cmake}"
