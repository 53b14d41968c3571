"""`fluxon replay TRACE.jsonl [ARGS]` (also `python -m fluxon.replay`): a public trace replayed
through a local cluster - the workload with `--trace TRACE` (fluxon/workload.py takes every other
argument: --max-requests, --router, --instances, --tp, --compare, --capacity, --json, ...). Its
defaults differ from the workload's where a replay needs them: two instances (--instances 2) and a
modelled prefill of 100,000 tokens/s per rank (--prefill-tok-s), so TTFT means something."""

import sys

from fluxon.workload import main as workload_main


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print("usage: fluxon replay TRACE.jsonl [workload arguments] (e.g. traces/mooncake_fast25_conversation.jsonl "
              "--max-requests 300 --instances 2)", file=sys.stderr)
        return 2
    # The replay's defaults first: the user's own flags come later and win.
    return workload_main(["--trace", argv[0], "--instances", "2", "--prefill-tok-s", "100000", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
