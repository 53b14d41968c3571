"""tools/real_kv.py, CPU variant: a real model's KV cache (the in-script Llama-style decoder where
transformers is absent) backed up through an owner daemon and restored with Fluxon's CPU reference
copies; the continuation from the restored KV must match the original bit for bit. And the same run
with one restored byte flipped must fail, naming the check."""

import importlib
import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, FLUXON_BIN, ROOT

pytest.importorskip("torch")

SCRIPT = ROOT / "tools" / "real_kv.py"
CHECKS = ["backup", "hit", "plan", "layout", "restored-bytes", "logits-bitexact", "logits-vs-recompute", "control",
          "removed"]


def run(*args):
    env = dict(os.environ, FLUXON_BUILD_DIR=str(BUILD), FLUXON_BIN=FLUXON_BIN,
               PYTHONPATH=os.pathsep.join(p for p in (str(BUILD / "python"), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--prefix-tokens", "128", "--json", *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def report(out):
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_real_kv_cpu_restores_the_cache_exactly():
    out = run()
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "real_kv: ALL CHECKS PASSED" in out.stdout
    for name in CHECKS:  # every check printed, once per layout
        assert out.stdout.count(f"[PASS] {name}:") == 2, name
    assert "[FAIL]" not in out.stdout
    rep = report(out)
    assert rep["ok"] and rep["device"] == "cpu"
    assert [(c["layout"], c["prefix_tokens"]) for c in rep["cases"]] == [("page_first", 128), ("layer_first", 128)]
    for c in rep["cases"]:
        assert c["ok"] and [x["name"] for x in c["checks"]] == CHECKS
        assert c["pages"] == 2 and c["kv_bytes"] == 2 * c["value_bytes"] > 0
        assert c["err_control"] > 0.1  # a wrong cache is far outside the tolerance
    try:
        importlib.import_module("transformers")
    except ImportError:  # the fallback model says what it is, and the MLA model is reported absent
        assert "in-script Llama-style GQA decoder" in out.stdout
        assert [a["model"] for a in rep["absent"]] == ["mla"]


def test_real_kv_cpu_fails_on_a_corrupted_restore():
    out = run("--corrupt-restore", "--layouts", "page_first")
    assert out.returncode != 0, out.stdout[-4000:]
    assert "[FAIL] restored-bytes:" in out.stdout
    assert "[FAIL] logits-bitexact:" in out.stdout
    assert "[PASS] backup:" in out.stdout and "[PASS] hit:" in out.stdout  # it got as far as the restore
    last = [line for line in out.stdout.splitlines() if line.startswith("real_kv: FAILED")]
    assert last and "restored-bytes" in last[0] and "logits-bitexact" in last[0]
    rep = report(out)
    assert not rep["ok"] and not rep["cases"][0]["ok"]
