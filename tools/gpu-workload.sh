#!/usr/bin/env bash
# The agent workload with each rank's KV pool in real GPU memory, on a machine with an NVIDIA GPU and
# PyTorch. Here (no GPU), after tools/build.sh:
#   tools/gpu-workload.sh --prepare .device-exp      # bundle the daemon, its libraries, our static libs
# then on the GPU machine, with .device-exp carried (the device tool):
#   tools/gpu-workload.sh .device-exp [workload args]
# It builds the Python module there (its Python differs from ours) from our static libraries, then
# runs `fluxon workload --gpu`: pages move between GPU memory and Fluxon values by the CUDA kernels.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --prepare ]]; then
  B=$2
  rm -rf "$B"
  ../shared/tools/device-bundle "$B" build/tools/fluxon >/dev/null
  mkdir -p "$B/a"
  for a in client/libfluxon_client.a actors/libfluxon_actors.a runtime/libfluxon_runtime.a \
           messages/libfluxon_messages.a cuda_kernels/libfluxon_kv.a cuda_kernels/libfluxon_kv_cuda.a; do
    strip --strip-debug -o "$B/a/$(basename $a)" "build/$a"
  done
  du -sh "$B"
  exit 0
fi
B=${1:-.device-exp}; shift || true
OUT=${OUT:-/tmp/fluxon-gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/$B/lib
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
CUDA=${CUDA_HOME:-/usr/local/cuda}
EXT=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
libs=$(ls $B/lib/*.so* | tr '\n' ' ')
g++ -O2 -shared -fPIC -std=c++20 -DFLUXON_HAVE_CUDA python_binding/src/module.cpp \
  -Iruntime/include -Iclient/include -Imessages/include -Icuda_kernels/include -I"$CUDA/include" \
  $(python3 -m pybind11 --includes) -o "python_binding/fluxon/_fluxon$EXT" \
  -Wl,--start-group $B/a/*.a -Wl,--end-group $libs -L"$CUDA/lib64" -lcudart_static -lrt -ldl -lpthread \
  2>&1 | tee "$OUT/build.log" | tail -5
export PYTHONPATH=$PWD/python_binding FLUXON_BIN=$PWD/$B/bin/fluxon
python3 -m fluxon.workload --gpu "$@" 2>&1 | tee "$OUT/workload.log"
exit ${PIPESTATUS[0]}
