"""Storage keys that pin the bytes.

``storage_key = key_prefix + ":" + page_hash + component + config suffix + geometry + tag`` where

- ``component``: ``""`` for the KV pool, ``".<pool>"`` for a hybrid pool (``mamba``, ``swa``, ...),
  ``".flat"`` for the legacy tensor API (SGLang's flat data pages order bytes differently);
- config suffix: ``_<model>``, then ``_<tp_rank>_<tp_size>`` unless the pool is rank-replicated
  (MLA), ``_pp<rank>_<size>`` / ``_cp<rank>_<size>`` when those are > 1 (a tree without the
  fields has one of each: the same key as a newer tree's single rank). With
  ``should_split_heads`` each page is stored as ``tp_lcm_size / tp_size`` values, one per head group,
  whose rank part is ``_<tp_rank * split + j>_<tp_lcm_size>``: deployments of different TP sizes
  with the same ``tp_lcm_size`` share them.
- geometry: ``_<layout>_<dtype>_p<page_size>``: two deployments that differ in layout, dtype or
  page size never read each other's bytes.
- tag: ``_<extra_backend_tag>`` when set.

Attention-DP ranks are not in the key: every DP rank computes the same bytes for the same page.
"""

from __future__ import annotations

from typing import Optional

from ._compat import RankConfig, rank_config


def model_part(cfg: RankConfig) -> str:
    return "_" + "-".join((cfg.model_name or "").split("/"))


def rank_part(cfg: RankConfig, replicated: bool, head_group: Optional[int] = None) -> str:
    if replicated:
        return ""
    if head_group is not None:
        return f"_{head_group}_{cfg.tp_lcm_size}"
    return f"_{cfg.tp_rank}_{cfg.tp_size}"


def parallel_part(cfg: RankConfig) -> str:
    s = ""
    if cfg.pp_size > 1:
        s += f"_pp{cfg.pp_rank}_{cfg.pp_size}"
    if cfg.attn_cp_size > 1:
        s += f"_cp{cfg.attn_cp_rank}_{cfg.attn_cp_size}"
    return s


def dtype_name(dtype) -> str:
    s = str(dtype)
    return s[len("torch."):] if s.startswith("torch.") else s


def geometry_part(layout: Optional[str], dtype, page_size: Optional[int]) -> str:
    return f"_{layout or 'na'}_{dtype_name(dtype) if dtype is not None else 'na'}_p{page_size or 1}"


def storage_key(key_prefix: str, page_hash: str, cfg, component: Optional[str] = None,
                extra_backend_tag: Optional[str] = None, *, geometry: str = "", replicated: Optional[bool] = None,
                head_group: Optional[int] = None, rank_override: Optional[str] = None) -> str:
    """One value's key. ``rank_override`` replaces the rank part (admission identities use
    ``_tp<size>``: the same on every TP rank). ``cfg``: a ``HiCacheStorageConfig`` of any SGLang
    generation (a field it lacks reads as SGLang meant it then, ``rank_config``)."""
    cfg = rank_config(cfg)
    if replicated is None:
        replicated = bool(cfg.is_mla_model)
    comp = "" if component in (None, "", "kv", "__default__") else f".{component}"
    rank = rank_override if rank_override is not None else rank_part(cfg, replicated, head_group)
    key = f"{key_prefix}:{page_hash}{comp}{model_part(cfg)}{rank}{parallel_part(cfg)}{geometry}"
    if extra_backend_tag:
        key += f"_{extra_backend_tag}"
    return key
