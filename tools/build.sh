#!/usr/bin/env bash
# Configures and builds Fluxon into ${FLUXON_BUILD_DIR:-build}.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${FLUXON_BUILD_DIR:-build}
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"  # objects shared with `pip install .` builds
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} "$@" >/dev/null
# FLUXON_TARGETS: only these (tools/run-demo.sh builds what the demo runs); all of them by default.
ninja -C "$BUILD" -j"${FLUXON_JOBS:-2}" ${FLUXON_TARGETS:-}
