"""The regime-local hedge, the default candidate set, and the vectorised planning paths."""

import numpy as np
import pytest

from ascend_runtime.balancer import selection
from ascend_runtime.balancer.forecast import similar_windows, similar_windows_std
from ascend_runtime.balancer.measure import rank_loads, replica_counts
from ascend_runtime.balancer.placement import (
    PlacementConfig,
    _pack_groups,
    _repair_pairs,
    _solve,
    pack_rounds,
    repair_duplicates,
)


def _switching(seed: int = 0) -> np.ndarray:
    """9 windows ``[W, 4, 32]``: regime a for 5 windows, then regime b for 4 (Poisson counts)."""
    rng = np.random.default_rng(seed)
    a, b = rng.gamma(0.5, 100.0, size=(2, 4, 32))
    return np.stack([rng.poisson(r * 20) for r in [a] * 5 + [b] * 4]).astype(float)


def test_similar_windows_std_is_the_spread_inside_the_current_regime():
    hist = _switching()
    mask = similar_windows(hist)
    assert mask[-4:].all() and not mask[:5].any()  # the switch is detected in every layer
    sd = similar_windows_std(hist)
    shares = hist / hist.sum(axis=2, keepdims=True)
    by_hand = shares[-4:].std(axis=0, ddof=1) * hist[-1].sum(axis=1, keepdims=True)
    assert np.allclose(sd, by_hand)
    # the spread over every window measures the distance between the regimes, far larger
    assert selection.share_std(hist).sum() > 3 * sd.sum()
    assert np.allclose(similar_windows_std(hist, mask=mask), sd)


def test_hedged_candidates_use_the_configured_std():
    hist = _switching(1)
    load = selection.forecast_of("similar", hist)
    local = PlacementConfig()
    assert local.hedge_std == "similar"
    _, hedged = selection.inputs(("ours", "similar", 0.674), hist, local)
    assert np.allclose(hedged, load + 0.674 * similar_windows_std(hist))
    _, wide = selection.inputs(("ours", "similar", 0.674), hist, PlacementConfig(hedge_std="all"))
    assert np.allclose(wide, load + 0.674 * selection.share_std(hist))
    with pytest.raises(ValueError, match="hedge_std"):
        selection.inputs(("ours", "similar", 0.674), hist, PlacementConfig(hedge_std="wide"))


def test_default_candidates_and_the_product_form():
    cfg = PlacementConfig()
    assert selection.candidates(cfg) == [("ours", r, float(h)) for r, h in cfg.history_candidates]
    prod = PlacementConfig(history_candidates=None, history_decays=(1.0,), history_rules=("shrink",),
                           history_hedges=(0.0, 0.5), baseline_candidates=("greedy",))
    assert selection.candidates(prod) == [("ours", 1.0, 0.0), ("ours", 1.0, 0.5), ("ours", "shrink", 0.0),
                                          ("ours", "shrink", 0.5), ("greedy", "last")]


def test_regime_switch_choice_plans_for_the_new_regime():
    # after a switch the held-out windows favour a rule that forgets the old regime
    hist = _switching(2)
    pick = selection.choose(hist, 8, 5, None, None, PlacementConfig())
    assert pick.name[1] in ("similar", 1.0)


def _pack_rounds_reference(ids, w, ranks, slots):
    """Round-robin LPT with a sort of the rank loads every round (the definition)."""
    rows = ids.shape[0]
    order = np.argsort(-w, axis=1, kind="stable")
    ws = np.take_along_axis(w, order, axis=1).reshape(rows, slots, ranks)
    es = np.take_along_axis(ids, order, axis=1).reshape(rows, slots, ranks)
    out = np.empty((rows, ranks, slots), dtype=np.int64)
    loads = np.zeros((rows, ranks))
    row = np.arange(rows)[:, None]
    for s in range(slots):
        dest = np.argsort(loads, axis=1, kind="stable")
        out[row, dest, s] = es[:, s]
        loads[row, dest] += ws[:, s]
    return out, np.sort(loads, axis=1)


@pytest.mark.parametrize("slots", [1, 2, 3, 4])
def test_pack_rounds_matches_the_reference_rank_loads(slots):
    rng = np.random.default_rng(slots)
    ranks, rows = 12, 40
    w = rng.gamma(0.5, 10.0, size=(rows, ranks * slots))  # continuous: no ties
    ids = np.broadcast_to(np.arange(ranks * slots), (rows, ranks * slots)).copy()
    order = np.argsort(-w, axis=1)  # pack_rounds takes its items heaviest first
    out = pack_rounds(np.take_along_axis(ids, order, axis=1), np.take_along_axis(w, order, axis=1), ranks, slots)
    _, ref_loads = _pack_rounds_reference(ids, w, ranks, slots)
    got = np.take_along_axis(w, out.reshape(rows, -1), axis=1).reshape(rows, ranks, slots).sum(axis=2)
    assert np.allclose(np.sort(got, axis=1), ref_loads)
    assert (np.sort(out.reshape(rows, -1), axis=1) == np.arange(ranks * slots)).all()  # every item once


def test_pair_repair_removes_duplicates_and_keeps_the_experts():
    rng = np.random.default_rng(3)
    rows, ranks = 50, 10
    ids = np.stack([rng.permutation(np.r_[np.arange(18), rng.integers(0, 18, size=2)]) for _ in range(rows)])
    ids = ids.reshape(rows, ranks, 2)
    ids[:, 4, 1] = ids[:, 4, 0]  # a duplicate on every row
    fast = ids.copy()
    _repair_pairs(fast)
    assert (np.sort(fast.reshape(rows, -1), axis=1) == np.sort(ids.reshape(rows, -1), axis=1)).all()
    full = repair_duplicates(ids)  # the pair pass, then the general repair for what remains
    assert not (full[:, :, 0] == full[:, :, 1]).any()
    assert (np.sort(full.reshape(rows, -1), axis=1) == np.sort(ids.reshape(rows, -1), axis=1)).all()
    assert (fast[:, :, 0] == fast[:, :, 1]).sum() < (ids[:, :, 0] == ids[:, :, 1]).sum()


def test_batched_held_out_scoring_matches_rank_loads():
    rng = np.random.default_rng(4)
    window = rng.gamma(0.5, 100.0, size=(6, 32))
    plans = np.stack([_solve([(rng.gamma(0.5, 100.0, size=(6, 32)), [window])], 8, 5, None, None, 0)[0][0] for _ in range(3)])
    mean, peak = selection._layer_loads(plans, window, 8)
    for k in range(3):
        loads = rank_loads(plans[k], window, 8)
        assert np.allclose(mean[k], loads.mean(axis=1)) and np.allclose(peak[k], loads.max(axis=1))


def test_hierarchical_batch_equals_problems_solved_one_by_one():
    rng = np.random.default_rng(5)
    loads = [rng.gamma(0.5, 100.0, size=(3, 64)) for _ in range(3)]
    together = _solve([(x, [x]) for x in loads], 16, 5, 8, 4, 50)
    for x, plan in zip(loads, together):
        alone = _solve([(x, [x])], 16, 5, 8, 4, 50)[0]
        assert (plan == alone).all()
        assert (replica_counts(plan[0], 64) >= 1).all()
    stacked = _pack_groups(np.concatenate(loads), 8, 4, 50)
    assert (stacked[3:6] == _pack_groups(loads[1], 8, 4, 50)).all()
