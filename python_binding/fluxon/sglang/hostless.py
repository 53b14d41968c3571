"""Hostless HiCache: SGLang calls Fluxon directly, native kernels move the bytes (design sections
"Backup 时序", "Prefetch 与 Restore 时序", "SGLang Node Storage 状态", "失败处理").

Backup of a radix node: one put batch with ``atomic_group_lens=[len(node_pages)]``; the node's
``storage_staged / storage_local_ready / storage_pending / storage_backed`` follow the put and
its ``KvFuture`` (``poll()`` drives them, as SGLang's scheduler polls futures).

Restore across TP ranks: every rank runs ``get_start``; the ranks agree on the minimum
``transferable_len`` through the injected collective; when they differ, each rank cancels its
handle and retries once with the common complete-group prefix; a second disagreement gives a
unified miss. After ``get_transfer`` every rank passes a commit gate: only when every rank holds a
plan does any rank restore; otherwise every rank releases what it holds and counts 0 restored
tokens. The collective is a callable the caller injects: ``allgather(value) -> list`` of every
rank's value, in rank order (torch.distributed all_gather_object in SGLang; a barrier in tests).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import fluxon

from .admission import AdmissionConfig, admission_identity, admit, budget_args


@dataclass
class NodeStorage:
    """The Fluxon storage fields of one radix node (SGLang side; not the master route state)."""

    keys: List[str]
    parent_key: str = ""                # the parent radix node's last page key ("": the root)
    depth: int = 0                      # pages before the node in its prefix (its first page's depth)
    storage_staged: bool = False        # a hostless backup of the node is on its way
    storage_local_ready: bool = False   # written and committed; the future has not answered yet
    storage_pending: bool = False       # the KvFuture has not finished
    storage_backed: bool = False        # routes are live: shared backing
    future: Optional[fluxon.KvFuture] = field(default=None, repr=False)
    error: Optional[BaseException] = None


@dataclass
class RestoreResult:
    restored_pages: int
    plan_ptr: Optional[int]
    reason: str  # "hit", "miss", "tp_mismatch", "gate_rejected"
    remote_pages: int = 0  # of restored_pages, fetched from a remote owner (L3); the rest were local (L2)
    joined_pages: int = 0  # of remote_pages, joined to a fetch another call had started (in flight)


class HostlessBackend:
    def __init__(self, client: fluxon.KvClient, *, tp_rank: int = 0, tp_size: int = 1,
                 allgather: Optional[Callable[[object], List[object]]] = None,
                 admission: Optional[AdmissionConfig] = None, register_with_cuda: bool = False,
                 on_dead_leaf: Optional[Callable[[NodeStorage], None]] = None):
        self.client = client
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.allgather = allgather or (lambda v: [v])
        self.admission = admission or AdmissionConfig()
        self.on_dead_leaf = on_dead_leaf
        self._pending: List[NodeStorage] = []
        self._lock = threading.Lock()
        self.counters = {"backup_started": 0, "backup_write_failed": 0, "backup_conflict": 0, "backup_backed": 0,
                         "backup_failed": 0, "tp_mismatch_retry": 0, "tp_mismatch_miss": 0, "gate_rejected": 0,
                         "restore_failed": 0, "restored_pages": 0, "backup_stored_elsewhere": 0,
                         "owner_lost": 0, "reattached": 0}
        if register_with_cuda:
            # Failure-table row: registration failure is synchronous, never a silent fallback.
            client.register_segments_with_cuda()

    # -- the owner's death and restart --------------------------------------------------------
    def _owner_lost(self) -> None:
        """A call found the owner gone (Closed) or restarted (GenerationMismatch): the call fails
        closed (a backup not made, a restore that misses), and the client maps the owner's new
        generation now if it is back; if not, the next call that fails tries again."""
        self.counters["owner_lost"] += 1
        try:
            self.client.wait_local_segments_ready()
            self.counters["reattached"] += 1
        except fluxon.Error:
            pass

    def _lost_batch(self, waiting, batch, done) -> List[bool]:
        """A backup batch the owner's death or restart cut short: none of it is backed."""
        for i, n in zip(waiting, batch):
            n.storage_staged = False
            done[i] = False
        self.counters["backup_failed"] += len(batch)
        self._owner_lost()
        return [bool(d) for d in done]

    def _quietly(self, fn, *args) -> None:
        """A cleanup call (abort, cancel, release) of something the owner may have forgotten with
        its restart: nothing of it is left to clean there."""
        try:
            fn(*args)
        except (fluxon.Closed, fluxon.GenerationMismatch, fluxon.InvalidArgument):
            pass

    # -- backup -------------------------------------------------------------------------------
    def backup_node(self, node: NodeStorage, value_len: int, write_values: Callable[[int], None],
                    scores: Optional[Sequence[float]] = None) -> bool:
        """Writes the node's pages through a put plan (`write_values(plan_ptr)`: the native kernel,
        returning once its writes are visible) and commits them. False when the backup was not
        started or failed closed; the node's state says where it stands. The node's pages are one
        atomic group (`atomic_group_lens=[len(node_pages)]`)."""
        return self.backup_nodes([node], value_len, lambda plan, _nodes: write_values(plan),
                                 [scores] if scores is not None else None)[0]

    def backup_nodes(self, nodes: Sequence[NodeStorage], value_len: int,
                     write_values: Callable[[int, List[NodeStorage]], None],
                     scores: Optional[Sequence[Sequence[float]]] = None) -> List[bool]:
        """backup_node for several radix nodes in one put batch (SGLang's backup thread batches its
        pages the same way): each node its own atomic group, admitted on its own; one commit, one
        future for all. `write_values(plan_ptr, nodes_in_plan)` writes the plan's pages, node after
        node. When some nodes' keys are stored or on their way already (KeyConflict), those nodes
        leave the batch — whole: stored everywhere is a success, otherwise not started — and the rest
        is put once more. Returns, per node, what backup_node would."""
        done: List[Optional[bool]] = [None] * len(nodes)
        waiting = list(range(len(nodes)))
        for _attempt in range(2):
            if not waiting:
                break
            batch = [nodes[i] for i in waiting]
            keys = [k for n in batch for k in n.keys]
            depths = [n.depth + j for n in batch for j in range(len(n.keys))]
            parents = [p for n in batch for p in [n.parent_key] + n.keys[:-1]]
            groups = [len(n.keys) for n in batch]
            mask, budget = None, {}
            if self.admission.policy != "none":
                ids = [admission_identity(k, self.tp_rank, self.tp_size) for k in keys]
                sc = [x for i in waiting for x in scores[i]] if scores is not None else None
                mask = admit(ids, self.admission, groups, sc, depths=depths)
                if self.admission.policy == "kv_score_pressure_budget":  # the owner cuts to its budget
                    budget = budget_args(ids, self.admission, groups, sc, self.tp_size)
            # Each node's pages continue one another and its parent's last page: the owner's prefix chain.
            opts = fluxon.PutOptionalArgs(atomic_group_lens=groups, make_replica_task=mask is not None,
                                          make_replica_task_mask=mask, radix_parent_keys=parents,
                                          content_depths=depths, **budget)
            for n in batch:
                n.storage_staged = True
            self.counters["backup_started"] += len(batch)
            try:
                plan = self.client.local_fast_put_start(keys, value_len, opts)
            except (fluxon.Closed, fluxon.GenerationMismatch):
                return self._lost_batch(waiting, batch, done)
            except fluxon.KeyConflict as e:
                at = {keys[i]: r for i, r in zip(e.indices, e.reasons)}
                left = []
                for i, n in zip(waiting, batch):
                    n.storage_staged = False
                    hit = [at[k] for k in n.keys if k in at]
                    if not hit:
                        left.append(i)
                        continue
                    self.counters["backup_conflict"] += 1
                    if len(hit) == len(n.keys) and all(r == "exists" for r in hit):
                        n.storage_backed = True  # already stored, whole
                        done[i] = True
                    else:
                        done[i] = False  # half a group cannot be backed up: fail closed
                waiting = left
                continue
            try:
                write_values(plan, batch)
            except BaseException as exc:
                # Failure-table row: native write failed after put_start -> put_abort.
                self._quietly(self.client.put_abort, plan)
                for i, n in zip(waiting, batch):
                    n.storage_staged = False
                    n.error = exc
                    done[i] = False
                self.counters["backup_write_failed"] += len(batch)
                return [bool(d) for d in done]
            try:
                future = self.client.local_fast_put_commit(plan)
            except (fluxon.Closed, fluxon.GenerationMismatch):
                return self._lost_batch(waiting, batch, done)
            for i, n in zip(waiting, batch):
                n.future = future
                n.storage_local_ready = n.storage_pending = True
                done[i] = True
            with self._lock:
                self._pending.extend(batch)
            waiting = []
        return [bool(d) for d in done]

    def poll(self, timeout_s: float = 0.0) -> int:
        """Settles finished futures; returns how many nodes changed state."""
        with self._lock:
            pending = list(self._pending)
        changed = 0
        for node in pending:
            if not (node.future.done() or (timeout_s > 0 and node.future.wait(timeout_s))):
                continue
            try:
                node.future.result(0)
                node.storage_backed = True
                self.counters["backup_backed"] += 1
            except fluxon.Error as exc:
                # Failure-table row: the future failed in the background -> clear the staged states.
                # KeyConflict: another owner published the pages first; they stay reachable there (L3).
                node.error = exc
                self.counters["backup_stored_elsewhere" if isinstance(exc, fluxon.KeyConflict)
                              else "backup_failed"] += 1
                if self.on_dead_leaf:
                    self.on_dead_leaf(node)
            node.storage_staged = node.storage_local_ready = node.storage_pending = False
            node.future = None
            with self._lock:
                self._pending.remove(node)
            changed += 1
        return changed

    # -- restore ------------------------------------------------------------------------------
    @staticmethod
    def _aligned(n: int, group_lens: Sequence[int]) -> int:
        edge = 0
        for g in group_lens:
            if edge + g > n:
                break
            edge += g
        return edge

    def start_restore(self, keys: List[str], group_lens: Optional[Sequence[int]] = None) -> RestoreResult:
        """Collective: every rank of the TP group calls it for the same logical request."""
        groups = list(group_lens) if group_lens is not None else [1] * len(keys)
        try:
            handle, r = self.client.get_start(keys, True, groups)
        except (fluxon.Closed, fluxon.GenerationMismatch):
            # Every rank still takes part in the collectives: this one restores nothing.
            self._owner_lost()
            self.allgather(0)
            return RestoreResult(0, None, "owner_lost")
        lens = self.allgather(r.transferable_len)
        n = min(lens)
        if any(x != n for x in lens):
            # Ranks disagree: retry once with the common complete-group prefix.
            self._quietly(self.client.cancel_get_transfer, handle)
            n = self._aligned(n, groups)
            self.counters["tp_mismatch_retry"] += 1
            if n == 0:
                return RestoreResult(0, None, "miss")  # every rank saw the same lengths: all return here
            prefix_groups = []
            edge = 0
            for g in groups:
                if edge + g > n:
                    break
                prefix_groups.append(g)
                edge += g
            try:
                handle, r = self.client.get_start(keys[:n], True, prefix_groups)
            except (fluxon.Closed, fluxon.GenerationMismatch):
                self._owner_lost()
                self.allgather(-1)
                return RestoreResult(0, None, "owner_lost")
            lens2 = self.allgather(r.transferable_len)
            if any(x != n for x in lens2):
                self._quietly(self.client.cancel_get_transfer, handle)
                self.counters["tp_mismatch_miss"] += 1
                return RestoreResult(0, None, "tp_mismatch")
        if n == 0:
            self._quietly(self.client.cancel_get_transfer, handle)
            return RestoreResult(0, None, "miss")
        plan = None
        try:
            plan = self.client.get_transfer(handle, consume_prefix_len=n)
        except fluxon.Error as e:
            plan = None
            self._quietly(self.client.cancel_get_transfer, handle)  # unless the failure consumed it already
            if isinstance(e, (fluxon.Closed, fluxon.GenerationMismatch)):
                self._owner_lost()
        # TP commit gate: no rank restores unless every rank holds its plan.
        gate = self.allgather(plan is not None)
        if not all(gate):
            if plan is not None:
                self._quietly(self.client.release_views, plan)
            self.counters["gate_rejected"] += 1
            return RestoreResult(0, None, "gate_rejected")
        src = r.sources[:n] if len(r.sources) >= n else b""
        remote = n - src.count(0) if src else 0
        return RestoreResult(n, plan, "hit", remote, src.count(1) if src else 0)

    def finish_restore(self, result: RestoreResult, restore_values: Callable[[int], None],
                       rollback: Optional[Callable[[], None]] = None) -> bool:
        """Runs the native restore on the plan; the views are released after it, failed or not."""
        if result.plan_ptr is None:
            return False
        try:
            restore_values(result.plan_ptr)
        except BaseException:
            # Failure-table row: release_views first, then SGLang's rollback (the handle is consumed).
            self._quietly(self.client.release_views, result.plan_ptr)
            self.counters["restore_failed"] += 1
            if rollback:
                rollback()
            return False
        self._quietly(self.client.release_views, result.plan_ptr)
        self.counters["restored_pages"] += result.restored_pages
        return True

    def abandon(self, handle) -> None:
        """Failure-table row: give a get_start up."""
        self.client.cancel_get_transfer(handle)
