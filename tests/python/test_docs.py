"""The docs cannot drift from the code: every block marked `<!-- runnable ... -->` in README.md and
docs/*.md runs as a reader would run it (shell blocks with `fluxon` and `python` on the PATH, Python
blocks with Debian's python3, each in an empty directory of its own), every relative link resolves
inside the repository, and every example config the CLI carries is the file in configs/."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BUILD, FLUXON_BIN, ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^<!-- runnable[^>]*-->\n```(sh|python)\n(.*?)^```", re.M | re.S)


def runnable_blocks():
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text[: m.start()].count("\n") + 2
            out.append(pytest.param(m.group(1), m.group(2), id=f"{doc.relative_to(ROOT)}:{line}"))
    return out


BLOCKS = runnable_blocks()


def test_the_docs_mark_their_examples_runnable():
    # The README's Python lines and quick start, the API page's example at least.
    where = {b.id.split(":")[0] for b in BLOCKS}
    assert {"README.md", "docs/api.md"} <= where and len(BLOCKS) >= 4, [b.id for b in BLOCKS]


@pytest.mark.parametrize("lang,code", BLOCKS)
def test_runnable_block(lang, code, tmp_path):
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "fluxon").write_text(f"#!/bin/sh\nexec {FLUXON_BIN} \"$@\"\n")
    (shims / "python").write_text("#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n")
    for s in shims.iterdir():
        s.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{shims}:{os.environ['PATH']}", PYTHONPATH=str(BUILD / "python"))
    cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else ["/usr/bin/python3", "-c", code]
    run_dirs_before = set(Path("/tmp").glob("fluxon-*"))  # a config without run_dir uses /tmp/fluxon-<name>
    try:
        out = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"exit {out.returncode}\n--- stdout\n{out.stdout[-3000:]}\n--- stderr\n{out.stderr[-3000:]}"
    finally:
        # A block that started daemons leaves them to the reader: stopped here.
        for cfg in work.glob("*.yaml"):
            subprocess.run([FLUXON_BIN, "cluster", "down", str(cfg)], capture_output=True, timeout=60)
        for d in set(Path("/tmp").glob("fluxon-*")) - run_dirs_before:  # their logs and pid files
            shutil.rmtree(d, ignore_errors=True)


def test_every_relative_link_resolves_inside_the_repository():
    bad = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists() or ROOT.resolve() not in path.parents:
                bad.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not bad, bad


def test_every_example_config_the_cli_carries_is_the_file_and_is_valid():
    listing = subprocess.run([FLUXON_BIN, "config", "example"], capture_output=True, text=True, timeout=30)
    assert listing.returncode == 0
    names = [l.split()[0] for l in listing.stdout.splitlines()]
    files = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
    assert names == files
    for name in names:
        text = subprocess.run([FLUXON_BIN, "config", "example", name], capture_output=True, text=True, timeout=30).stdout
        assert text == (ROOT / "configs" / f"{name}.yaml").read_text(), name
    bad = subprocess.run([FLUXON_BIN, "config", "example", "nope"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "no example named 'nope' (there are: bench," in bad.stderr
