"""Robust placement over load scenarios and the history forecast rules (shrinkage, similar windows)."""

import numpy as np
import pytest

from ascend_runtime.balancer import robust, selection
from ascend_runtime.balancer.expert_map import placement_to_map, validate_map
from ascend_runtime.balancer.forecast import (
    shrinkage_coefficient,
    shrinkage_forecast,
    similar_windows,
    similar_windows_forecast,
)
from ascend_runtime.balancer.measure import replica_counts
from ascend_runtime.balancer.placement import PlacementConfig, _solve, place_from_scratch
from ascend_runtime.balancer.trace import family_trace


def _scenario_case(seed: int = 0):
    """12 layers x 24 experts, 6 ranks x 5 slots; 8 noisy scenarios around a skewed mean."""
    rng = np.random.default_rng(seed)
    mean = rng.gamma(0.6, 100.0, size=(12, 24))
    scen = mean[:, None, :] * rng.lognormal(0.0, 0.4, size=(12, 8, 24))  # [L, K, E]
    return mean, scen


def test_robust_swaps_lower_the_mean_over_scenarios_peak():
    mean, scen = _scenario_case()
    point = _solve([(mean, [mean])], 6, 5, None, None, 400)[0][0]  # planned on the point forecast
    counts = replica_counts(point, 24)
    per = robust.per_replica(scen, counts)
    ids = point.reshape(12, 6, 5)
    better = robust.refine_robust(ids, per, 200)
    before, after = robust.scenario_peaks(ids, per), robust.scenario_peaks(better, per)
    assert (after <= before + 1e-9).all() and after.mean() < 0.99 * before.mean()
    assert np.allclose(after, robust.layer_scenario_peaks(better.reshape(12, -1), scen, 6))
    # same replicas (counts unchanged), valid map (no expert twice on a rank)
    assert (replica_counts(better.reshape(12, -1), 24) == counts).all()
    assert validate_map(placement_to_map(better.reshape(12, -1), 6), 24, 6, 5) == []


def test_one_scenario_equal_to_the_forecast_changes_nothing_a_refined_plan_lacks():
    mean, _ = _scenario_case(1)
    point = _solve([(mean, [mean])], 6, 5, None, None, 400)[0][0]
    per = robust.per_replica(mean[:, None, :], replica_counts(point, 24))
    ids = point.reshape(12, 6, 5)
    # with the forecast as the only scenario the objective is the forecast peak, which the
    # mean swap search already minimised locally: no robust swap may raise it
    out = robust.refine_robust(ids, per, 50)
    assert (robust.scenario_peaks(out, per) <= robust.scenario_peaks(ids, per) + 1e-9).all()


def test_scenario_weights_are_honoured():
    mean, scen = _scenario_case(2)
    point = _solve([(mean, [mean])], 6, 5, None, None, 400)[0][0]
    per = robust.per_replica(scen, replica_counts(point, 24))
    ids = point.reshape(12, 6, 5)
    only_first = np.zeros((12, 8))
    only_first[:, 0] = 1.0
    out = robust.refine_robust(ids, per, 200, only_first)
    # weighted on scenario 0 alone == optimising scenario 0's peak
    first = robust.scenario_peaks(out, per[:, :1])
    assert (first <= robust.scenario_peaks(ids, per[:, :1]) + 1e-9).all()
    assert np.allclose(robust.scenario_peaks(out, per, only_first), first)


def test_shrinkage_coefficient_tracks_persistence():
    rng = np.random.default_rng(3)
    base = rng.normal(0, 1, size=(20, 64))
    dev = np.zeros_like(base)
    wins = []
    for _ in range(12):
        dev = 0.5 * dev + rng.normal(0, 0.3, size=base.shape)
        p = np.exp(base + dev)
        wins.append(p / p.sum(axis=1, keepdims=True) * 1e6)  # noise-free shares x tokens
    hist = np.stack(wins)
    phi = shrinkage_coefficient(hist)
    assert 0.2 < phi < 0.75  # persistence 0.5 (share space, finite history)
    stable = np.broadcast_to(hist[0], hist.shape) + rng.normal(0, 1.0, size=hist.shape)
    assert shrinkage_coefficient(np.abs(stable)) < 0.2  # pure noise: shrink to the mean
    f = shrinkage_forecast(hist)
    assert np.allclose(f.sum(axis=1), hist[-1].sum(axis=1))


def test_similar_windows_drop_pre_switch_windows():
    rng = np.random.default_rng(4)
    a, b = rng.gamma(0.5, 100.0, size=(2, 4, 64))
    regimes = [a, a, a, a, b, b, a]  # a recurring regime: the last window is `a` again
    hist = np.stack([rng.poisson(r * 20) for r in regimes]).astype(float)
    mask = similar_windows(hist)
    assert mask.shape == (7, 4)
    assert mask[[0, 1, 2, 3, 6]].all() and not mask[[4, 5]].any()
    f = similar_windows_forecast(hist)
    shares = hist / hist.sum(axis=2, keepdims=True)
    expect = shares[[0, 1, 2, 3, 6]].mean(axis=0) * hist[-1].sum(axis=1, keepdims=True)
    assert np.allclose(f, expect)


@pytest.mark.parametrize("groups,nodes", [(None, None), (8, 4)])
def test_robust_step_in_the_planner_keeps_maps_valid_and_nodes(groups, nodes):
    hist = family_trace("mean_reverting", 6, layers=4, experts=64, seed=6)
    on = place_from_scratch(hist[-1], 16, 5, groups, nodes, history=hist)
    off = place_from_scratch(hist[-1], 16, 5, groups, nodes, history=hist, config=PlacementConfig(robust_rounds=0))
    for plan in (on, off):
        assert validate_map(placement_to_map(plan, 16), 64, 16, 5) == []
    assert (replica_counts(on, 64) == replica_counts(off, 64)).all()  # the robust step only swaps
    cfg = PlacementConfig()
    pick = selection.choose(hist, 16, 5, groups, nodes, cfg)
    weights = selection.window_weights(pick.name, hist, cfg)
    assert (weights > 0).sum(axis=1).min() >= 2  # several windows carry weight: the step ran
    assert (on != off).any()
    if not groups:  # global: the weighted mean-over-windows peak of every layer did not rise
        scen = (robust.shares(hist) * pick.load.sum(axis=1)[None, :, None]).transpose(1, 0, 2)
        on_peak = robust.layer_scenario_peaks(on, scen, 16, weights)
        off_peak = robust.layer_scenario_peaks(off, scen, 16, weights)
        assert (on_peak <= off_peak + 1e-9).all() and on_peak.sum() < off_peak.sum()
    if groups:  # each node serves whole expert groups (64/8 = 8 experts per group, 4 ranks per node)
        node_groups = on.reshape(4, 4, -1) // 8  # [L, node, slots]
        for layer in node_groups:
            sets = [set(x.ravel()) for x in layer]
            assert all(not (sets[i] & sets[j]) for i in range(4) for j in range(i + 1, 4))
