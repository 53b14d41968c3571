"""Fluxon: a distributed KV-cache store for LLM serving (SGLang HiCache storage).

The hostless API: Fluxon hands out *plan blobs* (``uint64 magic, uint64 count,
uint64 value_ptrs[count]``) and the caller copies bytes at those addresses itself.
"""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Optional, Sequence

from . import errors
from .errors import (Closed, Error, GenerationMismatch, Internal, InvalidArgument, KeyConflict, KeyNotFound,
                     LocalReserveTimeout, MalformedMessage, NoSpace, PermissionDenied, Timeout)
from ._fluxon import PLAN_MAGIC, _Client

__version__ = "0.2.0"

__all__ = [
    "KvClient", "KvEvent", "PutOptionalArgs", "GetStartResult", "GetStartHandle", "KvFuture", "ExistsResult", "plan_pointers",
    "plan_lengths", "PLAN_MAGIC", "__version__",
    "Error", "InvalidArgument", "KeyConflict", "NoSpace", "LocalReserveTimeout", "KeyNotFound",
    "GenerationMismatch", "Closed", "Timeout", "MalformedMessage", "Internal", "PermissionDenied",
]


class KvEvent(NamedTuple):
    """One route change (docs/events.md). kind: ``stored``, ``removed`` or ``lost``; version:
    ``(origin_node, origin_generation, put_id)``; cause (removed): ``removed``, ``reclaimed``,
    ``demoted``, ``replaced`` or ``owner_restarted``; cursor: where to resume after this event."""
    kind: str
    key: str
    node: int
    version: tuple
    cause: str
    cursor: str


def _parse_cursor(cursor: Optional[str]) -> tuple:
    if cursor is None:
        return 0, 0
    if not isinstance(cursor, str):
        raise InvalidArgument("cursor: expected a str 'EPOCH:SEQ' (from a KvEvent or poll_kv_events) or None")
    parts = cursor.split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) == 0:
        raise InvalidArgument(f"cursor: {cursor!r} is not 'EPOCH:SEQ' (from a KvEvent or poll_kv_events)")
    epoch, seq = int(parts[0]), int(parts[1])
    if epoch >= 2**64 or seq >= 2**64:
        raise InvalidArgument(f"cursor: {cursor!r} is out of range")
    return epoch, seq


@dataclass
class PutOptionalArgs:
    """Options of :meth:`KvClient.local_fast_put_start` (SPEC.md §2)."""

    reject_if_inflight_same_key: bool = True
    reject_if_exist_same_key: bool = True
    write_through: bool = False
    make_replica_task: bool = False
    make_replica_task_mask: Optional[list] = None
    atomic_group_lens: Optional[list] = None
    lease_id: Optional[int] = None
    # Per key, the page before it in its prefix ("" for a root): the owner evicts leaves first.
    radix_parent_keys: Optional[list] = None
    # Per key, its depth in its prefix (pages from the root): replica admission's depth policies
    # read it, and without radix_parent_keys the batch's own chain follows from it.
    content_depths: Optional[list] = None
    # kv_score_pressure_budget: the owner keeps, of the groups make_replica_task_mask names, the best
    # (one priority per group) that fit in replica_budget_pages x its eviction pressure;
    # replica_group_ids (one uint64 per group) name a group the same on every TP rank, and
    # replica_decision_shares puts (the TP ranks behind the owner) share each group's decision.
    replica_budget_pages: Optional[int] = None
    replica_group_priorities: Optional[list] = None
    replica_group_ids: Optional[list] = None
    replica_decision_shares: int = 1


@dataclass(frozen=True)
class GetStartResult:
    raw_prefix_hit_len: int
    transferable_len: int
    prefix_hit_groups: int
    first_miss_index: Optional[int]
    first_miss_group_index: Optional[int]
    all_hit: bool
    # Where keys[:transferable_len] come from (P2): pinned local copies (L2), joins of another
    # batch's remote fetch, fetches this call leads from remote owners (L3 = joined + leader).
    local_keys: int = 0
    joined_keys: int = 0
    leader_keys: int = 0
    remote_keys: int = 0
    sources: bytes = b""  # per key of the prefix: 0 local, 1 joined, 2 leader


@dataclass(frozen=True)
class ExistsResult:
    """:meth:`KvClient.exists_prefix`: the existing prefix (group-aligned), the part of it held by
    the attached owner, and whether the master was asked and answered in time."""

    prefix_len: int
    local_len: int
    master_answered: bool


class GetStartHandle:
    """Must be consumed by exactly one ``get_transfer`` or ``cancel_get_transfer``."""

    __slots__ = ("_id", "result")

    def __init__(self, handle_id: int, result: GetStartResult):
        self._id = handle_id
        self.result = result

    def __repr__(self):
        return f"GetStartHandle({self._id}, transferable_len={self.result.transferable_len})"


class KvFuture:
    """Succeeds when the routes of a committed put are live at the master."""

    __slots__ = ("_f",)

    def __init__(self, f):
        self._f = f

    def done(self) -> bool:
        return self._f.done()

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        return self._f.wait(timeout_s)

    def result(self, timeout_s: Optional[float] = None) -> None:
        """Returns when the routes are live; raises the failure (or :class:`Timeout`)."""
        self._f.result(timeout_s)

    @property
    def put_id(self) -> int:
        return self._f.put_id


def _check_keys(keys) -> list:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise InvalidArgument("keys: expected a list of str")
    for i, k in enumerate(keys):
        if not isinstance(k, str):
            raise InvalidArgument(f"keys[{i}]: expected str, got {type(k).__name__}")
    return list(keys)


def _check_budget(opts) -> None:
    """The replica budget's fields are well typed (the sizes the core checks)."""
    def uint(name, x, bits):
        if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2 ** bits:
            raise InvalidArgument(f"{name}: expected an int in [0, 2**{bits}), got {x!r}")
    if opts.replica_budget_pages is not None:
        uint("replica_budget_pages", opts.replica_budget_pages, 32)
    uint("replica_decision_shares", opts.replica_decision_shares, 32)
    for name in ("replica_group_priorities", "replica_group_ids"):
        v = getattr(opts, name)
        if v is not None and not isinstance(v, (list, tuple)):
            raise InvalidArgument(f"{name}: expected a list")
    for i, x in enumerate(opts.replica_group_priorities or ()):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise InvalidArgument(f"replica_group_priorities[{i}]: expected a number, got {x!r}")
    for i, x in enumerate(opts.replica_group_ids or ()):
        uint(f"replica_group_ids[{i}]", x, 64)


def _check_int_list(name: str, v) -> Optional[list]:
    if v is None:
        return None
    if not isinstance(v, (list, tuple)):
        raise InvalidArgument(f"{name}: expected a list of int")
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int):
            raise InvalidArgument(f"{name}[{i}]: expected int")
        if x <= 0:
            raise InvalidArgument(f"{name}[{i}]: must be > 0")
        if x >= 2 ** 32:
            raise InvalidArgument(f"{name}[{i}]: too large")
    return list(v)


def _check_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InvalidArgument(f"{name}: expected int, got {type(v).__name__}")
    return v


def _check_plan(v) -> int:
    v = _check_int("plan_ptr", v)
    if v <= 0 or v >= 2 ** 64:
        raise InvalidArgument(f"plan_ptr: {v} is not a plan address")
    return v


def _plan_count(plan_ptr: int) -> int:
    hdr = (ctypes.c_uint64 * 2).from_address(_check_plan(plan_ptr))
    if hdr[0] != PLAN_MAGIC:
        raise InvalidArgument(f"plan_ptr: 0x{plan_ptr:x} is not a Fluxon plan blob")
    return hdr[1]


def plan_pointers(plan_ptr: int) -> list:
    """The ``value_ptrs`` of a plan blob (checks the magic)."""
    n = _plan_count(plan_ptr)
    return list((ctypes.c_uint64 * n).from_address(plan_ptr + 16))


def plan_lengths(plan_ptr: int) -> list:
    """The ``value_lens`` that follow the pointers in a plan blob: each value's stored length."""
    n = _plan_count(plan_ptr)
    return list((ctypes.c_uint64 * n).from_address(plan_ptr + 16 + 8 * n))


class KvClient:
    """Fluxon client.

    ``KvClient()`` runs an embedded single-host store (master + owner + client in this process).
    ``KvClient(path)`` loads a YAML/JSON config file; ``KvClient(dict)`` takes the same content
    as a dict. A config with ``owner_address`` (top level or under ``client``) attaches to a
    running owner daemon and maps its shared segment (``segment_label == "external_owner:0"``).
    """

    def __init__(self, config=None, *, max_wait_ms: Optional[int] = None):
        """``max_wait_ms``: no call waits longer than this for slots, the master or a remote fetch
        (overrides the config's ``client.max_wait_ms``)."""
        wait = 0 if max_wait_ms is None else _check_int("max_wait_ms", max_wait_ms)
        if not 0 <= wait < 2 ** 32:
            raise InvalidArgument("max_wait_ms: must be in [0, 2**32)")
        if config is None:
            self._c = _Client("", False, wait)
        elif isinstance(config, (str, os.PathLike)):
            self._c = _Client(os.fspath(config), True, wait)
        elif isinstance(config, dict):
            self._c = _Client(json.dumps(config), False, wait)
        else:
            raise InvalidArgument(f"config: expected a path or a dict, got {type(config).__name__}")

    # -- lifetime --------------------------------------------------------------------------
    def close(self) -> None:
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- API of SPEC.md §2 -----------------------------------------------------------------
    def wait_local_segments_ready(self) -> list:
        return self._c.wait_local_segments_ready()

    def local_fast_put_start(self, keys, value_len: int, opts: Optional[PutOptionalArgs] = None) -> int:
        keys = _check_keys(keys)
        value_len = _check_int("value_len", value_len)
        if opts is not None:
            if not isinstance(opts, PutOptionalArgs):
                raise InvalidArgument("opts: expected PutOptionalArgs")
            _check_int_list("atomic_group_lens", opts.atomic_group_lens)
            m = opts.make_replica_task_mask
            if m is not None and (not isinstance(m, (list, tuple)) or not all(isinstance(x, bool) for x in m)):
                raise InvalidArgument("make_replica_task_mask: expected a list of bool")
            if opts.lease_id is not None:
                _check_int("lease_id", opts.lease_id)
            p = opts.radix_parent_keys
            if p is not None and (not isinstance(p, (list, tuple)) or not all(isinstance(x, str) for x in p)):
                raise InvalidArgument("radix_parent_keys: expected a list of str")
            d = opts.content_depths
            if d is not None:
                if not isinstance(d, (list, tuple)):
                    raise InvalidArgument("content_depths: expected a list of int")
                for i, x in enumerate(d):
                    if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 2 ** 32:
                        raise InvalidArgument(f"content_depths[{i}]: expected an int in [0, 2**32), got {x!r}")
            _check_budget(opts)
        return self._c.local_fast_put_start(keys, value_len, opts)

    def local_fast_put_commit(self, plan_ptr: int) -> KvFuture:
        return KvFuture(self._c.local_fast_put_commit(_check_plan(plan_ptr)))

    def put_abort(self, plan_ptr: int) -> None:
        self._c.put_abort(_check_plan(plan_ptr))

    def get_start(self, keys, prefix_best_effort: bool = True, atomic_group_lens=None):
        keys = _check_keys(keys)
        groups = _check_int_list("atomic_group_lens", atomic_group_lens)
        handle_id, r = self._c.get_start(keys, bool(prefix_best_effort), groups)
        result = GetStartResult(**r)
        return GetStartHandle(handle_id, result), result

    def get_transfer(self, handle: GetStartHandle, *, consume_prefix_len: Optional[int] = None) -> int:
        if not isinstance(handle, GetStartHandle):
            raise InvalidArgument("handle: expected a GetStartHandle")
        if consume_prefix_len is not None:
            _check_int("consume_prefix_len", consume_prefix_len)
        return self._c.get_transfer(handle._id, consume_prefix_len)

    def cancel_get_transfer(self, handle: GetStartHandle) -> None:
        if not isinstance(handle, GetStartHandle):
            raise InvalidArgument("handle: expected a GetStartHandle")
        self._c.cancel_get_transfer(handle._id)

    def release_views(self, plan_ptr: int) -> None:
        self._c.release_views(_check_plan(plan_ptr))

    def exists_prefix(self, keys, atomic_group_lens=None, expected_len: int = 0, *, key_prefix: str = "",
                      key_suffix: str = "") -> ExistsResult:
        """How many leading keys exist: the attached owner's index first, then the master's routes
        for the rest; aligned to the groups. Claims no slot, starts no fetch, pins nothing. With
        ``expected_len`` a value of another length counts as missing. With ``key_prefix`` /
        ``key_suffix`` each key is ``key_prefix + keys[i] + key_suffix`` (they travel once)."""
        keys = _check_keys(keys)
        groups = _check_int_list("atomic_group_lens", atomic_group_lens)
        expected_len = _check_int("expected_len", expected_len)
        if expected_len < 0:
            raise InvalidArgument("expected_len: must be >= 0")
        if not isinstance(key_prefix, str) or not isinstance(key_suffix, str):
            raise InvalidArgument("key_prefix/key_suffix: expected str")
        return ExistsResult(**self._c.exists_prefix(keys, groups, expected_len, key_prefix, key_suffix))

    def remove_prefix(self, prefix: str) -> int:
        """Removes every value the attached owner holds whose key starts with ``prefix`` (routes
        first; each slot once its last reader is gone). Returns how many."""
        if not isinstance(prefix, str) or not prefix:
            raise InvalidArgument("prefix: expected a non-empty str")
        return self._c.remove_prefix(prefix)

    def stats(self) -> dict:
        return dict(self._c.stats())

    def wait_ready(self, timeout_s: float = 600.0) -> dict:
        """Waits until the attached owner's warm-up is done: the grants its expected capacity
        (``owner_local_reserve_expected_capacity``) carved at start are all faulted in (a dynamic
        owner is ready at once). Returns ``stats()`` then; raises ``Timeout`` naming the bytes
        faulted in so far. SGLang's backend calls it before it serves."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise InvalidArgument("timeout_s: expected a number of seconds")
        return dict(self._c.wait_ready(float(timeout_s)))

    def master_stats(self) -> dict:
        """The master's figures: routes, replicas, inflight_gets, get/replica task totals."""
        return dict(self._c.master_stats())

    def poll_kv_events(self, prefix: Optional[str] = None, cursor: Optional[str] = None,
                       max_events: int = 0) -> tuple:
        """One read of the master's KV-event log (docs/events.md): ``(events, cursor)``, the
        events after ``cursor`` (None: from the oldest the master holds) whose key starts with
        ``prefix``, at most ``max_events`` (0: the master's bound, 4096), and the cursor to read on
        from. When the cursor could not be continued (a new master, or events dropped at the log's
        bound) the first event is a ``lost`` one: re-sync, then go on from its cursor."""
        if prefix is not None and not isinstance(prefix, str):
            raise InvalidArgument("prefix: expected a str or None")
        if isinstance(max_events, bool) or not isinstance(max_events, int) or not 0 <= max_events < 2**32:
            raise InvalidArgument("max_events: expected an int in [0, 2**32)")
        epoch, seq = _parse_cursor(cursor)
        r = self._c.kv_events(prefix or "", epoch, seq, max_events)
        events = []
        if r["lost"]:
            events.append(KvEvent("lost", "", 0, (0, 0, 0), "cursor " + str(cursor) + " could not be continued",
                                  f"{r['epoch']}:{r['first_seq'] - 1}"))
        for seq_, kind, key, node, on, og, pid, cause in r["events"]:
            events.append(KvEvent(kind, key, node, (on, og, pid), cause, f"{r['epoch']}:{seq_}"))
        return events, f"{r['epoch']}:{r['next_seq']}"

    def kv_events(self, prefix: Optional[str] = None, cursor: Optional[str] = None,
                  poll_interval_s: float = 0.05, idle_timeout_s: Optional[float] = None) -> Iterator["KvEvent"]:
        """Streams the master's route changes as :class:`KvEvent`: ``stored(key, node, version)``
        and ``removed(key, node, version, cause)``, in order per key (in fact in the master's one
        order), from ``cursor`` (None: the oldest event the master holds). Each event carries the
        cursor to resume after it. A ``lost`` event says the stream could not go on from where it
        was (a new master, or a slow reader overtaken at the log's bound): what the reader knew
        may be stale, and the events after it are the log's oldest. Polls every
        ``poll_interval_s`` while there is nothing new; ends after ``idle_timeout_s`` without an
        event (None: never). A transient error (the owner or master restarting) is retried."""
        # Checked here, when called (a generator's body would run only at the first next()).
        if isinstance(poll_interval_s, bool) or not isinstance(poll_interval_s, (int, float)) or poll_interval_s <= 0:
            raise InvalidArgument("poll_interval_s: expected a positive number of seconds")
        if idle_timeout_s is not None and (isinstance(idle_timeout_s, bool) or not isinstance(idle_timeout_s, (int, float))
                                           or idle_timeout_s < 0):
            raise InvalidArgument("idle_timeout_s: expected None or a number of seconds >= 0")
        _parse_cursor(cursor)
        return self._kv_event_stream(prefix, cursor, poll_interval_s, idle_timeout_s)

    def _kv_event_stream(self, prefix, cursor, poll_interval_s, idle_timeout_s):
        import time
        idle_since = time.monotonic()
        while True:
            try:
                events, cursor_next = self.poll_kv_events(prefix, cursor)
            except (Closed, Timeout):
                events, cursor_next = [], cursor
            for e in events:
                yield e
            if events:
                idle_since = time.monotonic()
            cursor = cursor_next
            if not events:
                if idle_timeout_s is not None and time.monotonic() - idle_since >= idle_timeout_s:
                    return
                time.sleep(poll_interval_s)

    def register_segments_with_cuda(self) -> None:
        """cudaHostRegister every mapped segment in this process, so the KV kernels can copy to
        and from value_ptrs. Raises (never falls back to unregistered memory) when CUDA or the
        registration is unavailable."""
        self._c.register_segments_with_cuda()

    # -- tools -----------------------------------------------------------------------------
    def ping(self) -> None:
        self._c.ping()
