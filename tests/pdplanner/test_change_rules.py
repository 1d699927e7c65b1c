"""The planner's rules for a change in the load: change-point forecast, backlog sizing, one-interval
action on overwhelming evidence, returning a backlog surge, least-busy group choice; and no flip-flop
on noise (fixed snapshots; decisions and reasons asserted)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ascend_runtime.pdplanner.actuate import GroupMover
from ascend_runtime.pdplanner.daemon import DaemonConfig, PDPlanner
from ascend_runtime.pdplanner.decide import (
    PlannerConfig,
    PlannerState,
    decide_split,
    headroom,
    overwhelming,
    projected_ttft,
    requirement,
    with_backlog,
)
from ascend_runtime.pdplanner.forecast import HoltForecaster
from ascend_runtime.pdplanner.observe import Snapshot
from tests.pdplanner.test_move_migrate import FakeBackend, FakeProxy
from tests.pdplanner.test_split import POOL, SLO, SUMMARISE

CFG = PlannerConfig(k_intervals=2)
PREFILL_CAP = requirement(SUMMARISE, POOL.as_pool(), SLO, CFG).prefill_capacity  # requests/s per instance


# ---- forecast ---------------------------------------------------------------------------------------------

def test_a_step_rebases_the_forecast_instead_of_smoothing_over_it() -> None:
    on, off = HoltForecaster(0.5, 0.0), HoltForecaster(0.5, 0.0, change_z=0.0)
    for x in (2048.0,) * 10:
        on.update(x), off.update(x)
    on.update(8192.0), off.update(8192.0)
    assert on.changed and on.forecast() == 8192.0 and on.trend == 0.0
    assert not off.changed and off.forecast() == pytest.approx(5120.0)  # halfway: the old behaviour
    assert on.sigma == pytest.approx(0.25 * 2048 * 0.2 ** 0.5)  # the step adds only its clipped threshold
    on.update(8192.0)
    assert not on.changed and on.forecast() == 8192.0
    assert on.sigma == pytest.approx(0.25 * 2048 * 0.16 ** 0.5)  # and decays with the ordinary observations


def test_no_change_point_before_the_warmup() -> None:
    f = HoltForecaster(0.5, 0.0)
    for x in (2048.0, 2048.0, 2048.0, 8192.0):  # two ordinary observations: not yet
        f.update(x)
    assert not f.changed and f.forecast() == pytest.approx(5120.0)


def test_noise_is_not_a_change_point() -> None:
    rng = np.random.default_rng(7)
    f = HoltForecaster(0.5, 0.3)
    for _ in range(2000):  # Poisson arrivals at 20 req/s counted over 30 s intervals
        f.update(rng.poisson(20 * 30) / 30)
        assert not f.changed
    assert 0.5 < f.sigma < 1.5  # about the one-interval noise, sqrt(600) / 30 = 0.8 req/s
    f.update(30.0)  # a 50 % step is many sigmas
    assert f.changed and f.forecast() == 30.0


def test_a_large_noise_estimate_raises_the_change_threshold() -> None:
    f = HoltForecaster(0.5, 0.0)
    changes = 0
    for x in (10.0, 30.0) * 20:  # noisy: sigma about 10
        f.update(x)
        changes += f.changed
    assert f.sigma > 8 and changes == 0  # learnt in the warm-up
    assert not f.is_change_point(f.forecast() + 30)  # 3 sigma: noise for this series
    assert f.is_change_point(f.forecast() + 60)
    g = HoltForecaster(0.5, 0.0)
    for x in [20.0] * 10 + [10.0, 30.0] * 20:  # quiet, then much noisier than sigma says
        g.update(x)
    assert g.sigma > 8 and not g.changed  # the swings raised sigma until they were smoothed again


# ---- backlog sizing and the one-interval rule ---------------------------------------------------------------

def test_backlog_adds_the_instances_that_clear_it_within_drain_s() -> None:
    req = requirement(SUMMARISE, POOL.as_pool(), SLO, CFG)
    p = POOL.counts(4)[0]
    load = replace(SUMMARISE, backlog=200.0)
    got = with_backlog(req, load, p, CFG)
    q_ready = 200.0 + (SUMMARISE.arrival_rate - p * PREFILL_CAP) * CFG.move_s
    assert got.backlog_p == pytest.approx(q_ready / (CFG.drain_s * PREFILL_CAP))
    assert got.need_p == pytest.approx(req.need_p + got.backlog_p)
    # a backlog the current instances clear before a move would serve adds nothing
    assert with_backlog(req, replace(SUMMARISE, backlog=500.0), POOL.counts(7)[0], CFG) == req
    assert with_backlog(req, SUMMARISE, p, CFG) == req  # no backlog


def test_a_backlog_moves_more_groups_and_marks_them_as_a_surge() -> None:
    plain = [decide_split(SUMMARISE, 4, POOL, SLO, CFG, PlannerState(), 30.0 * i) for i in range(2)]
    st, ds = PlannerState(), []
    for i in range(2):
        d = decide_split(replace(SUMMARISE, backlog=200.0, backlog_growth=1.0), 4, POOL, SLO, CFG, st, 30.0 * i)
        st = d.state
        ds.append(d)
    assert [d.reason for d in ds] == ["hysteresis", "slo_ttft"]
    assert ds[-1].change and ds[-1].prefill_groups > plain[-1].prefill_groups
    assert "clear a backlog of 200" in ds[-1].detail
    assert ds[-1].state.surge == ds[-1].prefill_groups - 4
    assert plain[-1].state.surge == 0  # sized for the rate alone: nothing to return later


def test_overwhelming_evidence_acts_on_one_interval() -> None:
    load = replace(SUMMARISE, backlog=230.0, backlog_growth=7.5)  # 30 s after a switch to summaries on 4 groups
    d = decide_split(load, 4, POOL, SLO, CFG, PlannerState(), 0.0)
    assert d.change and d.reason == "slo_ttft" and d.detail.startswith("overwhelming")
    f, m = projected_ttft(d.requirement, load, POOL.counts(4)[0], CFG.interval_s)
    assert f >= 3 * SLO.ttft_s and m >= 3 * SLO.ttft_s
    assert d.state.change_times == (0.0,)  # it counts against the hourly limit like any change


@pytest.mark.parametrize("growth, why", [
    (None, "no measured backlog"),
    (0.0, "the queue is not growing"),
    (-2.0, "the queue is shrinking"),
    (1.0, "the measured growth projects under 3 x SLO"),
])
def test_without_agreeing_measurement_the_streak_still_applies(growth: float | None, why: str) -> None:
    load = replace(SUMMARISE, backlog=230.0, backlog_growth=growth)
    d = decide_split(load, 4, POOL, SLO, CFG, PlannerState(), 0.0)
    assert not d.change and d.reason == "hysteresis", why
    assert d.state.streak == 1


def test_a_measured_surge_the_forecast_does_not_share_is_not_overwhelming() -> None:
    # 6 groups: a little short on the forecast (headroom 1.05), but the measured queue jumped
    load = replace(SUMMARISE, backlog=100.0, backlog_growth=20.0)
    req = with_backlog(requirement(load, POOL.as_pool(), SLO, CFG), load, POOL.counts(6)[0], CFG)
    assert overwhelming(req, load, POOL.counts(6)[0], SLO, CFG) == ""
    d = decide_split(load, 6, POOL, SLO, CFG, PlannerState(), 0.0)
    assert d.reason == "hysteresis" and not d.change
    assert overwhelming(req, load, POOL.counts(6)[0], SLO, replace(CFG, evidence_factor=0.0)) == ""


def test_overwhelming_still_obeys_the_hourly_limit() -> None:
    load = replace(SUMMARISE, backlog=230.0, backlog_growth=7.5)
    st = PlannerState(change_times=(0.0, 60.0))
    d = decide_split(load, 4, POOL, SLO, replace(CFG, max_changes_per_hour=2), st, 120.0)
    assert d.reason == "rate_limited" and not d.change


# ---- returning a surge --------------------------------------------------------------------------------------

def test_a_cleared_backlog_returns_the_surge_the_steady_need_does_not_keep() -> None:
    st, ds = PlannerState(surge=6), []
    for i in range(2):
        d = decide_split(SUMMARISE, 10, POOL, SLO, CFG, st, 600.0 + 30 * i)
        st = d.state
        ds.append(d)
    assert [d.reason for d in ds] == ["hysteresis", "backlog_cleared"]
    last = ds[-1]
    assert last.change and last.prefill_groups == 7 and last.state.surge == 0
    steady = requirement(SUMMARISE, POOL.as_pool(), SLO, CFG)
    assert headroom(POOL, 7, steady) >= 1 + CFG.margin > headroom(POOL, 6, steady)  # one fewer would be short


def test_a_surge_returns_no_group_it_did_not_add() -> None:
    d = decide_split(SUMMARISE, 10, POOL, SLO, CFG, PlannerState(streak=1, direction=(-1, 1), surge=1), 0.0)
    assert d.reason == "backlog_cleared" and d.prefill_groups == 9


def test_a_surge_is_kept_while_its_backlog_waits_longer_than_the_slo() -> None:
    load = replace(SUMMARISE, backlog=1000.0, backlog_growth=-30.0)
    d = decide_split(load, 10, POOL, SLO, CFG, PlannerState(streak=1, direction=(-1, 1), surge=6), 0.0)
    assert d.reason == "steady" and not d.change and d.state.surge == 6 and d.state.streak == 0


def test_a_surge_is_not_returned_when_the_load_now_needs_it() -> None:
    heavy = replace(SUMMARISE, arrival_rate=45.0)  # 10 groups are what 45 req/s of summaries need
    d = decide_split(heavy, 10, POOL, SLO, CFG, PlannerState(streak=1, direction=(-1, 1), surge=6), 0.0)
    assert d.reason == "steady" and not d.change and d.state.surge == 6


# ---- no flip-flop on noise ----------------------------------------------------------------------------------

def _snapshots(rng: np.random.Generator, n: int, rate: float, prompt: float, output: float, queue: float):
    """Cumulative proxy snapshots every 30 s of a stationary load with Poisson counts and noisy lengths."""
    t, requests, prompt_sum, itl = 0.0, 0.0, 0.0, 0.0
    out = []
    for _ in range(n):
        k = rng.poisson(rate * 30)
        requests += k
        prompt_sum += k * prompt * rng.normal(1.0, 0.05)
        itl += k * (output * rng.normal(1.0, 0.05) - 1)
        out.append(Snapshot(t, requests=requests, itl_count=itl, prompt_tokens_sum=prompt_sum,
                            inflight={"prefill": float(rng.poisson(queue)), "decode": float(rng.poisson(400))},
                            ttft_buckets={1.0: 0.0, float("inf"): requests}))
        t += 30.0
    return out


@pytest.mark.parametrize("k_intervals", [2, 3])
@pytest.mark.parametrize("groups, rate, prompt, output, queue", [
    (4, 20.0, 2048, 2048, 20.0),  # chat on the stack's split
    (7, 30.0, 8192, 256, 40.0),  # summaries on 7 groups: headroom 1.22, near the 1.15 band edge
    (5, 60.0, 2048, 2048, 60.0),  # the burst on 5 groups: short, but no better split exists
])
def test_a_noisy_stationary_series_changes_nothing(k_intervals: int, groups: int, rate: float, prompt: float,
                                                   output: float, queue: float) -> None:
    cfg = DaemonConfig(metrics_url="http://unused", interval_s=30.0, dry_run=True)
    planner = PDPlanner(cfg, POOL.as_pool(), SLO, PlannerConfig(k_intervals=k_intervals), POOL.counts(groups),
                        groups=POOL)
    planner.current_k = groups
    rng = np.random.default_rng(groups * 10 + k_intervals)
    records = [planner.step(s) for s in _snapshots(rng, 240, rate, prompt, output, queue)]  # two hours
    decisions = [r["decision"] for r in records]
    assert not [d for d in decisions if d.change]
    assert planner.current_k == groups
    assert {d.reason for d in decisions} <= {"no_data", "steady", "hysteresis", "pool_exhausted"}
    assert not planner.rate.changed and not planner.prompt.changed
    loads = [r["load"] for r in records[1:]]
    assert max(ld.backlog for ld in loads) > 0 and any(ld.backlog_growth > 0 for ld in loads)  # the queue was seen


def test_the_daemon_passes_the_prefill_queue_and_its_growth() -> None:
    cfg = DaemonConfig(metrics_url="http://unused", interval_s=30.0, dry_run=True)
    planner = PDPlanner(cfg, POOL.as_pool(), SLO, PlannerConfig(k_intervals=3), POOL.counts(4), groups=POOL)
    planner.current_k = 4
    assert planner.planner.interval_s == 30.0
    planner.step(Snapshot(0.0, requests=0.0, inflight={"prefill": 0.0, "decode": 0.0}, itl_count=0.0,
                          prompt_tokens_sum=0.0, ttft_buckets={float("inf"): 0.0}))
    # 30 s of summaries at 30 req/s on 4 groups: 670 finished, the prefill queue grew to 230
    snap = Snapshot(30.0, requests=670.0, inflight={"prefill": 230.0, "decode": 0.0},
                    itl_count=670.0 * 255, prompt_tokens_sum=670.0 * 8192, ttft_buckets={float("inf"): 670.0})
    rec = planner.step(snap)
    load = rec["load"]
    assert load.arrival_rate == pytest.approx(30.0) and load.prompt_tokens == pytest.approx(8192)
    assert load.backlog == 230.0 and load.backlog_growth == pytest.approx(230.0 / 30)
    assert rec["decision"].change and rec["decision"].detail.startswith("overwhelming")  # K = 3, yet one interval


# ---- which groups move --------------------------------------------------------------------------------------

def _three_groups():  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from ascend_runtime.planner.plan import FlexGroup

    groups = [FlexGroup(f"flex-{i}", (f"n{i}",), (f"prefill-{2 * i + 1}", f"prefill-{2 * i + 2}"), (f"decode-{i + 1}",),
                        "decode") for i in range(3)]
    role = lambda n: SimpleNamespace(role="prefill" if n.startswith("prefill") else "decode")  # noqa: E731
    return SimpleNamespace(flex_groups=groups, instance=role)


async def test_the_least_busy_groups_move() -> None:
    proxy = FakeProxy({"decode-1": 30, "decode-2": 2, "decode-3": 9})
    layout = {"flex-0": "decode", "flex-1": "decode", "flex-2": "decode"}
    mover = GroupMover(_three_groups(), FakeBackend(), proxy, layout,  # type: ignore[arg-type]
                       lambda n: f"http://{n}:8000", drain_timeout_s=5, poll_s=0.01)
    assert [g.name for g, _ in mover.plan_moves(2)] == ["flex-0", "flex-1"]  # no counts: the Plan's order
    assert await mover.busy() == {"decode-1": 30.0, "decode-2": 2.0, "decode-3": 9.0}
    results = await mover.apply(2)
    assert sorted(r.group for r in results) == ["flex-1", "flex-2"] and all(r.ok for r in results)
    assert mover.layout == {"flex-0": "decode", "flex-1": "prefill", "flex-2": "prefill"}
    assert sum(r.migrated for r in results) == 11  # not the 30 streams of decode-1
    # back to decode: the prefill groups with the least in flight (ties: last first)
    back = mover.plan_moves(1, {"prefill-3": 4.0, "prefill-5": 1.0})
    assert [(g.name, to) for g, to in back] == [("flex-2", "decode")]
