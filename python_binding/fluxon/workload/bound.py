"""Belady's MIN and the infinite-cache ceiling over exactly the pages a run references."""

from __future__ import annotations


from .requests import page_hash, request_stream


def trace_pages(a):
    """The seeded trace as one rank reads it: each request's full pages in order (every rank's
    sequence is this one under its own keys), and the tokens of all requests."""
    pages, tokens_total = [], 0
    pt = a.page_tokens
    for _turn, batch in request_stream(a).rounds():
        for _sid, _inst, tokens, _out, _arrival in batch:
            prev, req = "", []
            for p in range(len(tokens) // pt):
                prev = page_hash(prev, tokens[p * pt:(p + 1) * pt])
                req.append(prev)
            pages.append(req)
            tokens_total += len(tokens)
    return pages, tokens_total


def min_bound_pct(pages, tokens_total: int, page_tokens: int, capacity_pages: int) -> float:
    """Belady's MIN over the trace's page reads with `capacity_pages` per rank (L1 + L2 + L3 as one
    cache): the % of tokens that any cache of that size could find, as the report counts hits. Every
    read is counted, not only a request's leading run (a restore stops at the first miss), so it
    bounds every order's hits. MIN: a read that misses is admitted unless its next read is later than
    that of every page held, else the page read again last goes (bypass keeps it optimal)."""
    import heapq
    if capacity_pages <= 0:
        return 0.0
    seq = [h for req in pages for h in req]
    n = len(seq)
    nxt, last = [0] * n, {}
    for i in range(n - 1, -1, -1):
        nxt[i] = last.get(seq[i], n + i)  # never again: later than the end, and distinct
        last[seq[i]] = i
    held, heap, hits = {}, [], 0  # page -> its next read; heap of (-next read, page), stale ones skipped
    for i, h in enumerate(seq):
        if h in held:
            hits += 1
        elif len(held) >= capacity_pages:
            while -heap[0][0] != held.get(heap[0][1]):
                heapq.heappop(heap)
            if -heap[0][0] < nxt[i]:
                continue  # read again after every page held: not admitted
            del held[heapq.heappop(heap)[1]]
        held[h] = nxt[i]
        heapq.heappush(heap, (-nxt[i], h))
    return 100.0 * hits * page_tokens / max(1, tokens_total)
