"""Replica admission policies: whole groups, min top-up, hard max, priorities, TP invariance."""

import pytest

import fluxon
from fluxon.sglang import HiCacheStorageConfig, storage_key
from fluxon.sglang.admission import AdmissionConfig, admission_identity, admit, budget_args, group_id


def ids(n, rank=0, size=2):
    cfg = HiCacheStorageConfig(tp_rank=rank, tp_size=size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="m")
    return [admission_identity(storage_key("p", f"h{i}", cfg), rank, size) for i in range(n)]


def test_eager_and_none():
    assert admit(ids(4), AdmissionConfig("eager"), [2, 2]) == [True] * 4
    assert admit(ids(4), AdmissionConfig("none"), [2, 2]) == [False] * 4


def test_kv_score_only_whole_groups_high_scores():
    scores = [0.9, 0.8, 0.2, 0.9, 0.1, 0.1]
    mask = admit(ids(6), AdmissionConfig("kv_score_only", 0.5), [2, 2, 2], scores)
    assert mask == [True, True, True, True, False, False]  # group 2 mean 0.55 >= 0.5


def test_kv_score_low_only_inclusive_threshold_and_low_first():
    scores = [0.55, 0.55, 0.9, 0.9, 0.1, 0.3]
    mask = admit(ids(6), AdmissionConfig("kv_score_low_only", 0.55), [2, 2, 2], scores)
    assert mask == [True, True, False, False, True, True]
    # max cap keeps the lowest-scored group first and never cuts one
    capped = admit(ids(6), AdmissionConfig("kv_score_low_only", 0.55, max_replica_pages_per_batch=3), [2, 2, 2],
                   scores)
    assert capped == [False, False, False, False, True, True]


def test_min_top_up_takes_whole_groups_past_the_minimum():
    scores = [0.1, 0.1, 0.1, 0.2, 0.2, 0.2, 0.3]
    mask = admit(ids(7), AdmissionConfig("kv_score_only", 0.9, min_replica_pages=2), [3, 3, 1], scores)
    # high scores first: the 0.3 group (1 page) is not enough, so the 0.2 group joins, whole
    assert mask == [False, False, False, True, True, True, True]


def test_max_cap_skips_groups_that_do_not_fit_and_keeps_smaller_ones():
    mask = admit(ids(6), AdmissionConfig("eager", max_replica_pages_per_batch=3), [4, 1, 1])
    assert sum(mask) <= 3
    assert mask[:4] == [False] * 4  # the group of 4 never fits, and is not cut
    assert mask[4:] == [True, True]


def test_tp_invariant_decisions():
    scores = [0.5] * 8  # all ties: the identity decides the order
    cfg = AdmissionConfig("kv_score_only", 0.5, max_replica_pages_per_batch=4)
    m0 = admit(ids(8, rank=0), cfg, [2, 2, 2, 2], scores)
    m1 = admit(ids(8, rank=1), cfg, [2, 2, 2, 2], scores)
    assert m0 == m1 and sum(m0) == 4
    assert ids(3, rank=0) == ids(3, rank=1)
    assert ids(1, rank=0, size=2) != ids(1, rank=0, size=4)  # the TP size stays in the identity


def test_validation():
    with pytest.raises(fluxon.InvalidArgument):
        AdmissionConfig.from_dict({"policy": "sometimes"})
    with pytest.raises(fluxon.InvalidArgument):
        AdmissionConfig.from_dict({"policy": "eager", "colour": 1})
    with pytest.raises(fluxon.InvalidArgument):
        admit(ids(3), AdmissionConfig("eager"), [1, 1])
    with pytest.raises(fluxon.InvalidArgument):
        admit(ids(2), AdmissionConfig("kv_score_only"), [2], None)
    with pytest.raises(fluxon.InvalidArgument):
        admit(ids(2), AdmissionConfig("eager"), [True, 1])


def test_prefix_and_ratio_policies_decide_whole_groups_from_depth_and_identity():
    root = admit(ids(6), AdmissionConfig("prefix_root_only", root_pages=3), [2, 2, 2])
    assert root == [True, True, True, True, False, False]  # groups starting at depth 0 and 2
    assert admit(ids(6), AdmissionConfig("prefix_root_only", root_pages=3), [2, 2, 2], depth_start=10) == [False] * 6
    end = admit(ids(6), AdmissionConfig("prefix_end_depth_ratio", ratio=0.25), [2, 2, 2], depth_start=2)
    assert end == [False, False, False, False, True, True]  # ends past 0.75 * 8 = 6
    sample = admit(ids(400, size=2), AdmissionConfig("ratio_only", ratio=0.3))
    assert 80 < sum(sample) < 160
    assert sample == admit(ids(400, rank=1, size=2), AdmissionConfig("ratio_only", ratio=0.3))  # TP-invariant


def test_content_depths_place_each_group_where_its_keys_sit_in_the_prefix():
    root = AdmissionConfig("prefix_root_only", root_pages=3)
    assert admit(ids(4), root, [2, 2], depths=[0, 1, 2, 3]) == [True] * 4  # groups start at depth 0 and 2
    assert admit(ids(4), root, [2, 2], depths=[10, 11, 12, 13]) == [False] * 4  # a radix node deep in the tree
    assert admit(ids(4), root, [2, 2], depth_start=10, depths=[0, 1, 2, 3]) == [True] * 4  # the depths decide
    end = AdmissionConfig("prefix_end_depth_ratio", ratio=0.25)
    # Deepest known end 8: groups ending past 6 are the newest turn's.
    assert admit(ids(4), end, [2, 2], depths=[4, 5, 6, 7]) == [False, False, True, True]
    shallow = AdmissionConfig("prefix_depth_ratio", ratio=0.5)
    assert admit(ids(4), shallow, [2, 2], depths=[0, 1, 6, 7]) == [True, True, False, False]
    with pytest.raises(fluxon.InvalidArgument, match="content_depths"):
        admit(ids(2), root, None, depths=[0])
    with pytest.raises(fluxon.InvalidArgument, match="content_depths"):
        admit(ids(2), root, None, depths=[0, -1])


def test_kv_score_pressure_budget_names_the_candidates_and_hands_the_cap_to_the_owner():
    """The client's half: kv_score_only's candidates (the cap is not applied here: the owner scales
    it by its eviction pressure), each group's mean score as its priority, ids and shares that are
    the same on every TP rank."""
    cfg = AdmissionConfig("kv_score_pressure_budget", 0.5, max_replica_pages_per_batch=2)
    scores = [0.9, 0.8, 0.2, 0.9, 0.1, 0.1]
    m0 = admit(ids(6, rank=0), cfg, [2, 2, 2], scores)
    assert m0 == [True, True, True, True, False, False]  # 4 candidate pages past the cap of 2: the owner cuts
    assert m0 == admit(ids(6, rank=1), cfg, [2, 2, 2], scores)
    b0 = budget_args(ids(6, rank=0), cfg, [2, 2, 2], scores, 2)
    b1 = budget_args(ids(6, rank=1), cfg, [2, 2, 2], scores, 2)
    assert b0 == b1
    assert b0["replica_budget_pages"] == 2 and b0["replica_decision_shares"] == 2
    assert b0["replica_group_priorities"] == pytest.approx([0.85, 0.55, 0.1])
    assert b0["replica_group_ids"] == [group_id(ids(6)[i]) for i in (0, 2, 4)]
    assert all(0 <= g < 2 ** 64 for g in b0["replica_group_ids"])
    with pytest.raises(fluxon.InvalidArgument, match="max_replica_pages_per_batch"):
        AdmissionConfig.from_dict({"policy": "kv_score_pressure_budget"})
    with pytest.raises(fluxon.InvalidArgument, match="scores"):
        admit(ids(2), cfg, [2], None)
