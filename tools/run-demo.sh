#!/usr/bin/env bash
# The run command: installs what is missing, builds what the demo runs (the CLI and the Python
# module: tools/test.sh builds the rest), starts a local cluster (master + 2 owners as daemons),
# runs the demo through an external client and the Python API, stops the cluster, then runs the
# multi-turn agent workload over a private cluster. Ends with a short summary; every figure:
# FLUXON_DEMO_STATS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
since() { echo "$(( $(date +%s) - START )) s"; }
tools/install-deps.sh
echo "== building the CLI and the Python module into ${FLUXON_BUILD_DIR:-build}/ (tools/test.sh builds the tests)"
FLUXON_TARGETS="fluxon fluxon_python" tools/build.sh
echo "   built after $(since)"
BUILD=${FLUXON_BUILD_DIR:-build}
BIN=$BUILD/tools/fluxon
STATS=(); [ -n "${FLUXON_DEMO_STATS:-}" ] && STATS=(--stats)
LOGS=$BUILD/demo-logs  # this run's, replaced by the next
rm -rf "$LOGS" && mkdir -p "$LOGS"
trap '"$BIN" cluster down configs/local-cluster.yaml >/dev/null 2>&1 || true' EXIT
echo "== a local cluster: a master and 2 owners from configs/local-cluster.yaml (daemon logs: /tmp/fluxon-local/)"
"$BIN" cluster up configs/local-cluster.yaml
echo "== the demo through an external client of owner 1 (C++)"
"$BIN" demo --config configs/client-local-cluster.yaml "${STATS[@]}" | tee "$LOGS/demo.log"
echo "== the same through the Python API"
PYTHONPATH=$BUILD/python /usr/bin/python3 tools/demo.py configs/client-local-cluster.yaml "${STATS[@]}" \
  | tee "$LOGS/demo-python.log"
"$BIN" cluster down configs/local-cluster.yaml >/dev/null
trap - EXIT
echo "== the multi-turn agent workload: 2 instances x 2 TP rank processes over a private cluster"
echo "   (L3 when sessions move between instances; the full report: $LOGS/workload.log)"
"$BIN" workload --sessions 32 --turns 6 --gpu-pages 384 --instances 2 > "$LOGS/workload.log" 2>&1 || {
  tail -30 "$LOGS/workload.log"; echo "the workload failed: $LOGS/workload.log"; exit 1; }
total=$(grep '^total:' "$LOGS/workload.log")
verified=$(grep 'restored pages verified' "$LOGS/workload.log" | sed 's/^ *//; s/;.*//')
echo
echo "== summary ($(since) in all)"
echo "   demo (C++ and Python): $(cat "$LOGS"/demo*.log | grep -c 'demo: ok\|bytes verified: True') of 2 ok, every byte read back verified"
echo "   workload: ${total#total: }"
echo "   $verified"
echo "   logs: $LOGS (demo.log, demo-python.log, workload.log); daemon logs of the local cluster: /tmp/fluxon-local/"
