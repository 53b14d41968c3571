"""Fluxon's PEP 517 build backend: CMake builds the native module (and the `fluxon` daemon CLI)
for the interpreter running the build; the wheel is assembled here (zip + METADATA + RECORD).

Needs what tools/install-deps.sh installs (cmake, ninja, a C++20 compiler, the Debian -dev
packages) and the running interpreter's headers. The build tree is `build/pip-<tag>` (or
$FLUXON_PIP_BUILD_DIR); ccache, when present, shares objects with `build/`.

Environment: FLUXON_JOBS, ninja's -j (default 2); FLUXON_CMAKE_ARGS, extra arguments appended to
the CMake configure command, split as a shell would (shlex), e.g. where the dependencies are not the
system's: FLUXON_CMAKE_ARGS="-Dpybind11_DIR=... -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"
(tools/gpu-workload.sh does this on the GPU machine, with a sysroot in CMAKE_PREFIX_PATH).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "fluxon"


def _version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise RuntimeError("pyproject.toml: no version")


def _tags():
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    abi = impl + getattr(sys, "abiflags", "")
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return impl, abi, plat


def _metadata() -> str:
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\n"
            "Summary: Fluxon: a distributed KV-cache store for LLM serving (SGLang HiCache storage)\n"
            "Requires-Python: >=3.10\n")


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    d = Path(metadata_directory) / f"{NAME}-{_version()}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text(_metadata())
    return d.name


def _build() -> Path:
    impl, abi, _ = _tags()
    # Beside build/, at the same depth: the compile commands then name the sources by the same
    # relative paths (CCACHE_BASEDIR), and ccache serves what build/ compiled (5 min -> seconds).
    build = Path(os.environ.get("FLUXON_PIP_BUILD_DIR", ROOT / f"build-pip-{abi}"))
    env = dict(os.environ)
    env.setdefault("CCACHE_BASEDIR", str(ROOT))  # objects shared with build/ (paths made relative)
    cfg = ["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
           f"-DPython_EXECUTABLE={sys.executable}", "-DFLUXON_TESTS=OFF"]
    cfg += shlex.split(os.environ.get("FLUXON_CMAKE_ARGS", ""))
    subprocess.run(cfg, check=True, env=env, stdout=sys.stderr)
    subprocess.run(["ninja", "-C", str(build), f"-j{os.environ.get('FLUXON_JOBS', '2')}", "fluxon_python", "fluxon"],
                   check=True, env=env, stdout=sys.stderr)
    return build


def _record_line(arc: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    build = _build()
    impl, abi, plat = _tags()
    version = _version()
    wheel = Path(wheel_directory) / f"{NAME}-{version}-{impl}-{abi}-{plat}.whl"
    pkg = build / "python" / NAME
    files = []
    for p in sorted(pkg.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            files.append((f"{NAME}/{p.relative_to(pkg).as_posix()}", p.read_bytes(), p.stat().st_mode))
    cli = build / "tools" / "fluxon"
    files.append((f"{NAME}/bin/fluxon", cli.read_bytes(), 0o755))
    info = f"{NAME}-{version}.dist-info"
    files.append((f"{info}/METADATA", _metadata().encode(), 0o644))
    files.append((f"{info}/WHEEL", (f"Wheel-Version: 1.0\nGenerator: fluxon_build\nRoot-Is-Purelib: false\n"
                                    f"Tag: {impl}-{abi}-{plat}\n").encode(), 0o644))
    files.append((f"{info}/entry_points.txt", b"[console_scripts]\nfluxon = fluxon.__main__:main\n", 0o644))
    record = [_record_line(a, d) for a, d, _ in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode(), 0o644))
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data, mode in files:
            zi = zipfile.ZipInfo(arc, date_time=(2026, 1, 1, 0, 0, 0))
            zi.external_attr = (mode & 0o777 | 0o100000) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return wheel.name


def build_sdist(sdist_directory, config_settings=None):
    version = _version()
    out = Path(sdist_directory) / f"{NAME}-{version}.tar.gz"
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files"], check=True, capture_output=True,
                             text=True).stdout.split()
    with tarfile.open(out, "w:gz") as t:
        for f in tracked:
            t.add(ROOT / f, arcname=f"{NAME}-{version}/{f}")
        pkg_info = tarfile.TarInfo(f"{NAME}-{version}/PKG-INFO")
        data = _metadata().encode()
        pkg_info.size = len(data)
        import io
        t.addfile(pkg_info, io.BytesIO(data))
    return out.name
