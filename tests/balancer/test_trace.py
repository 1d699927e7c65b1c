"""The trace families' process: the windows it steps through, and draws of the next one."""

from __future__ import annotations

import numpy as np
import pytest

from ascend_runtime.balancer.trace import FAMILIES, FamilyProcess, family_trace

SMALL = dict(layers=6, experts=32)


@pytest.mark.parametrize("family", FAMILIES)
def test_drawing_next_windows_does_not_move_the_process(family):
    """family_trace is the process stepped; drawing scenarios in between leaves the later windows as they were."""
    trace = family_trace(family, 5, seed=11, **SMALL)
    process = FamilyProcess(family, seed=11, **SMALL)
    for t in range(5):
        if t:
            process.next_scenarios(3, seed=t)
        assert np.array_equal(process.step(), trace[t])


def test_stable_draws_are_poisson_around_the_popularity_behind_the_last_window():
    process = FamilyProcess("stable", seed=3, **SMALL)
    process.step()
    draws = process.next_scenarios(400, seed=1)
    p = np.exp(process.window_logit - process.window_logit.max(axis=1, keepdims=True))
    expected = p / p.sum(axis=1, keepdims=True) * process.scale
    assert draws.shape == (400, 6, 32)
    assert np.allclose(draws.mean(axis=0), expected, rtol=0.05, atol=3.0)
    assert np.allclose(draws.var(axis=0).mean(), expected.mean(), rtol=0.1)  # Poisson: variance = mean


def test_regime_draws_stay_in_the_last_windows_regime_seven_times_in_ten():
    process = FamilyProcess("regime", seed=5, **SMALL)
    for _ in range(4):
        process.step()
    draws = process.next_scenarios(600, seed=2)
    shares = draws / draws.sum(axis=2, keepdims=True)
    regime_shares = np.exp(process.regimes) / np.exp(process.regimes).sum(axis=2, keepdims=True)
    nearest = np.array([np.abs(shares[k][None] - regime_shares).sum(axis=(1, 2)).argmin() for k in range(len(draws))])
    stay = float((nearest == process.window_regime).mean())
    assert 0.64 < stay < 0.76, stay
    others = [r for r in range(3) if r != process.window_regime]
    assert all(0.1 < float((nearest == r).mean()) < 0.2 for r in others)


def test_random_walk_draws_spread_by_the_step_the_last_window_did_not_show():
    """The next window's log-popularity is the last one's plus a fresh step: draws differ from each other
    by more than their sampling noise, and centre on the last window's popularity."""
    process = FamilyProcess("random_walk", seed=9, layers=4, experts=16)
    process.step()
    draws = process.next_scenarios(300, seed=4)
    hot = process.window_logit.argmax(axis=1)
    counts = draws[:, np.arange(4), hot]  # [K, L]: the most popular expert of each layer
    poisson_sd = np.sqrt(counts.mean(axis=0))
    assert (counts.std(axis=0) > 2 * poisson_sd).all()


@pytest.mark.parametrize("family", ["stable", "mean_reverting", "dominant"])
def test_the_informed_planner_expects_at_least_what_a_past_only_planner_gets(family):
    """The benchmark's ceiling is one: planned on draws from the process and choosing among its plans and the
    past-only ones, its mean balancedness on fresh draws is not below EPLB greedy's on the last window or ours
    on the whole history (within the noise of choosing on 32 draws)."""
    from ascend_runtime.balancer.eplb_greedy import eplb_greedy
    from ascend_runtime.balancer.measure import balancedness
    from ascend_runtime.balancer.placement import place_from_scratch
    from benchmarks.balancer_families import informed_plan

    ranks, slots = 8, 5
    process = FamilyProcess(family, seed=21, **SMALL)
    hist = np.stack([process.step() for _ in range(6)])
    plan_draws, choose_draws = process.next_scenarios(16, seed=1), process.next_scenarios(32, seed=2)
    judge = process.next_scenarios(64, seed=3)

    def expected(plan):
        return float(np.mean([balancedness(plan, w, ranks) for w in judge]))

    greedy, ours = eplb_greedy(hist[-1], ranks, slots), place_from_scratch(hist[-1], ranks, slots, history=hist)
    informed = expected(informed_plan(plan_draws, choose_draws, ranks, slots, None, None, [greedy, ours]))
    assert informed >= expected(greedy) - 2e-3
    assert informed >= expected(ours) - 2e-3
