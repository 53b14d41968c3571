"""The multi-turn agent workload, shaped like SGLang's benchmark/hicache/bench_multiturn.py and the
design's runs ("96 sessions x 12 turns, concurrency 16", page size 64, TP=2).

Each TP rank is a process with a bounded "GPU" KV pool (host memory here) and a radix index of
SGLang-style page hash chains (SHA-256 over the previous hash and the page's token ids). Sessions
extend their own history; several share a system prompt. A request matches its prefix in L1 (the
rank's pool), restores what Fluxon has (L2: the local owner, L3: a remote owner) through the
hostless backend (get_start -> collective min -> common-prefix retry -> get_transfer -> commit gate
-> restore), recomputes the rest, and backs radix nodes up (write_through: at once; write_back: when
evicted). The ranks agree through a real collective between processes. Restored pages are checked
byte for byte against what compute would produce.

With --instances N there are N serving instances (each TP ranks attached to an owner of its own, as
on N GPU hosts) behind a router that keeps a session on its instance except, with odds --migrate
per turn, when it moves it to another one: the session's history is then in a remote owner (L3)
and is fetched over the data plane.

    PYTHONPATH=build/python python3 -m fluxon.workload --sessions 96 --turns 12 --concurrency 16

The package: requests (the traces), pools (a rank's L1 and split's L2), rank (the rank process),
bound (Belady's MIN), scrape (the owners' metrics), chaos (--chaos), run (one run, --compare),
report, cli (the arguments)."""

from .bound import min_bound_pct, trace_pages
from .cli import main
from .requests import MODEL_PRESETS, PAGE_TOKENS_DEFAULT, page_hash
from .run import Stopped, run_once
from .scrape import owner_slots

__all__ = ["main", "run_once", "Stopped", "trace_pages", "min_bound_pct", "owner_slots", "page_hash",
           "MODEL_PRESETS", "PAGE_TOKENS_DEFAULT"]
