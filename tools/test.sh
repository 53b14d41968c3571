#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test (doctest units and
# simulation, then pytest: API in embedded and external mode, daemons, faults).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh --tests
tools/build.sh
BUILD=${FLUXON_BUILD_DIR:-build}
segments() { ls /dev/shm | grep '^fluxon\.' | sort || true; }
before=$(segments)
echo "== unit, core and simulation tests (doctest via ctest)"
(cd "$BUILD" && ctest --output-on-failure -j2 --timeout 300)
echo "== 500 whole-cluster simulation seeds, a child process each (more: tools/soak --seeds N --from S)"
tools/soak --seeds 500 --from 100000 --jobs 2
echo "== the decoders under libFuzzer (ASan + UBSan), 10 s each (longer: tools/fuzz.sh TARGET SECONDS)"
tools/fuzz.sh all 10
echo "== python and multi-process tests (pytest)"
FLUXON_BUILD_DIR="$PWD/$BUILD" /usr/bin/python3 -m pytest -q tests/python
echo "== the API, remote-get and daemon tests once more over CAF (the channel is the default above)"
FLUXON_TEST_CHANNEL=caf FLUXON_BUILD_DIR="$PWD/$BUILD" /usr/bin/python3 -m pytest -q \
  tests/python/test_api.py tests/python/test_remote.py tests/python/test_daemons.py
echo "== nothing left in /dev/shm"
for _ in $(seq 50); do  # guardians unlink a killed owner's segment within moments
  left=$(comm -13 <(echo "$before") <(segments) | grep . || true)
  [ -z "$left" ] && break
  sleep 0.2
done
if [ -n "$left" ]; then echo "the tests left segments in /dev/shm: $left"; exit 1; fi
echo "== all tests passed"
