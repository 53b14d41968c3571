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
  strip "$B/bin/fluxon"  # the debug build's symbols are most of its 50 MB: the carry limit is 64 MiB
  mkdir -p "$B/a"
  # Every static library the module links (the simulation's is for tests only).
  for a in build/{client,actors,runtime,messages,cuda_kernels}/libfluxon_*.a; do
    [[ $a == *libfluxon_sim.a ]] && continue
    strip --strip-debug -o "$B/a/$(basename $a)" "$a"
  done
  # Headers the module includes that the GPU machine lacks: the generated FlatBuffers schema and
  # the FlatBuffers library's own (header-only where the module uses it).
  mkdir -p "$B/include"
  cp build/messages/gen/fluxon_generated.h "$B/include/"
  cp -r /usr/include/flatbuffers "$B/include/"
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
  -Iruntime/include -Iclient/include -Imessages/include -Iactors/include -Icuda_kernels/include -I"$B/include" \
  -I"$CUDA/include" \
  $(python3 -m pybind11 --includes) -o "python_binding/fluxon/_fluxon$EXT" \
  -Wl,--start-group $B/a/*.a -Wl,--end-group $libs -L"$CUDA/lib64" -lcudart_static -lrt -ldl -lpthread \
  2>&1 | tee "$OUT/build.log" | tail -5
export PYTHONPATH=$PWD/python_binding FLUXON_BIN=$PWD/$B/bin/fluxon
python3 -m fluxon.workload --gpu "$@" 2>&1 | tee "$OUT/workload.log"
exit ${PIPESTATUS[0]}
