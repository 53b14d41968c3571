#!/usr/bin/env bash
# The run command: installs what is missing, builds, starts a local cluster (master + 2 owners as
# daemons), runs the demo workload through an external client, then stops the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
tools/build.sh
BIN=${FLUXON_BUILD_DIR:-build}/tools/fluxon
trap '"$BIN" cluster down configs/local-cluster.yaml >/dev/null 2>&1 || true' EXIT
"$BIN" cluster up configs/local-cluster.yaml
"$BIN" cluster status configs/local-cluster.yaml
echo "== demo workload through an external client of owner 1"
"$BIN" demo --config configs/client-local-cluster.yaml
echo "== the same through the Python API"
PYTHONPATH=${FLUXON_BUILD_DIR:-build}/python /usr/bin/python3 tools/demo.py configs/client-local-cluster.yaml
"$BIN" cluster down configs/local-cluster.yaml
trap - EXIT
echo "== the multi-turn agent workload: 2 instances x 2 TP rank processes over a private cluster (L3 when sessions move)"
"$BIN" workload --sessions 32 --turns 6 --gpu-pages 384 --instances 2
