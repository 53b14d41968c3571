#!/usr/bin/env bash
# Records real traffic into the fuzzers' seed corpus (tests/fuzz/corpus/TARGET): runs the agent
# workload (2 instances, a CPU owner, sessions moving between instances: local and remote gets,
# replica tasks, write-backs) with FLUXON_RECORD set, so that its daemons write the requests they
# receive, at most 16 of each message kind (runtime/recorder.hpp). Replaces the corpus; commit it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FLUXON_BUILD_DIR:-build}/tools/fluxon
[ -x "$BIN" ] || { echo "record-corpus.sh: build first (tools/build.sh)" >&2; exit 1; }
OUT=$(mktemp -d /tmp/fluxon-record.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
FLUXON_RECORD="$OUT" "$BIN" workload --sessions 24 --turns 6 --instances 2 --migrate 0.3 --remote-cache 1 >/dev/null
for t in owner_request master_request; do
  [ -d "$OUT/$t" ] || { echo "record-corpus.sh: nothing recorded for $t" >&2; exit 1; }
  rm -rf "tests/fuzz/corpus/$t"
  mkdir -p "tests/fuzz/corpus/$t"
  cp "$OUT/$t"/* "tests/fuzz/corpus/$t/"
  echo "$t: $(ls "tests/fuzz/corpus/$t" | wc -l) messages, $(du -sh "tests/fuzz/corpus/$t" | cut -f1)"
done
