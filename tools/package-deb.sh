#!/usr/bin/env bash
# Builds the Debian package of this tree: build/package/fluxon_<version>_<arch>.deb (the CLI and
# daemons, the Python module for Debian's python3, systemd units, /etc/fluxon, example configs, docs).
# Install it with `apt install ./build/package/fluxon_*.deb`; see docs/operations.md.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${FLUXON_BUILD_DIR:-build}
[ -f "$BUILD/CPackConfig.cmake" ] || tools/build.sh
ninja -C "$BUILD" fluxon fluxon_python >/dev/null
(cd "$BUILD" && cpack -G DEB --config CPackConfig.cmake >/dev/null)
ls "$BUILD"/package/fluxon_*.deb
