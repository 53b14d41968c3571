#!/usr/bin/env bash
# Installs the Debian packages Fluxon builds against (Debian 12). Idempotent and quiet when all
# are present. CUDA is used when nvcc is on the machine; nothing here installs it.
# --tests: also what the tests use beyond the build (headless Chromium reads the status page, a real
# Prometheus scrapes a cluster, tmux drives `fluxon top`).
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config ccache libcaf-dev flatbuffers-compiler libflatbuffers-dev
      libtbb-dev doctest-dev prometheus-cpp-dev libyaml-cpp-dev pybind11-dev python3-dev python3-pytest
      libibverbs-dev libssl-dev curl python3-torch python3-venv etcd-server clang-16 libfuzzer-16-dev libclang-rt-16-dev)
[ "${1:-}" = "--tests" ] && PKGS+=(chromium prometheus tmux)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
