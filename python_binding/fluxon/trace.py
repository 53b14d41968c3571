"""Public request traces in the Mooncake FAST'25 format (`../shared/traces/README.md` of the
project's shared files): one JSON object a line, `timestamp` (ms from the trace's start),
`input_length` and `output_length` (tokens) and `hash_ids` (the prompt as 512-token blocks; two
requests that share leading ids share that prefix's KV cache).

A trace is read whole and checked before anything starts: a line that is not JSON, a missing or
mistyped field, a negative length, timestamps that go back, or blocks that do not cover
`input_length` exactly (ceil(input_length / 512) ids) are refused with the line number and the
field. Nothing is filtered: a trace that loads is replayed as given.
"""

import json
from dataclasses import dataclass
from typing import List, Optional

BLOCK_TOKENS = 512  # the format's block: every hash id stands for 512 prompt tokens (the last may be partial)


class TraceError(ValueError):
    """A trace that cannot be replayed: the message names the file, the line and the field."""


@dataclass(frozen=True)
class TraceRequest:
    line: int             # its line in the file (1-based)
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple

    def block_tokens(self, i: int) -> int:
        """Prompt tokens of block i (the last one holds what is left of input_length)."""
        if i < len(self.hash_ids) - 1:
            return BLOCK_TOKENS
        return self.input_length - BLOCK_TOKENS * (len(self.hash_ids) - 1)


def _int_field(obj: dict, name: str, where: str, minimum: int) -> int:
    if name not in obj:
        raise TraceError(f"{where}: field '{name}' is missing")
    v = obj[name]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{where}: field '{name}' must be an integer, not {json.dumps(v)[:40]}")
    if v < minimum:
        raise TraceError(f"{where}: field '{name}' must be at least {minimum}, not {v}")
    return v


def load_trace(path, max_requests: Optional[int] = None) -> List[TraceRequest]:
    """The trace's requests in file order (the first max_requests of them), every line checked."""
    if max_requests is not None and max_requests <= 0:
        raise TraceError(f"max_requests must be positive, not {max_requests}")
    out: List[TraceRequest] = []
    last_ts = 0
    with open(path, "r", encoding="utf-8") as f:
        for lineno, text in enumerate(f, 1):
            if max_requests is not None and len(out) >= max_requests:
                break
            where = f"{path}:{lineno}"
            if not text.strip():
                raise TraceError(f"{where}: an empty line (one JSON object a line)")
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise TraceError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{where}: expected a JSON object, not {type(obj).__name__}")
            ts = _int_field(obj, "timestamp", where, 0)
            if ts < last_ts:
                raise TraceError(f"{where}: field 'timestamp' goes back in time ({ts} after {last_ts})")
            inp = _int_field(obj, "input_length", where, 1)
            outp = _int_field(obj, "output_length", where, 0)
            if "hash_ids" not in obj:
                raise TraceError(f"{where}: field 'hash_ids' is missing")
            ids = obj["hash_ids"]
            if not isinstance(ids, list) or any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in ids):
                raise TraceError(f"{where}: field 'hash_ids' must be a list of non-negative integers")
            need = -(-inp // BLOCK_TOKENS)
            if len(ids) != need:
                raise TraceError(f"{where}: field 'hash_ids' has {len(ids)} blocks for input_length {inp} "
                                 f"(expected {need}: one per {BLOCK_TOKENS} tokens)")
            out.append(TraceRequest(lineno, ts, inp, outp, tuple(ids)))
            last_ts = ts
    if not out:
        raise TraceError(f"{path}: no requests")
    return out


def prefix_ceiling(requests: List[TraceRequest]) -> dict:
    """What an infinite prefix cache finds on exactly these requests, in order: each request's
    leading blocks seen before (in any earlier request). Block references and prompt tokens both."""
    seen = set()
    refs = hit_refs = tokens = hit_tokens = 0
    for r in requests:
        n = 0
        while n < len(r.hash_ids) and r.hash_ids[n] in seen:
            n += 1
        refs += len(r.hash_ids)
        hit_refs += n
        tokens += r.input_length
        hit_tokens += sum(r.block_tokens(i) for i in range(n))
        seen.update(r.hash_ids)
    return {"requests": len(requests), "block_refs": refs, "distinct_blocks": len(seen),
            "ceiling_refs_pct": 100.0 * hit_refs / max(1, refs),
            "ceiling_tokens_pct": 100.0 * hit_tokens / max(1, tokens)}
