"""FluxonHiCacheStorage: SGLang HiCache's storage backend over a Fluxon client.

How SGLang calls it (``managers/cache_controller.py``, ``hybrid_cache/hybrid_cache_controller.py``):
the prefetch thread asks ``batch_exists`` (batches of <= 128 pages; the ranks then take the MIN of
the hit counts), an I/O thread reads with ``batch_get_v1``, the backup thread writes with
``all(batch_set_v1(...))``; hybrid models use the ``_v2`` calls per pool. A daemon thread that
sees an exception, or ``None``, is never restarted, and the other TP ranks then wait in the
all-reduce forever. So here:

- **no data call raises**: a failure is ``False`` / ``0`` / an empty hit, a counter by cause
  (``fluxon_stats()["failures"]``) and at most one log line per cause and ``log_interval_s``;
- **every call is bounded**: the client is opened with ``max_wait_ms = call_timeout_s * 1000``, so
  the owner answers claims, master questions and remote fetches by then;
- **an owner restart is survived**: a call that meets a new generation maps it
  (``wait_local_segments_ready``) and runs once more;
- **backups do not wait for the master**: ``batch_set_*`` returns once the pages are
  local-read-ready (V1); the futures settle on a reaper thread, failures counted; at most
  ``max_pending_backups`` batches are unsettled (a full window refuses the batch: backpressure);
- **a page already stored or being stored** (another TP/DP rank, another process) is a success;
- **reads check the stored length**: a value whose length is not the page's is a miss (counted).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import fluxon
from fluxon import _fluxon

from ._compat import (HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo, PoolHitPolicy, PoolName,
                      StorageMetrics, pool_transfer_result, prefix_keys, rank_config)
from .admission import SCORE_POLICIES, AdmissionConfig, admit
from .keys import geometry_part, storage_key

logger = logging.getLogger("fluxon.sglang")

BATCH = 128  # SGLang's STORAGE_BATCH_SIZE: v2 calls arrive unbatched and are cut here

# Keys of SGLang's own that may stay in extra_config (the dynamic loader's, HiRadixCache's and the
# controller's; most are popped before the backend is built, some trees keep them).
SGLANG_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold", "prefetch_timeout_base",
    "prefetch_timeout_per_ki_token", "prefetch_timeout_max", "hicache_storage_pass_prefix_keys", "tp_lcm_size",
})
FLUXON_KEYS = frozenset({
    "fluxon_config", "fluxon_embedded", "key_prefix", "extra_backend_tag", "replica_task", "call_timeout_s",
    "max_pending_backups", "copy_threads", "log_interval_s", "client", "wait_ready_timeout_s",
})
# Pools whose state every TP rank holds whole under MLA (the rest is split by heads or per rank).
_PER_RANK_POOLS = frozenset({"mamba"})


def _cause(exc: BaseException) -> str:
    if isinstance(exc, fluxon.Error):
        return {"Closed": "owner_down", "GenerationMismatch": "generation_changed", "Timeout": "timeout",
                "LocalReserveTimeout": "no_slot_in_time", "NoSpace": "no_space", "KeyNotFound": "not_found",
                "InvalidArgument": "invalid_argument", "KeyConflict": "conflict"}.get(exc.code, exc.code.lower())
    return "internal:" + type(exc).__name__


def _name(pool_name) -> str:
    return str(getattr(pool_name, "value", pool_name))


@dataclass
class _Geometry:
    """How one host pool's pages become Fluxon values."""

    name: str                 # "kv" or the hybrid pool's name
    pool: Any
    page_size: int
    values_per_page: int      # > 1 with should_split_heads (one value per head group)
    sizes: List[int]          # the objects of one value, in get_page_buffer_meta order
    value_len: int
    replicated: bool          # every TP rank holds the same bytes (MLA): only rank 0 writes
    geometry: str             # the key's layout/dtype/page-size part
    logical: bool = False     # a hybrid model's KV anchor without a buffer: KV holds nothing to move

    def meta(self, host_indices, pages: int):
        if self.values_per_page > 1:
            ptrs, _ = self.pool.get_split_heads_page_buffer_meta(host_indices, self.values_per_page)
        else:
            ptrs, _ = self.pool.get_page_buffer_meta(host_indices)
        ptrs = [int(p) for p in ptrs]
        want = pages * self.values_per_page * len(self.sizes)
        if len(ptrs) != want:
            raise fluxon.InvalidArgument(f"pool {self.name}: get_page_buffer_meta gave {len(ptrs)} objects for "
                                         f"{pages} pages, expected {want}")
        return ptrs


class FluxonHiCacheStorage(HiCacheStorage):
    """A HiCache storage backend over Fluxon (interface v1, v2 and the legacy tensor calls)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = dict(storage_config.extra_config or {})
        extra.update(kwargs or {})
        unknown = sorted(set(extra) - SGLANG_KEYS - FLUXON_KEYS)
        if unknown:
            raise fluxon.InvalidArgument(f"extra_config: unknown key {unknown[0]!r} (Fluxon's keys: "
                                         f"{sorted(FLUXON_KEYS - {'client'})})")
        self.config = storage_config
        self.rank = rank_config(storage_config)  # the fields read, whatever SGLang's generation
        self.key_prefix = str(extra.get("key_prefix", "sglang"))
        if not self.key_prefix or ":" in self.key_prefix:
            raise fluxon.InvalidArgument("extra_config.key_prefix: must be non-empty and without ':'")
        self.extra_backend_tag = extra.get("extra_backend_tag")
        self.interface_v1 = bool(extra.get("interface_v1", False))
        self.copy_threads = int(extra.get("copy_threads", 0))
        self.call_timeout_s = float(extra.get("call_timeout_s", 2.0))
        if not 0.05 <= self.call_timeout_s <= 60:
            raise fluxon.InvalidArgument("extra_config.call_timeout_s: must be in [0.05, 60] seconds")
        self.max_pending_backups = int(extra.get("max_pending_backups", 1024))
        if self.max_pending_backups <= 0:
            raise fluxon.InvalidArgument("extra_config.max_pending_backups: must be > 0")
        self.log_interval_s = float(extra.get("log_interval_s", 10.0))
        self.wait_ready_timeout_s = float(extra.get("wait_ready_timeout_s", 600.0))
        if not self.wait_ready_timeout_s >= 0:
            raise fluxon.InvalidArgument("extra_config.wait_ready_timeout_s: must be >= 0 seconds")
        self.admission = self._admission(extra.get("replica_task"))
        if self.rank.should_split_heads and not self.rank.tp_lcm_size:
            raise fluxon.InvalidArgument("should_split_heads needs tp_lcm_size")
        self.split = self.rank.tp_lcm_size // self.rank.tp_size if self.rank.should_split_heads else 1

        shared = extra.get("client")
        self._owns_client = shared is None
        if shared is not None:
            self.client = shared
        else:
            path = extra.get("fluxon_config")
            embedded = bool(extra.get("fluxon_embedded", False))
            if not path and not embedded:
                raise fluxon.InvalidArgument(
                    "extra_config.fluxon_config: missing (the client config naming this host's owner daemon; "
                    "give \"fluxon_embedded\": true to run a private in-process store on purpose)")
            self.client = fluxon.KvClient(path if path else None, max_wait_ms=int(self.call_timeout_s * 1000))
            # The design's start-up rule: the owner's expected-capacity warm-up is done before SGLang
            # serves (a Timeout here names the bytes still to fault in; 0 skips the wait).
            if self.wait_ready_timeout_s > 0:
                self.client.wait_ready(self.wait_ready_timeout_s)

        self.mem_pool_host = None
        self._geoms: Dict[str, _Geometry] = {}
        self._suffix_cache: Dict[tuple, List[str]] = {}
        self._lock = threading.Lock()
        self._counters = collections.Counter()
        self._failures = collections.Counter()
        self._last_log: Dict[str, float] = {}
        self._metrics = StorageMetrics()
        self._reattach_lock = threading.Lock()
        # Unsettled backups: (future, pages). The reaper settles them in order.
        self._pending: collections.deque = collections.deque()
        self._pending_cv = threading.Condition()
        self._closing = False
        self._reaper = threading.Thread(target=self._reap, name="fluxon-backup-reaper", daemon=True)
        self._reaper.start()

    # -- configuration --------------------------------------------------------------------------
    @staticmethod
    def _admission(rt) -> AdmissionConfig:
        if rt is None:
            return AdmissionConfig()
        if not isinstance(rt, dict):
            raise fluxon.InvalidArgument("extra_config.replica_task: expected an object")
        unknown = sorted(set(rt) - {"enabled", "admission"})
        if unknown:
            raise fluxon.InvalidArgument(f"extra_config.replica_task: unknown key {unknown[0]!r}")
        if not rt.get("enabled"):
            return AdmissionConfig()
        a = AdmissionConfig.from_dict(rt.get("admission") or {"policy": "eager_all"})
        if a.policy in SCORE_POLICIES:
            raise fluxon.InvalidArgument(
                f"extra_config.replica_task.admission.policy: {a.policy!r} ranks pages by KV scores, and SGLang's "
                "storage calls carry none; use eager_all, prefix_root_only, prefix_depth_ratio, "
                "prefix_end_depth_ratio or ratio_only")
        return a

    # -- failures: counted, logged at a bounded rate, never raised --------------------------------
    def _fail(self, op: str, exc: BaseException, pages: int = 0) -> None:
        cause = _cause(exc)
        with self._lock:
            self._failures[f"{op}:{cause}"] += 1
            self._counters[f"{op}_failed_pages"] += pages
            now = time.monotonic()
            key = f"{op}:{cause}"
            if now - self._last_log.get(key, -1e9) < self.log_interval_s:
                return
            self._last_log[key] = now
            n = self._failures[key]
        logger.warning("fluxon %s failed (%s, %d so far): %s", op, cause, n, exc)

    def _count(self, **delta) -> None:
        with self._lock:
            self._counters.update(delta)

    def _reattach(self) -> bool:
        """Maps the owner's new generation (an owner restart); True when it worked."""
        with self._reattach_lock:
            try:
                self.client.wait_local_segments_ready()
                self._count(reattached=1)
                return True
            except Exception as e:  # the owner is still away: the next call tries again
                self._fail("reattach", e)
                return False

    def _guard(self, op: str, pages: int, fallback: Callable[[], Any], fn: Callable[[], Any]):
        for attempt in range(2):
            try:
                return fn()
            except fluxon.GenerationMismatch as e:
                if attempt == 0 and self._reattach():
                    continue
                self._fail(op, e, pages)
            except Exception as e:  # noqa: BLE001 - nothing may reach SGLang's threads
                self._fail(op, e, pages)
            return fallback()

    # -- pools and their geometry -----------------------------------------------------------------
    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._geoms["kv"] = self._geometry("kv", mem_pool_host)
        self._suffix_cache.clear()

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = _name(host_pool_name)
        if name == "kv" and "kv" in self._geoms and self._geoms["kv"].pool is host_pool:
            return
        self._geoms[name] = self._geometry(name, host_pool)
        self._suffix_cache.clear()

    def _geometry(self, name: str, pool) -> _Geometry:
        page_size = int(getattr(pool, "page_size", 1) or 1)
        if name == "kv" and hasattr(pool, "kv_buffer") and pool.kv_buffer is None:
            # A logical anchor (the hybrid controller's KV entry of a model without KV bytes here):
            # every KV page counts as present; the v2 pools decide the hit.
            return _Geometry(name, pool, page_size, 1, [], 0, False, "", logical=True)
        split = self.split if name == "kv" else 1
        probe = _indices(page_size)
        if split > 1:
            ptrs, sizes = pool.get_split_heads_page_buffer_meta(probe, split)
        else:
            ptrs, sizes = pool.get_page_buffer_meta(probe)
        ptrs = list(ptrs)
        sizes = [int(sizes)] * len(ptrs) if isinstance(sizes, int) else [int(s) for s in sizes]
        if not ptrs or len(ptrs) % split or len(sizes) != len(ptrs):
            raise fluxon.InvalidArgument(f"pool {name}: get_page_buffer_meta gave {len(ptrs)} pointers and "
                                         f"{len(sizes)} sizes for one page")
        per_value = len(ptrs) // split
        replicated = bool(self.rank.is_mla_model) and name not in _PER_RANK_POOLS
        geom = geometry_part(getattr(pool, "layout", None), getattr(pool, "dtype", None), page_size)
        return _Geometry(name, pool, page_size, split, sizes[:per_value], sum(sizes[:per_value]), replicated, geom)

    def _geom(self, name: str) -> _Geometry:
        g = self._geoms.get(name)
        if g is None:
            if name == "kv":
                raise fluxon.InvalidArgument("register_mem_pool_host was not called")
            pools = getattr(self, "registered_pools", {}) or {}
            pool = next((p for n, p in pools.items() if _name(n) == name), None)
            if pool is None:
                raise fluxon.InvalidArgument(f"pool {name}: register_mem_host_pool_v2 was not called")
            g = self._geoms[name] = self._geometry(name, pool)
        return g

    # -- keys -------------------------------------------------------------------------------------
    def _value_keys(self, g: _Geometry, page_hashes: Sequence[str], component: Optional[str] = None,
                    identity: bool = False) -> List[str]:
        suffixes = self._suffixes(g, component if component is not None else g.name, identity)
        head = self.key_prefix + ":"
        if len(suffixes) == 1:
            sfx = suffixes[0]
            return [head + h + sfx for h in page_hashes]
        return [head + h + sfx for h in page_hashes for sfx in suffixes]

    def _suffixes(self, g: _Geometry, comp: str, identity: bool) -> List[str]:
        """What follows the page hash in each of a page's value keys (computed once per pool)."""
        ck = (g.name, comp, identity)
        cached = self._suffix_cache.get(ck)
        if cached is None:
            cut = len(self.key_prefix) + 1 + len("#")
            cached = []
            for j in range(g.values_per_page):
                vpp = g.values_per_page
                head_group = self.rank.tp_rank * vpp + j if vpp > 1 else None
                k = storage_key(self.key_prefix, "#", self.rank, comp, self.extra_backend_tag, geometry=g.geometry,
                                replicated=g.replicated, head_group=head_group,
                                rank_override=(f"_tp{self.rank.tp_size}.{j}" if identity else None))
                cached.append(k[cut:])
            self._suffix_cache[ck] = cached
        return cached

    def storage_keys(self, page_hashes: Sequence[str], pool: str = "kv") -> List[str]:
        """The Fluxon keys of pages of a pool (tools and tests)."""
        return self._value_keys(self._geom(pool), page_hashes)

    def _groups(self, g: _Geometry, pages: int) -> Optional[List[int]]:
        return [g.values_per_page] * pages if g.values_per_page > 1 else None

    # -- the three operations, per pool -----------------------------------------------------------
    def _exists(self, g: _Geometry, page_hashes: Sequence[str], component: Optional[str] = None) -> int:
        if not page_hashes:
            return 0
        if g.logical:
            return len(page_hashes)
        # The hot path of every prefetch: with one value per page the page hashes go as they are,
        # framed by the deployment's prefix and the pool's suffix (sent once).
        suffixes = self._suffixes(g, component if component is not None else g.name, False)
        if len(suffixes) == 1:
            r = self.client.exists_prefix(list(page_hashes), None, g.value_len, key_prefix=self.key_prefix + ":",
                                          key_suffix=suffixes[0])
        else:
            r = self.client.exists_prefix(self._value_keys(g, page_hashes, component),
                                          self._groups(g, len(page_hashes)), g.value_len)
        hit = r.prefix_len // g.values_per_page
        self._count(exists_calls=1, exists_pages=len(page_hashes), exists_hit_pages=hit)
        return hit

    def _read(self, g: _Geometry, page_hashes: Sequence[str], host_indices) -> List[bool]:
        pages = len(page_hashes)
        if g.logical:
            return [True] * pages
        ptrs = g.meta(host_indices, pages)
        keys = self._value_keys(g, page_hashes)
        t0 = time.perf_counter()
        hit = nv = 0
        with self._fetch(keys, self._groups(g, pages)) as (plan, r):
            if plan is None:
                self._count(get_miss_pages=pages)
                return [False] * pages
            lens = fluxon.plan_lengths(plan)
            good = next((i for i, ln in enumerate(lens) if ln != g.value_len), len(lens))
            if good < len(lens):
                self._count(get_len_mismatch=1)
                logger.warning("fluxon get: value %r holds %d bytes, the page has %d: a miss", keys[good],
                               lens[good], g.value_len)
            hit = good // g.values_per_page
            nv = hit * g.values_per_page
            if nv:
                _fluxon.plan_copy(plan, ptrs[:nv * len(g.sizes)], g.sizes, nv, False, self.copy_threads)
        dt = time.perf_counter() - t0
        self._count(get_pages=hit, get_bytes=nv * g.value_len, get_miss_pages=pages - hit,
                    get_remote_pages=r.remote_keys // g.values_per_page)
        if hit:
            with self._lock:
                self._metrics.prefetch_pgs.append(hit)
                self._metrics.prefetch_bandwidth.append(nv * g.value_len / max(dt, 1e-9) / 1e9)
        return [True] * hit + [False] * (pages - hit)

    @contextlib.contextmanager
    def _fetch(self, keys: List[str], groups: Optional[List[int]] = None):
        """The one read of every get call (v1, v2 and the legacy ones): (plan, result) of the
        transferable prefix of keys, released when the block ends however it ends; (None, result)
        when nothing is transferable (the handle cancelled)."""
        handle, r = self.client.get_start(keys, True, groups)
        if r.transferable_len == 0:
            self.client.cancel_get_transfer(handle)
            yield None, r
            return
        plan = self.client.get_transfer(handle)
        try:
            yield plan, r
        finally:
            self.client.release_views(plan)

    def _write(self, g: _Geometry, page_hashes: Sequence[str], host_indices, extra_info) -> List[bool]:
        pages = len(page_hashes)
        if g.logical or (g.replicated and self.rank.tp_rank != 0):
            return [True] * pages  # every rank holds these bytes; rank 0 writes them
        if not self._window_open():
            self._count(backup_backpressure_pages=pages)
            self._fail("set", fluxon.Timeout("max_pending_backups batches are not settled yet (backpressure)"),
                       pages)
            return [False] * pages
        ptrs = g.meta(host_indices, pages)
        keys = self._value_keys(g, page_hashes)
        vpp = g.values_per_page
        mask = self._admit(g, page_hashes, extra_info)
        t0 = time.perf_counter()
        ok = self._put(keys, g.value_len, ptrs, g.sizes, vpp, mask, self._parents(g, keys, extra_info))
        result = [all(ok[p * vpp:(p + 1) * vpp]) for p in range(pages)]
        dt = time.perf_counter() - t0
        written = sum(result)
        if written:
            with self._lock:
                self._metrics.backup_pgs.append(written)
                self._metrics.backup_bandwidth.append(written * vpp * g.value_len / max(dt, 1e-9) / 1e9)
        return result

    def _put(self, keys: List[str], value_len: int, ptrs: Sequence[int], sizes: Sequence[int], vpp: int = 1,
             mask: Optional[List[bool]] = None, parents: Optional[List[str]] = None) -> List[bool]:
        """The one put of every set call (v1, v2 and the legacy ones): stores keys[i] (value_len
        bytes) copied from ptrs[i * len(sizes) + j] (its parts, of `sizes`), each run of `vpp`
        values one atomic group. A key stored or being stored elsewhere is a success; the others
        go again, at most three rounds. A copy that fails aborts the plan (its slots and keys go
        back) and raises. Returns, per key, whether it is stored or on its way."""
        per_value = len(sizes)
        ok = [False] * len(keys)
        remaining = list(range(len(keys)))
        for _ in range(3):  # a round drops the keys stored, or being stored, elsewhere
            try:
                plan = self.client.local_fast_put_start(
                    [keys[i] for i in remaining], value_len,
                    fluxon.PutOptionalArgs(atomic_group_lens=_regroup(remaining, vpp) if vpp > 1 else None,
                                           make_replica_task=mask is not None,
                                           make_replica_task_mask=[mask[i] for i in remaining] if mask is not None else None,
                                           radix_parent_keys=[parents[i] for i in remaining] if parents else None))
            except fluxon.KeyConflict as e:
                stored = {remaining[i] for i, why in zip(e.indices, e.reasons) if why == "exists"}
                writing = {remaining[i] for i, why in zip(e.indices, e.reasons) if why == "inflight"}
                for i in stored | writing:
                    ok[i] = True  # already stored, or another rank/process is storing it: a success
                self._count(set_exists_values=len(stored), set_inflight_elsewhere_values=len(writing))
                remaining = [i for i in remaining if not ok[i]]
                if remaining:
                    continue
                break
            sub = ptrs if len(remaining) == len(keys) else [ptrs[i * per_value + j] for i in remaining
                                                            for j in range(per_value)]
            try:
                _fluxon.plan_copy(plan, sub, sizes, len(remaining), True, self.copy_threads)
            except BaseException:
                self.client.put_abort(plan)
                raise
            self._track(self.client.local_fast_put_commit(plan), len(remaining) // vpp)  # V1: readable now
            for i in remaining:
                ok[i] = True
            self._count(set_pages=len(remaining) // vpp, set_bytes=len(remaining) * value_len)
            break
        return ok

    def _parents(self, g: _Geometry, keys: List[str], extra_info) -> List[str]:
        """Each value's parent in its prefix chain: the same value of the page before it (the last
        of SGLang's prefix_keys for the first page; "" without them), so the owner evicts leaves
        first (prefix-aware eviction)."""
        vpp = g.values_per_page
        prefix = prefix_keys(extra_info)
        first = self._value_keys(g, [prefix[-1]]) if prefix else [""] * vpp
        return first[:vpp] + keys[:len(keys) - vpp]

    def _admit(self, g: _Geometry, page_hashes, extra_info) -> Optional[List[bool]]:
        if self.admission.policy == "none":
            return None
        ids = self._value_keys(g, page_hashes, identity=True)
        depth = len(prefix_keys(extra_info))
        # One decision per page (its values are one group), at the page's depth in the request.
        page_mask = admit(ids[::g.values_per_page], self.admission, None, None, depth)
        self._count(replica_admitted_pages=sum(page_mask))
        return [m for m in page_mask for _ in range(g.values_per_page)]

    # -- backups settle in the background, bounded ----------------------------------------------------
    def _window_open(self) -> bool:
        deadline = time.monotonic() + self.call_timeout_s
        with self._pending_cv:
            while len(self._pending) >= self.max_pending_backups:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._pending_cv.wait(left)
        return True

    def _track(self, fut, pages: int) -> None:
        with self._pending_cv:
            self._pending.append((fut, pages))
            self._pending_cv.notify_all()

    def _reap(self) -> None:
        while True:
            with self._pending_cv:
                while not self._pending and not self._closing:
                    self._pending_cv.wait(0.5)
                if not self._pending and self._closing:
                    return
                fut, pages = self._pending[0]
            fut.wait(0.5)  # returns when the head settles; the timeout only re-checks closing
            if not fut.done():
                continue
            try:
                fut.result(0)
                self._count(backup_published_pages=pages)
            except fluxon.KeyConflict:
                self._count(backup_stored_elsewhere_pages=pages)  # another owner published it first
            except Exception as e:  # noqa: BLE001
                self._fail("publish", e, pages)
            with self._pending_cv:
                self._pending.popleft()
                self._pending_cv.notify_all()

    def flush(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until every backup is settled (published or failed); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._pending_cv:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._pending_cv.wait(left if left is not None else 0.5)
        return True

    # -- interface v1 -----------------------------------------------------------------------------
    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        """Pages of the leading prefix that exist: one question to the owner (its index, then the
        master's routes); claims no slot, starts no fetch."""
        if not keys:
            return 0
        comp = None if self.interface_v1 else "flat"
        return self._guard("exists", 0, lambda: 0, lambda: self._exists(self._geom("kv"), keys, comp))

    def batch_get_v1(self, keys: List[str], host_indices, extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        if not keys:
            return []
        return self._guard("get", len(keys), lambda: [False] * len(keys),
                           lambda: self._read(self._geom("kv"), keys, host_indices))

    def batch_set_v1(self, keys: List[str], host_indices, extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        if not keys:
            return []
        return self._guard("set", len(keys), lambda: [False] * len(keys),
                           lambda: self._write(self._geom("kv"), keys, host_indices, extra_info))

    # -- interface v2 (hybrid pools) ----------------------------------------------------------------
    def batch_exists_v2(self, keys: List[str], pool_transfers=None,
                        extra_info: Optional[HiCacheStorageExtraInfo] = None):
        def run():
            kv = self._geom("kv")
            hit = 0
            for s in range(0, len(keys), BATCH):
                n = self._exists(kv, keys[s:s + BATCH])
                hit += n
                if n < len(keys[s:s + BATCH]):
                    break
            per_pool: Dict[str, int] = {"kv": hit} if hit else {}
            bound = hit
            trailing = []
            for t in pool_transfers or []:
                name = _name(t.name)
                if name == "kv":
                    continue
                g = self._geom(name)
                if _name(t.hit_policy) == _name(PoolHitPolicy.TRAILING_PAGES):
                    trailing.append((name, g, max(1, len(t.keys) if t.keys else 1)))
                else:
                    b = self._exists(g, keys[:bound])
                    per_pool[name] = b
                    bound = min(bound, b)
            # Trailing pools: the longest prefix p <= bound whose last N pages exist in every one.
            changed = True
            while changed and bound > 0 and trailing:
                changed = False
                for name, g, win in trailing:
                    p = self._trailing(g, keys, bound, win)
                    per_pool[name] = p
                    if p < bound:
                        bound, changed = p, True
            return pool_transfer_result(bound, {k: v for k, v in per_pool.items() if v})
        return self._guard("exists", 0, lambda: pool_transfer_result(0, {}), run)

    def _trailing(self, g: _Geometry, keys, upto: int, window: int) -> int:
        p = upto
        while p > 0:
            lo = max(0, p - window)
            n = self._exists(g, keys[lo:p])
            if n == p - lo:
                return p
            p = lo + n  # every window holding the missing page fails: end before it
        return 0

    def _per_transfer(self, op: str, transfers, fn) -> Dict[Any, List[bool]]:
        out: Dict[Any, List[bool]] = {}
        for t in transfers or []:
            keys = list(t.keys or [])
            name = _name(t.name)

            def run(t=t, keys=keys, name=name):
                g = self._geom(name)
                res: List[bool] = []
                for s in range(0, len(keys), BATCH):
                    chunk = keys[s:s + BATCH]
                    idx = t.host_indices[s * g.page_size:(s + len(chunk)) * g.page_size]
                    r = fn(g, chunk, idx)
                    res += r
                    if not all(r):
                        res += [False] * (len(keys) - len(res))
                        break
                return res
            out[t.name] = self._guard(op, len(keys), lambda keys=keys: [False] * len(keys), run)
        return out

    def batch_get_v2(self, transfers, extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        return self._per_transfer("get", transfers, self._read)

    def batch_set_v2(self, transfers, extra_info: Optional[HiCacheStorageExtraInfo] = None) -> Dict[Any, List[bool]]:
        return self._per_transfer("set", transfers, lambda g, k, idx: self._write(g, k, idx, extra_info))

    # -- the legacy tensor calls (SGLang's generic path: one flat data page per key) ------------------
    def exists(self, key: str) -> bool:
        """Whether ``set(key, ...)`` stored a value (of any length): the legacy call's own key."""
        return self._guard("exists", 0, lambda: False,
                           lambda: self.client.exists_prefix([self._flat_key(key)]).prefix_len == 1)

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        return self.batch_get([key], [target_location] if target_location is not None else None,
                              [target_sizes] if target_sizes is not None else None)[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None, target_sizes: Optional[Any] = None):
        """Fills each target (a CPU tensor, or an address with ``target_sizes``) with its value and
        returns the target; without targets returns a new uint8 tensor (bytes without torch).
        ``None`` for a key that is missing or holds another length."""
        if not keys:
            return []
        return self._guard("get", len(keys), lambda: [None] * len(keys),
                           lambda: self._legacy_get(keys, target_locations, target_sizes))

    def _legacy_get(self, keys, targets, sizes):
        import ctypes
        out: List[Any] = [None] * len(keys)
        with self._fetch([self._flat_key(k) for k in keys]) as (plan, _r):
            if plan is None:
                return out
            for i, (addr, ln) in enumerate(zip(fluxon.plan_pointers(plan), fluxon.plan_lengths(plan))):
                t = targets[i] if targets is not None else None
                dst, want = _target(t, sizes[i] if sizes is not None else None, ln)
                if want != ln:
                    self._count(get_len_mismatch=1)
                    continue
                if dst is None:
                    out[i] = _as_tensor(ctypes.string_at(addr, ln))
                else:
                    ctypes.memmove(dst, addr, ln)  # each target its own length: one value at a time
                    out[i] = t
        self._count(get_pages=sum(o is not None for o in out))
        return out

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value] if value is not None else None,
                              [target_location] if target_location is not None else None,
                              [target_sizes] if target_sizes is not None else None)

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores each value (a tensor or bytes-like; or an address with ``target_sizes``)."""
        if not keys:
            return True
        if self.rank.is_mla_model and self.rank.tp_rank != 0:
            return True
        return self._guard("set", len(keys), lambda: False,
                           lambda: self._legacy_set(keys, values, target_locations, target_sizes))

    def _legacy_set(self, keys, values, targets, sizes) -> bool:
        if not self._window_open():
            self._count(backup_backpressure_pages=len(keys))
            self._fail("set", fluxon.Timeout("max_pending_backups batches are not settled yet (backpressure)"),
                       len(keys))
            return False
        srcs = []
        for i in range(len(keys)):
            if values is not None:
                addr, ln, keep = _source(values[i])
            else:
                addr, ln, keep = int(targets[i]), int(sizes[i]), None
            srcs.append((addr, ln, keep))
        by_len: Dict[int, List[int]] = {}
        for i, (_, ln, _) in enumerate(srcs):
            by_len.setdefault(ln, []).append(i)
        stored = True
        for ln, idx in by_len.items():
            ok = self._put([self._flat_key(keys[i]) for i in idx], ln, [srcs[i][0] for i in idx], [ln])
            stored = stored and all(ok)
        return stored

    def _flat_key(self, page_hash: str) -> str:
        g = self._geoms.get("kv")
        return storage_key(self.key_prefix, page_hash, self.rank, "flat", self.extra_backend_tag,
                           geometry=g.geometry if g else "", replicated=bool(self.rank.is_mla_model))

    # -- management ---------------------------------------------------------------------------------
    def clear(self) -> None:
        """Removes this deployment's values (every key under ``key_prefix``) from the owner this
        rank is attached to. Values other owners hold (replicas on a CPU owner) stay until their
        owner evicts them."""
        def run():
            n = self.client.remove_prefix(self.key_prefix + ":")
            self._count(cleared_values=n)
            logger.info("fluxon clear: %d values under %r removed", n, self.key_prefix + ":")
        self._guard("clear", 0, lambda: None, run)

    def get_stats(self):
        """SGLang's StorageMetrics since the last call (pages and GB/s of prefetch and backup)."""
        with self._lock:
            m, self._metrics = self._metrics, StorageMetrics()
        return m

    def fluxon_stats(self) -> dict:
        """Fluxon's own figures: the backend's counters, failures by cause, unsettled backups and
        the owner's stats (when it answers)."""
        with self._lock:
            s = {"counters": dict(self._counters), "failures": dict(self._failures)}
        with self._pending_cv:
            s["pending_backups"] = len(self._pending)
        try:
            s["owner"] = self.client.stats()
        except Exception as e:  # noqa: BLE001
            s["owner"] = {"error": str(e)}
        return s

    def close(self) -> None:
        self.flush(self.call_timeout_s)
        with self._pending_cv:
            self._closing = True
            self._pending_cv.notify_all()
        self._reaper.join(self.call_timeout_s + 1)
        if self._owns_client:
            self.client.close()


def _regroup(remaining: List[int], vpp: int) -> List[int]:
    """Group lens of the remaining values: each page's remaining values stay one group."""
    lens: List[int] = []
    last = None
    for i in remaining:
        p = i // vpp
        if p == last:
            lens[-1] += 1
        else:
            lens.append(1)
            last = p
    return lens


def _indices(page_size: int):
    try:
        import torch
        return torch.arange(page_size, dtype=torch.int64)
    except ImportError:  # pools written without torch (tests) take any sequence
        return list(range(page_size))


def _source(v):
    """(address, length, keep-alive) of a CPU tensor or a bytes-like value."""
    if hasattr(v, "data_ptr") and hasattr(v, "element_size"):
        t = v.contiguous()
        return t.data_ptr(), t.numel() * t.element_size(), t
    b = bytes(memoryview(v).cast("B"))
    import ctypes
    buf = ctypes.create_string_buffer(b, len(b))
    return ctypes.addressof(buf), len(b), buf


def _target(t, size, stored_len):
    """(address or None, the length the caller expects)."""
    if t is None:
        return None, stored_len if size is None else int(size)
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):
        if not t.is_contiguous():
            raise fluxon.InvalidArgument("target_location: the tensor must be contiguous")
        return t.data_ptr(), t.numel() * t.element_size()
    return int(t), int(size)


def _as_tensor(data: bytes):
    try:
        import torch
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    except ImportError:
        return data
