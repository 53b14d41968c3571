"""Replica admission for put batches: which atomic groups get a replica task.

Policies (design: "低分 KV 提前 CPU write-back 策略"; the prefix and ratio policies of the
original Fluxon backend, defined here on what SGLang passes: the page keys and ``prefix_keys``):
  - ``eager`` / ``eager_all``: every group.
  - ``prefix_root_only``: groups that start within the first ``root_pages`` pages of the request
    (depth = ``len(prefix_keys)`` + position in the batch).
  - ``prefix_depth_ratio``: groups that start in the shallowest ``ratio`` share of the depth known
    at the batch's end (the most shared part of a prefix tree).
  - ``prefix_end_depth_ratio``: groups that end in the deepest ``ratio`` share (the newest turn).
  - ``ratio_only``: a stable ``ratio`` sample of groups (hash of the group's admission identity).
  - ``kv_score_only``: groups whose mean score is >= ``score_threshold``; priority = mean score.
  - ``kv_score_low_only``: groups whose mean score is <= ``score_threshold`` (inclusive);
    priority = 1 - mean score (lowest first).
  - ``kv_score_pressure_budget``: the groups of ``kv_score_only`` are candidates; the owner keeps,
    best first and whole, those that fit in ``max_replica_pages_per_batch`` x its eviction pressure
    (evicted per admitted slot, recent): no replica while the owner has room (it would be a
    duplicate), up to the cap once everything it admits pushes something out. The first TP rank's
    put of a group decides for the others behind the same owner (``budget_args``).
  - ``none``: no group.
Group rules: a group is admitted whole or skipped whole (the mask is constant inside a group).
``min_replica_pages`` tops the admitted pages up with the best remaining groups, whole, even
past the minimum. ``max_replica_pages_per_batch`` is a hard cap: groups are kept in priority order
only while they fit entirely in the remaining budget; no group is cut (kv_score_pressure_budget:
the owner applies it, scaled by its pressure).
Decisions are TP-invariant: they depend on scores and on the *admission identity* of a key (the
storage key with the TP rank removed and the TP size kept), never on the rank, so every rank of a
TP group admits the same logical groups.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..errors import InvalidArgument

POLICIES = ("none", "eager", "eager_all", "prefix_root_only", "prefix_depth_ratio", "prefix_end_depth_ratio",
            "ratio_only", "kv_score_only", "kv_score_low_only", "kv_score_pressure_budget")
# Policies that rank groups by KV scores: SGLang's storage calls carry none.
SCORE_POLICIES = ("kv_score_only", "kv_score_low_only", "kv_score_pressure_budget")


@dataclass
class AdmissionConfig:
    policy: str = "none"
    score_threshold: float = 0.5
    min_replica_pages: int = 0
    max_replica_pages_per_batch: Optional[int] = None
    ratio: float = 0.5
    root_pages: int = 128

    @classmethod
    def from_dict(cls, d: Optional[dict]) -> "AdmissionConfig":
        d = dict(d or {})
        unknown = set(d) - {"policy", "score_threshold", "min_replica_pages", "max_replica_pages_per_batch", "ratio",
                            "root_pages"}
        if unknown:
            raise InvalidArgument(f"replica_task.admission: unknown keys {sorted(unknown)}")
        c = cls(**d)
        c.validate()
        return c

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise InvalidArgument(f"replica_task.admission.policy: one of {POLICIES}, got {self.policy!r}")
        if not 0.0 <= float(self.score_threshold) <= 1.0:
            raise InvalidArgument("replica_task.admission.score_threshold: must be in [0, 1]")
        if int(self.min_replica_pages) < 0:
            raise InvalidArgument("replica_task.admission.min_replica_pages: must be >= 0")
        if self.max_replica_pages_per_batch is not None and int(self.max_replica_pages_per_batch) < 0:
            raise InvalidArgument("replica_task.admission.max_replica_pages_per_batch: must be >= 0")
        if self.policy == "kv_score_pressure_budget" and not (self.max_replica_pages_per_batch or 0) > 0:
            raise InvalidArgument("replica_task.admission.max_replica_pages_per_batch: kv_score_pressure_budget needs "
                                  "it > 0 (the replica pages of a batch at full eviction pressure)")
        if not 0.0 <= float(self.ratio) <= 1.0:
            raise InvalidArgument("replica_task.admission.ratio: must be in [0, 1]")
        if int(self.root_pages) <= 0:
            raise InvalidArgument("replica_task.admission.root_pages: must be > 0")


_RANK_SUFFIX = re.compile(r"_(\d+)_(\d+)(?=($|[._]))")


def admission_identity(storage_key: str, tp_rank: int, tp_size: int) -> str:
    """The storage key with ``_{tp_rank}_{tp_size}`` replaced by ``_tp{tp_size}``."""
    needle = f"_{tp_rank}_{tp_size}"
    pos = storage_key.rfind(needle)
    if pos < 0:
        return storage_key
    return storage_key[:pos] + f"_tp{tp_size}" + storage_key[pos + len(needle):]


def validate_groups(n: int, group_lens: Optional[Sequence[int]]) -> List[int]:
    if group_lens is None:
        return [1] * n
    if not isinstance(group_lens, (list, tuple)) or not all(
            isinstance(g, int) and not isinstance(g, bool) for g in group_lens):
        raise InvalidArgument("atomic_group_lens: expected a list of int")
    if any(g <= 0 for g in group_lens):
        raise InvalidArgument("atomic_group_lens: every group must be > 0")
    if sum(group_lens) != n:
        raise InvalidArgument(f"atomic_group_lens: sum {sum(group_lens)} != number of keys {n}")
    return list(group_lens)


def _starts(groups: Sequence[int]) -> List[int]:
    """Each group's first index."""
    starts, at = [], 0
    for g in groups:
        starts.append(at)
        at += g
    return starts


def _means(scores: Sequence[float], groups: Sequence[int]) -> List[float]:
    """Each group's mean score."""
    return [sum(scores[st:st + g]) / g for st, g in zip(_starts(groups), groups)]


def _unit_hash(identity: str) -> float:
    return int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "little") / 2.0 ** 64


def admit(identities: Sequence[str], config: AdmissionConfig, group_lens: Optional[Sequence[int]] = None,
          scores: Optional[Sequence[float]] = None, depth_start: int = 0,
          depths: Optional[Sequence[int]] = None) -> List[bool]:
    """The per-key replica mask (constant inside every group). ``depth_start``: pages of the
    request before ``identities[0]`` (SGLang's ``len(prefix_keys)``); ``depths`` (a put's
    ``content_depths``): each key's own depth in its prefix, which the depth policies then read
    instead of ``depth_start`` + position (a radix node's pages, deep in the tree)."""
    n = len(identities)
    groups = validate_groups(n, group_lens)
    if depths is not None and (len(depths) != n or any(isinstance(d, bool) or not isinstance(d, int) or d < 0
                                                       for d in depths)):
        raise InvalidArgument(f"content_depths: one depth >= 0 per key is required, got {list(depths)!r} for {n} keys")
    if config.policy in SCORE_POLICIES:
        if scores is None or len(scores) != n:
            raise InvalidArgument("scores: one score per key is required by a kv_score policy")
    starts = _starts(groups)
    chosen = [False] * len(groups)
    if config.policy == "none":
        return [False] * n
    if config.policy in ("eager", "eager_all"):
        chosen = [True] * len(groups)
        priority = [1.0] * len(groups)
    elif config.policy in ("prefix_root_only", "prefix_depth_ratio", "prefix_end_depth_ratio"):
        if depths is None:
            total = depth_start + n
            first = [depth_start + st for st in starts]
            end = [f + g for f, g in zip(first, groups)]
        else:  # each group from its first key's depth to past its last key's
            first = [int(depths[st]) for st in starts]
            end = [int(depths[st + g - 1]) + 1 for st, g in zip(starts, groups)]
            total = max(end) if end else 0
        if config.policy == "prefix_root_only":
            chosen = [f < int(config.root_pages) for f in first]
        elif config.policy == "prefix_depth_ratio":
            chosen = [f < float(config.ratio) * total for f in first]
        else:
            chosen = [e > (1.0 - float(config.ratio)) * total for e in end]
        # Shallower groups first (prefix_end_depth_ratio: deeper first) when a budget applies.
        priority = [1.0 / (1 + f) for f in first] if config.policy != "prefix_end_depth_ratio" else \
            [e / (1.0 + total) for e in end]
    elif config.policy == "ratio_only":
        chosen = [_unit_hash(identities[st]) < float(config.ratio) for st in starts]
        priority = [1.0] * len(groups)
    else:
        means = _means(scores, groups)
        thr = float(config.score_threshold)
        if config.policy in ("kv_score_only", "kv_score_pressure_budget"):
            chosen = [m >= thr for m in means]
            priority = means
        else:
            chosen = [m <= thr for m in means]
            priority = [1.0 - m for m in means]

    # Equal priorities break ties by the TP-invariant identity of the group's first key.
    def tie(i):
        return hashlib.sha256(identities[starts[i]].encode()).hexdigest()

    order = sorted(range(len(groups)), key=lambda i: (-priority[i], tie(i)))
    admitted = sum(g for g, c in zip(groups, chosen) if c)
    if admitted < int(config.min_replica_pages):
        for i in order:
            if admitted >= int(config.min_replica_pages):
                break
            if not chosen[i]:
                chosen[i] = True
                admitted += groups[i]
    if config.max_replica_pages_per_batch is not None and config.policy != "kv_score_pressure_budget":
        budget = int(config.max_replica_pages_per_batch)
        keep = [False] * len(groups)
        for i in order:
            if chosen[i] and groups[i] <= budget:
                keep[i] = True
                budget -= groups[i]
        chosen = keep
    mask: List[bool] = []
    for g, c in zip(groups, chosen):
        mask += [c] * g
    return mask


def group_id(identity: str) -> int:
    """A group's TP-invariant id on the wire: 64 bits of SHA-256 of its first key's identity."""
    return int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "little")


def budget_args(identities: Sequence[str], config: AdmissionConfig, group_lens: Optional[Sequence[int]],
                scores: Sequence[float], tp_size: int) -> dict:
    """kv_score_pressure_budget: the put options that let the owner cut ``admit``'s candidates to
    its pressure budget (``PutOptionalArgs`` fields): the pages at full pressure, each group's
    priority (its mean score) and id, and the puts that share a decision (the TP ranks)."""
    groups = validate_groups(len(identities), group_lens)
    return {"replica_budget_pages": int(config.max_replica_pages_per_batch),
            "replica_group_priorities": _means(scores, groups),
            "replica_group_ids": [group_id(identities[st]) for st in _starts(groups)],
            "replica_decision_shares": int(tp_size)}
