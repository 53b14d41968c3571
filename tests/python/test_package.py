"""The Debian package (tools/package-deb.sh): built from this tree, installed with dpkg into a clean
root of its own (`dpkg --root`: an empty dpkg database, nothing of the host's), and run from the
installed files: `fluxon --version`, the embedded demo, and the Python module from dist-packages."""

import os
import shutil
import subprocess

import pytest

from conftest import BUILD, ROOT

VERSION = (ROOT / "python_binding" / "fluxon" / "__init__.py").read_text().split('__version__ = "')[1].split('"')[0]


@pytest.fixture(scope="module")
def deb():
    env = dict(os.environ, FLUXON_BUILD_DIR=str(BUILD))
    out = subprocess.run([str(ROOT / "tools" / "package-deb.sh")], capture_output=True, text=True, env=env,
                         timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    path = out.stdout.strip().splitlines()[-1]
    assert path.endswith(f"fluxon_{VERSION}_amd64.deb"), path
    return path


def dpkg_deb(*args):
    out = subprocess.run(["dpkg-deb", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_package_says_what_it_is_needs_and_holds(deb):
    control = dpkg_deb("-f", deb)
    fields = dict(l.split(": ", 1) for l in control.splitlines() if ": " in l and not l.startswith(" "))
    assert fields["Package"] == "fluxon" and fields["Version"] == VERSION and fields["Architecture"] == "amd64"
    depends = fields["Depends"]
    for lib in ("python3 (>= 3.11)", "libcaf-core0.17", "libcaf-io0.17", "libyaml-cpp0.7", "libssl3"):
        assert lib in depends, depends
    files = {l.split()[-1].lstrip(".") for l in dpkg_deb("-c", deb).splitlines()}
    for f in ("/usr/bin/fluxon", "/lib/systemd/system/fluxon-master.service",
              "/lib/systemd/system/fluxon-master@.service", "/lib/systemd/system/fluxon-owner@.service",
              "/etc/fluxon/fluxon.yaml", "/etc/fluxon/client.yaml",
              "/usr/lib/python3/dist-packages/fluxon/__init__.py",
              "/usr/lib/python3/dist-packages/fluxon/sglang/backend.py",
              "/usr/share/fluxon/configs/single-host.yaml", "/usr/share/fluxon/grafana/fluxon.json",
              "/usr/share/doc/fluxon/README.md", "/usr/share/doc/fluxon/operations.md"):
        assert f in files, f
    assert any(f.startswith("/usr/lib/python3/dist-packages/fluxon/_fluxon.cpython-") for f in files)
    # The configs under /etc are conffiles: an upgrade keeps a user's edits.
    assert "/etc/fluxon/fluxon.yaml" in dpkg_deb("-I", deb, "conffiles")


def test_installed_into_a_clean_root_the_cli_the_demo_and_the_python_module_run(deb, tmp_path):
    root = tmp_path / "root"
    try:
        (root / "var/lib/dpkg/info").mkdir(parents=True)
        (root / "var/lib/dpkg/updates").mkdir()
        (root / "var/lib/dpkg/status").write_text("")
        # The root has no libraries: its dependencies are the host's (--force-depends), as a chroot's
        # would be after apt installed them.
        out = subprocess.run(["dpkg", f"--root={root}", f"--log={root}/dpkg.log", "--force-depends", "-i", deb],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        status = subprocess.run(["dpkg", f"--root={root}", "-s", "fluxon"], capture_output=True, text=True).stdout
        assert "Status: install ok installed" in status and f"Version: {VERSION}" in status
        cli = root / "usr/bin/fluxon"
        assert subprocess.run([str(cli), "--version"], capture_output=True, text=True).stdout.strip() == \
            f"fluxon {VERSION}"
        demo = subprocess.run([str(cli), "demo"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert demo.returncode == 0 and "demo: ok" in demo.stdout, demo.stdout[-2000:] + demo.stderr[-2000:]
        # The systemd units start the installed binary on the installed config.
        unit = (root / "lib/systemd/system/fluxon-owner@.service").read_text()
        assert "ExecStart=/usr/bin/fluxon owner --config /etc/fluxon/fluxon.yaml --node-id %i" in unit
        cfg = subprocess.run([str(cli), "config", "check", str(root / "etc/fluxon/fluxon.yaml")],
                             capture_output=True, text=True, timeout=60)
        assert cfg.returncode == 0, cfg.stderr
        # Debian's Python imports the installed module (not this tree's) and stores and reads a page.
        site = root / "usr/lib/python3/dist-packages"
        code = ("import ctypes, fluxon\n"
                "assert fluxon.__file__.startswith(%r), fluxon.__file__\n"
                "c = fluxon.KvClient({'owners': [{'contribute_to_cluster_pool_size': {'dram': '64MiB'},"
                " 'local_reserve_grant_bytes': '16MiB'}]})\n"
                "p = c.local_fast_put_start(['k'], 4096)\n"
                "ctypes.memset(fluxon.plan_pointers(p)[0], 9, 4096)\n"
                "c.local_fast_put_commit(p).result(10)\n"
                "h, r = c.get_start(['k'])\n"
                "g = c.get_transfer(h)\n"
                "assert ctypes.string_at(fluxon.plan_pointers(g)[0], 4096) == bytes([9]) * 4096\n"
                "c.release_views(g); c.close(); print('ok', fluxon.__version__)\n") % str(site)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["PYTHONPATH"] = str(site)
        py = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, env=env, timeout=120,
                            cwd=tmp_path)
        assert py.returncode == 0 and py.stdout.strip() == f"ok {VERSION}", py.stdout + py.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)
