"""The requests a run replays: the seeded agent trace (Requests) or a public trace (TraceRequests),
SGLang-style page hashes, and the model presets that size a page."""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict


PAGE_TOKENS_DEFAULT = 64


# KV bytes per token of real models (bf16): layers x KV heads x head dim x 2 (K and V) x 2 bytes, or
# for MLA layers x (the 512-wide latent + 64 rope dims) x 2 bytes. GQA/MHA heads are split across TP
# ranks; MLA's latent is whole on every rank.
MODEL_PRESETS = {
    "llama3-8b": {"name": "Llama-3-8B", "bytes_per_token": 32 * 8 * 128 * 2 * 2, "mla": False},
    "qwen3-32b": {"name": "Qwen3-32B", "bytes_per_token": 64 * 8 * 128 * 2 * 2, "mla": False},
    "deepseek-v3": {"name": "DeepSeek-V3 (MLA)", "bytes_per_token": 61 * (512 + 64) * 2, "mla": True},
}


BACKUP_BATCH_PAGES = 256  # pages per backup put at most (a radix node is never split)


SMALLEST_SLOT = 4096  # an owner's smallest slot: a page below it wastes the rest of its slot


def page_hash(prev: str, tokens) -> str:
    h = hashlib.sha256()
    if prev:
        h.update(bytes.fromhex(prev))
    for t in tokens:
        h.update(int(t).to_bytes(4, "little"))
    return h.hexdigest()


def pct(v, q):
    if not v:
        return 0.0
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


class Requests:
    """The request stream: identical on every rank (same seed)."""

    def __init__(self, a):
        rng = random.Random(a.seed)
        self.prompts = [[rng.randrange(1, 50000) for _ in range(a.system_tokens)] for _ in range(a.system_prompts)]
        self.sessions = []
        for s in range(a.sessions):
            self.sessions.append({"history": list(self.prompts[s % a.system_prompts]), "turn": 0,
                                  "inst": s % a.instances})
        self.rng = rng
        self.a = a

    def rounds(self):
        a = self.a
        for turn in range(a.turns):
            order = list(range(a.sessions))
            self.rng.shuffle(order)
            batch = []
            for s in order:
                sess = self.sessions[s]
                user = [self.rng.randrange(1, 50000) for _ in range(self.rng.randint(a.user_tokens // 2, a.user_tokens))]
                sess["history"] += user
                out = [self.rng.randrange(1, 50000) for _ in range(a.output_tokens)]
                if a.instances > 1 and turn > 0 and self.rng.random() < a.migrate:
                    sess["inst"] = (sess["inst"] + 1 + self.rng.randrange(a.instances - 1)) % a.instances
                batch.append((s, sess["inst"], list(sess["history"]), out, None))
                sess["history"] += out
            yield turn, batch

    def count(self, inst):
        """Requests instance `inst` serves in the whole run (for progress)."""
        a = self.a
        return a.sessions * a.turns // a.instances + (1 if inst < a.sessions * a.turns % a.instances else 0)


class TraceRequests:
    """A public trace's requests (fluxon/trace.py: Mooncake's format) as the ranks' request stream,
    replayed as given: each request's prompt is its blocks' tokens (block b's are a function of b, so
    requests that share leading blocks share those pages' hashes), its instance the router's choice
    (round-robin, or prefix-affine: by its first block), and requests are grouped into rounds of
    --round-ms of trace time (a round ends on every instance before the next begins)."""

    MAX_BLOCK_ID = (1 << 32) // 512 - 1  # block b's tokens are b * 512 + 1 .. b * 512 + 512: 32-bit ids

    def __init__(self, a):
        self.reqs = a.trace_requests  # loaded and checked once, by main()
        self.a = a

    @staticmethod
    def tokens(r):
        out = []
        for i, b in enumerate(r.hash_ids):
            base = b * 512 + 1
            out.extend(range(base, base + r.block_tokens(i)))
        return out

    def rounds(self):
        a, t0 = self.a, self.reqs[0].timestamp_ms
        batch, turn = [], 0
        for n, r in enumerate(self.reqs):
            k = (r.timestamp_ms - t0) // a.round_ms
            while k > turn:
                yield turn, batch
                batch, turn = [], turn + 1
            batch.append((n, self.instance(n, r), self.tokens(r), [], (r.timestamp_ms - t0) / 1000.0))
        yield turn, batch

    def instance(self, n, r):
        return (r.hash_ids[0] if self.a.router == "prefix" else n) % self.a.instances

    def count(self, inst):
        return sum(1 for n, r in enumerate(self.reqs) if self.instance(n, r) == inst)


def request_stream(a):
    """The ranks' request stream: the public trace given by --trace, or the seeded agent sessions."""
    return TraceRequests(a) if getattr(a, "trace", None) else Requests(a)


def lru_prefix(index: OrderedDict, hashes) -> int:
    """How many leading hashes an LRU index holds; each one found becomes the most recent."""
    n = 0
    while n < len(hashes) and hashes[n] in index:
        index.move_to_end(hashes[n])
        n += 1
    return n
