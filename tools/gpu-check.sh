#!/usr/bin/env bash
# GPU tests and benchmarks of the KV kernels on a machine with an NVIDIA GPU. Here (no GPU):
#   tools/build.sh && ../shared/tools/device-bundle .device build/tests/fluxon_gpu_tests build/tools/fluxon_kv_bench
# then run this script on the GPU machine with .device carried (the device tool), logs in $OUT.
set -uo pipefail
B=${1:-.device}
OUT=${OUT:-/tmp/fluxon-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$B/lib
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
echo "== GPU tests"
$B/bin/fluxon_gpu_tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -20
rc=${PIPESTATUS[0]}
echo "== KV copy benchmark"
$B/bin/fluxon_kv_bench 2>&1 | tee "$OUT/kv_bench.log"
exit $rc
