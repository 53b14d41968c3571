#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test (doctest units and
# simulation, then pytest: API in embedded and external mode, daemons, faults).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
BUILD=${FLUXON_BUILD_DIR:-build}
echo "== unit, core and simulation tests (doctest via ctest)"
(cd "$BUILD" && ctest --output-on-failure -j2 --timeout 300)
echo "== the decoders under libFuzzer (ASan + UBSan), 10 s each (longer: tools/fuzz.sh TARGET SECONDS)"
tools/fuzz.sh all 10
echo "== python and multi-process tests (pytest)"
FLUXON_BUILD_DIR="$PWD/$BUILD" /usr/bin/python3 -m pytest -q tests/python
echo "== the API, remote-get and daemon tests once more over CAF (the channel is the default above)"
FLUXON_TEST_CHANNEL=caf FLUXON_BUILD_DIR="$PWD/$BUILD" /usr/bin/python3 -m pytest -q \
  tests/python/test_api.py tests/python/test_remote.py tests/python/test_daemons.py
echo "== all tests passed"
