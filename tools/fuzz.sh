#!/usr/bin/env bash
# Fuzzes one of Fluxon's decoders with libFuzzer (clang-16, ASan + UBSan) for a bounded time:
#   tools/fuzz.sh TARGET SECONDS      TARGET: owner_request master_request config channel_ring
#                                             data_request plan_blob, or all
# Builds tests/fuzz into build-fuzz/ (Debian's clang-16 and libfuzzer-16-dev; tools/install-deps.sh
# installs them), seeds each corpus with real messages (fuzz_seeds) and the repo's configs, and
# runs in a temporary corpus directory it removes afterwards. A crash leaves its input in
# build-fuzz/crashes/ and fails; fix it and keep the input in tests/fuzz/regressions/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${1:?usage: tools/fuzz.sh TARGET SECONDS}
SECS=${2:?usage: tools/fuzz.sh TARGET SECONDS}
ALL=(owner_request master_request config channel_ring data_request plan_blob)
[ "$TARGET" = all ] && TARGETS=("${ALL[@]}") || TARGETS=("$TARGET")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (one of: ${ALL[*]} all)" >&2; exit 2; }
done
B=build-fuzz
if [ ! -f $B/build.ninja ]; then
  LAUNCHER=()
  command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  CC=clang-16 CXX=clang++-16 cmake -S tests/fuzz -B $B -G Ninja -DCMAKE_BUILD_TYPE=Debug "${LAUNCHER[@]}" > /dev/null
fi
ninja -C $B > $B.log 2>&1 || { tail -40 $B.log >&2; echo "fuzz.sh: the fuzz build failed (above)" >&2; exit 1; }
rm -f $B.log
mkdir -p $B/crashes
WORK=$(mktemp -d /tmp/fluxon-fuzz.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
$B/fuzz_seeds "$WORK/seeds" >/dev/null
mkdir -p "$WORK/seeds/config"
cp configs/*.yaml "$WORK/seeds/config/"
for t in "${TARGETS[@]}"; do
  mkdir -p "$WORK/corpus-$t"
  # Inputs that once failed (tests/fuzz/regressions/TARGET) run first in every run.
  REGRESSIONS=()
  [ -d "tests/fuzz/regressions/$t" ] && REGRESSIONS=("$PWD/tests/fuzz/regressions/$t")
  # Real traffic recorded by tools/record-corpus.sh seeds the corpus too.
  [ -d "tests/fuzz/corpus/$t" ] && REGRESSIONS+=("$PWD/tests/fuzz/corpus/$t")
  # -rss_limit_mb: the owner target keeps one cluster for the whole run; UBSan and ASan abort on
  # the first report; -timeout: an input that takes seconds is a finding too.
  if ! (cd "$WORK" && UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$OLDPWD/tests/fuzz/ubsan.supp" \
        ASAN_OPTIONS=detect_leaks=0 ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-16/bin/llvm-symbolizer "$OLDPWD/$B/fuzz_$t" "corpus-$t" "seeds/$t" "${REGRESSIONS[@]}" \
        -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$OLDPWD/$B/crashes/$t-" > "$WORK/$t.log" 2>&1); then
    tail -40 "$WORK/$t.log" >&2
    echo "fuzz.sh: $t found a crash: $B/crashes/$t-*" >&2
    exit 1
  fi
  runs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$WORK/$t.log" | grep -o "[0-9]*$" || echo "?")
  cov=$(grep -o "cov: [0-9]*" "$WORK/$t.log" | tail -1 | grep -o "[0-9]*" || echo "?")
  echo "fuzz $t: $runs inputs in ${SECS} s, no crash (coverage $cov edges)"
done
