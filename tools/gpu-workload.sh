#!/usr/bin/env bash
# The agent workload with each rank's KV pool in real GPU memory, on a machine with an NVIDIA GPU and
# PyTorch. Here (Debian 12, no GPU), after tools/build.sh:
#   tools/gpu-workload.sh --prepare .device-exp      # the daemon + a sysroot of our Debian build deps
# then on the GPU machine, with .device-exp carried (the device tool):
#   tools/gpu-workload.sh .device-exp [workload args]
# There (Ubuntu, its own Python, no network and none of our -dev packages) it builds and installs the
# Python package by the same `pip install .` as everywhere (tools/pybuild/fluxon_build.py: CMake),
# against DIR/sysroot: the Debian packages of SYSROOT_PKGS unpacked with `dpkg -x`. Then it runs
# `python3 -m fluxon.workload --gpu` with that package: pages move between GPU memory and Fluxon
# values by the CUDA kernels. FLUXON_GPU_REUSE=1 skips the install when the machine (still warm)
# holds the package a previous call installed from the same sources. Logs: $OUT/build.log,
# $OUT/workload.log. Afterwards, in the same shell
# setup (LD_LIBRARY_PATH=DIR/sysroot/usr/lib/x86_64-linux-gnu), `python3 tools/real_kv.py` imports
# the installed package too.
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=x86_64-linux-gnu
# What CMakeLists.txt finds (FlatBuffers + flatc, TBB, yaml-cpp, prometheus-cpp and what its config
# finds: civetweb, ZLIB, CURL; doctest, CAF, libibverbs through pkg-config) and the runtime packages
# of their libraries; pkg-config itself. The CMake configs check that every file they name exists,
# so the unused parts they name stay (libflatbuffers.a, prometheus push, TBB's allocator, civetweb).
SYSROOT_PKGS=(
  flatbuffers-compiler flatbuffers-compiler-dev libflatbuffers-dev libflatbuffers2
  libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5
  libyaml-cpp-dev libyaml-cpp0.7
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0
  libcivetweb-dev libcivetweb1 civetweb zlib1g-dev zlib1g libcurl4-openssl-dev libcurl4
  doctest-dev
  libcaf-dev libcaf-core0.17 libcaf-io0.17
  libibverbs-dev libibverbs1 libnl-3-dev libnl-3-200 libnl-route-3-dev libnl-route-3-200
  pkgconf pkgconf-bin libpkgconf3
)
# Libraries of the base system there (zlib) or needed only to be found (curl, for prometheus push):
# moved from usr/lib/$ARCH (on LD_LIBRARY_PATH there) to usr/lib, so they never shadow Ubuntu's.
BUILD_ONLY_LIBS='libz\.so|libcurl\.so'

if [[ ${1:-} == --prepare ]]; then
  B=$2
  [[ -x build/tools/fluxon ]] || { echo "gpu-workload: build/tools/fluxon missing: run tools/build.sh" >&2; exit 1; }
  rm -rf "$B"
  mkdir -p "$B/bin"
  # The daemon the workload starts (also the fallback when the pip-built CLI does not run there);
  # its libraries come from the sysroot. Stripped: the debug build's symbols are most of its 50 MB.
  strip -o "$B/bin/fluxon" build/tools/fluxon
  S=$B/sysroot
  debs=$(mktemp -d)
  trap 'rm -rf "$debs"' EXIT
  (cd "$debs" && apt-get -q -o APT::Sandbox::User="$(id -un)" download "${SYSROOT_PKGS[@]}" >/dev/null) ||
    { echo "gpu-workload: apt-get download failed (apt-get update?)" >&2; exit 1; }
  for d in "$debs"/*.deb; do dpkg -x "$d" "$S"; done
  # Debian 12 still ships some libraries in /lib (merged /usr on disk): one tree, usr/.
  if [[ -d $S/lib ]]; then cp -a "$S/lib/." "$S/usr/lib/" && rm -rf "$S/lib"; fi
  # Absolute links (libz.so -> /lib/...) made relative, into the sysroot.
  find "$S" -type l | while read -r l; do
    t=$(readlink "$l")
    [[ $t == /* ]] || continue
    t=${t#/}; [[ $t == lib/* ]] && t=usr/$t
    ln -sfn "$(realpath -ms --relative-to="$(dirname "$l")" "$S/$t")" "$l"
  done
  # What the build does not read: docs, man pages, config, static libraries no CMake config names
  # (libflatbuffers.a is flatbuffers::flatbuffers, which messages/ links), ibverbs' provider links.
  rm -rf "$S"/etc "$S"/usr/share/{doc,doc-base,man,lintian,bug,aclocal,bash-completion}
  find "$S/usr/lib" -name '*.a' ! -name libflatbuffers.a -delete
  find "$S" -xtype l -delete  # links into packages left out (libcaf_openssl.so, libmlx5.so, ...)
  mkdir -p "$S/usr/lib"
  find "$S/usr/lib/$ARCH" -maxdepth 1 | { grep -E "/($BUILD_ONLY_LIBS)" || true; } | xargs -r mv -t "$S/usr/lib/"
  # pkg-config files name /usr: relative to where they lie instead.
  for pc in "$S"/usr/lib/$ARCH/pkgconfig/*.pc "$S"/usr/share/pkgconfig/*.pc; do
    [[ -f $pc ]] || continue
    up=../../..; [[ $pc == */share/pkgconfig/* ]] && up=../..
    sed -i -E "s#^([A-Za-z_]+)=/usr(/|\$)#\\1=\${pcfiledir}/$up\\2#" "$pc"
  done
  # CMake configs that name the prefix /usr outright (doctest's): relative to where they lie.
  { grep -rl '^set(_IMPORT_PREFIX "/usr")' "$S/usr/lib" --include='*.cmake' || true; } | while read -r f; do
    up=$(realpath -ms --relative-to="$(dirname "$f")" "$S/usr")
    sed -i "s#^set(_IMPORT_PREFIX \"/usr\")#get_filename_component(_IMPORT_PREFIX \"\${CMAKE_CURRENT_LIST_DIR}/$up\" ABSOLUTE)#" "$f"
  done
  # Every library the daemon needs beyond the base system must be in the sysroot.
  skip='linux-vdso|ld-linux|/libc\.so|/libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|/libz\.so'
  for f in $(ldd build/tools/fluxon | awk '/=>/ && $3 ~ /^\// {print $3}' | grep -vE "$skip"); do
    [[ -e $S/usr/lib/$ARCH/$(basename "$f") ]] ||
      { echo "gpu-workload: $(basename "$f") (the daemon needs it) is not in the sysroot" >&2; exit 1; }
  done
  du -sh "$S"; du -sh "$B"
  exit 0
fi

B=${1:-.device-exp}; shift || true
[[ -d $B/sysroot/usr ]] || { echo "gpu-workload: $B/sysroot missing: run --prepare $B here first" >&2; exit 1; }
B=$(cd "$B" && pwd)
S=$B/sysroot/usr
OUT=${OUT:-/tmp/fluxon-gpu}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
CUDA=${CUDA_HOME:-/usr/local/cuda}
# The build: CMake finds our Debian dependencies in the sysroot (configs under lib/$ARCH/cmake,
# doctest's under lib/cmake), flatc and pkg-config on PATH, CUDA at $CUDA, pybind11 from pip.
export CMAKE_PREFIX_PATH=$S:$S/lib/$ARCH/cmake${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export PATH=$S/bin:$CUDA/bin:$PATH
export PKG_CONFIG_PATH=$S/lib/$ARCH/pkgconfig:$S/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$S/lib/$ARCH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUDACXX=$CUDA/bin/nvcc
# GCC 13 there no longer includes <cstdint> through other standard headers; Debian 12's headers
# (CAF 0.17 and the others, written against GCC 12) may rely on it.
FLUXON_CMAKE_ARGS="$(printf '%q ' "-Dpybind11_DIR=$(python3 -m pybind11 --cmakedir)" \
  -DCMAKE_CUDA_ARCHITECTURES=90 "-DCMAKE_CUDA_COMPILER=$CUDA/bin/nvcc" "-DCMAKE_CXX_FLAGS=-include cstdint")${FLUXON_CMAKE_ARGS:-}"
export FLUXON_CMAKE_ARGS FLUXON_JOBS=${FLUXON_JOBS:-16}
# python3 there is a venv's (its torch is not the base interpreter's): install into it. A Python
# marked externally managed would refuse; the machine is thrown away after the session.
export PIP_BREAK_SYSTEM_PACKAGES=1
echo "FLUXON_CMAKE_ARGS=$FLUXON_CMAKE_ARGS" >"$OUT/build.log"
# FLUXON_GPU_REUSE=1: a later call on the same (still warm) machine keeps the package the last one
# installed from this tree, when there is one (its stamp names the tree's python and C++ sources).
STAMP=$(find . \( -path ./.device-exp -o -path ./build -o -path ./.git \) -prune -o -type f \( -name '*.cpp' \
  -o -name '*.hpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' -o -name '*.fbs' -o -name '*.txt' \
  -o -name '*.toml' \) -print0 | sort -z | xargs -0 cat | sha1sum | cut -c1-16)
if [[ ${FLUXON_GPU_REUSE:-0} == 1 && -f /tmp/fluxon-gpu-installed && $(cat "/tmp/fluxon-gpu-installed") == "$STAMP" ]]; then
  echo "gpu-workload: reusing the package installed from this tree ($STAMP)"
else
  if ! python3 -m pip install . --no-build-isolation --no-deps --no-index --force-reinstall -v >>"$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    echo "gpu-workload: pip install failed: $OUT/build.log" >&2
    exit 1
  fi
  tail -2 "$OUT/build.log"
  echo "$STAMP" >"/tmp/fluxon-gpu-installed"
fi
# From outside the checkout: the installed package, not python_binding/.
RUN=$(mktemp -d /tmp/fluxon-gpu-run.XXXXXX)
cd "$RUN"
PKG=$(python3 -c "import fluxon, sys; print(fluxon.__file__)")
echo "fluxon: $PKG"
[[ $PKG != "$OLDPWD/python_binding/"* ]] || { echo "gpu-workload: imported python_binding/, not the install" >&2; exit 1; }
python3 -m fluxon --version
# The daemon: the CLI built with the package where it runs (usage: exit 2), else the bundled one.
CLI=$(dirname "$PKG")/bin/fluxon rc=0
[[ -x $CLI ]] && { "$CLI" >/dev/null 2>&1 || rc=$?; }
[[ -x $CLI && $rc == 2 ]] || CLI=$B/bin/fluxon
export FLUXON_BIN=$CLI
echo "FLUXON_BIN=$FLUXON_BIN"
python3 -m fluxon.workload --gpu "$@" 2>&1 | tee "$OUT/workload.log"
exit "${PIPESTATUS[0]}"
