"""Rolling-origin choice among candidates (ours on several decays/hedges, the baselines themselves)."""

import numpy as np

from ascend_runtime.balancer import selection
from ascend_runtime.balancer.eplb_greedy import eplb_greedy
from ascend_runtime.balancer.expert_map import placement_to_map, validate_map
from ascend_runtime.balancer.measure import rank_loads
from ascend_runtime.balancer.placement import PlacementConfig, _solve, place_from_scratch
from ascend_runtime.balancer.trace import FAMILIES, family_trace


def _held_out(cand, hist, ranks, slots, cfg, times):
    total = 0.0
    for t in times:
        load, hedged = selection.inputs(cand, hist[:t], cfg)
        if cand[0] == "greedy":
            plan = eplb_greedy(load, ranks, slots)
        else:
            plan = _solve([(load, [hedged])], ranks, slots, None, None, cfg.trial_swap_rounds)[0][0]
        loads = rank_loads(plan, hist[t], ranks)
        total -= loads.mean(axis=1).sum() / loads.max(axis=1).sum()
    return total


def test_choice_is_the_held_out_argmin():
    hist = family_trace("mean_reverting", 7, layers=5, experts=32, seed=3)
    cfg = PlacementConfig(trial_layers=0)
    pick = selection.choose(hist, 8, 5, None, None, cfg)
    times = range(max(2, 7 - cfg.holdout_windows), 7)
    by_hand = {c: _held_out(c, hist, 8, 5, cfg, times) for c in selection.candidates(cfg)}
    assert set(pick.scores) == set(by_hand)
    for c, v in by_hand.items():
        assert np.isclose(pick.scores[c], v)
    assert pick.name == min(by_hand, key=by_hand.get)


def test_regime_switches_pick_the_last_window_and_stable_load_the_average():
    # two popularity regimes that persist for a few windows: the last window is the best guess;
    # with only noise, averaging every window is best
    rng = np.random.default_rng(0)
    a, b = rng.gamma(0.5, 100.0, size=(2, 4, 32))
    regimes = [a, a, a, b, b, b, a, a, a]
    switching = np.stack([rng.poisson(r * 5) for r in regimes]).astype(float)
    cfg = PlacementConfig(history_decays=(1.0, 0.0), history_rules=(), history_hedges=(0.0,), baseline_candidates=(),
                          history_candidates=None)
    assert selection.choose(switching, 8, 5, None, None, cfg).name == ("ours", 1.0, 0.0)
    stable = rng.poisson(np.broadcast_to(a, (8, 4, 32)) * 5).astype(float)
    assert selection.choose(stable, 8, 5, None, None, cfg).name == ("ours", 0.0, 0.0)


def test_baseline_that_keeps_winning_is_used():
    # only greedy candidates: the plan is the winning greedy input's plan, refined (valid map)
    hist = family_trace("random_walk", 6, layers=4, experts=32, seed=1)
    cfg = PlacementConfig(history_decays=(), history_rules=(), baseline_candidates=("greedy", "greedy_decay"),
                          history_candidates=None)
    pick = selection.choose(hist, 8, 5, None, None, cfg)
    assert pick.name[0] == "greedy"
    plan = place_from_scratch(hist[-1], 8, 5, history=hist, config=cfg)
    validate_map(placement_to_map(plan, 8), 32, 8, 5)


def test_every_family_gives_valid_plans_global_and_hierarchical():
    for fam in FAMILIES:
        hist = family_trace(fam, 5, layers=3, experts=64, seed=2)
        assert hist.shape == (5, 3, 64) and (hist >= 0).all()
        for groups, nodes in ((None, None), (8, 4)):
            plan = place_from_scratch(hist[-1], 16, 5, groups, nodes, history=hist)
            validate_map(placement_to_map(plan, 16), 64, 16, 5)


def test_held_out_scores_cover_the_new_forecast_rules():
    hist = family_trace("regime", 7, layers=5, experts=32, seed=4)
    cfg = PlacementConfig(trial_layers=0)
    pick = selection.choose(hist, 8, 5, None, None, cfg)
    rules = {c[1] for c in pick.scores if c[0] == "ours"}
    assert {"shrink", "similar", 1.0, 0.5} <= rules
    # each rule's score is its own held-out record (computed by hand as for the decays)
    times = range(max(2, 7 - cfg.holdout_windows), 7)
    for c in [("ours", "shrink", 0.0), ("ours", "similar", 0.674)]:
        assert np.isclose(pick.scores[c], _held_out(c, hist, 8, 5, cfg, times))


def test_default_is_kept_without_paired_evidence():
    # the default candidate stays unless another beats it by `selection_evidence` standard errors
    hist = family_trace("stable", 7, layers=6, experts=32, seed=5)
    free = PlacementConfig(trial_layers=0, selection_default=None)
    best = selection.choose(hist, 8, 5, None, None, free)
    worst = max(best.scores, key=best.scores.get)  # the candidate with the lowest held-out total
    strict = PlacementConfig(trial_layers=0, selection_default=worst, selection_evidence=1e9)
    assert selection.choose(hist, 8, 5, None, None, strict).name == worst
    loose = PlacementConfig(trial_layers=0, selection_default=worst, selection_evidence=0.0)
    kept = selection.choose(hist, 8, 5, None, None, loose).name
    assert kept != worst and kept == best.name


def test_window_weights_match_the_forecast_rules():
    hist = family_trace("random_walk", 6, layers=3, experts=16, seed=2)
    cfg = PlacementConfig()
    for rule in (1.0, 0.5, 0.0, "shrink", "similar"):
        w = selection.window_weights(("ours", rule, 0.0), hist, cfg)
        assert w.shape == (3, 6) and np.allclose(w.sum(axis=1), 1.0)
        if rule != "shrink":  # these forecasts are exactly the weighted share averages
            shares = hist / hist.sum(axis=2, keepdims=True)
            expect = np.einsum("lw,wle->le", w, shares) * hist[-1].sum(axis=1, keepdims=True)
            assert np.allclose(selection.forecast_of(rule, hist), expect)
    assert np.allclose(selection.window_weights(("greedy", "last"), hist, cfg)[:, -1], 1.0)
