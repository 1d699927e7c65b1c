"""decide_split on fixed load snapshots: which split of the flexible groups, and why."""

from __future__ import annotations

from ascend_runtime.pdplanner.decide import (
    GroupPool,
    Load,
    PlannerConfig,
    PlannerState,
    Slo,
    StagePool,
    decide_split,
    headroom,
    requirement,
)
from ascend_runtime.perf import model as pm

SP = pm.StageShape("atlas-800i-a2", "prefill", 2, 8, 16, max_num_seqs=16, max_num_batched_tokens=16384, nodes=2)
SD = pm.StageShape("atlas-800i-a2", "decode", 32, 1, 32, max_num_seqs=72, max_num_batched_tokens=72, nodes=4)
#: 12 groups of 4 A2 nodes: each one decode instance or two prefill instances.
POOL = GroupPool(StagePool(SP, 2), StagePool(SD, 4), 0, 0, 12, 2, 1, 1, 1)
SLO = Slo(5.0, 0.15)
CHAT = Load(20.0, 2048, 2048)
SUMMARISE = Load(30.0, 8192, 256)


def run(load: Load, k: int, cfg: PlannerConfig, n: int, t0: float = 0.0, state: PlannerState | None = None):
    out, state = [], state or PlannerState()
    for i in range(n):
        d = decide_split(load, k, POOL, SLO, cfg, state, t0 + 30.0 * i)
        state, k = d.state, d.prefill_groups
        out.append(d)
    return out


def test_summaries_move_the_fewest_groups_to_prefill_that_give_the_margin() -> None:
    cfg = PlannerConfig(k_intervals=2)
    ds = run(SUMMARISE, 4, cfg, 2)
    assert [d.reason for d in ds] == ["hysteresis", "slo_ttft"]
    last = ds[-1]
    assert last.change and last.prefill_groups > 4
    req = requirement(SUMMARISE, POOL.as_pool(), SLO, cfg)
    assert headroom(POOL, last.prefill_groups, req) >= 1 + cfg.margin
    assert headroom(POOL, last.prefill_groups - 1, req) < 1 + cfg.margin  # one group fewer would not do
    assert (last.prefill, last.decode) == POOL.counts(last.prefill_groups)


def test_chat_after_summaries_moves_groups_back_to_decode() -> None:
    ds = run(Load(60.0, 2048, 2048), 8, PlannerConfig(k_intervals=1), 1)
    assert ds[0].reason == "slo_tpot" and ds[0].change and ds[0].prefill_groups < 8


def test_steady_when_the_split_has_the_margin() -> None:
    d = decide_split(CHAT, 4, POOL, SLO, PlannerConfig(), PlannerState(), 0.0)
    assert d.reason == "steady" and not d.change and d.prefill_groups == 4


def test_pool_exhausted_takes_the_most_headroom() -> None:
    heavy = Load(400.0, 2048, 2048)
    d = decide_split(heavy, 1, POOL, SLO, PlannerConfig(k_intervals=1), PlannerState(), 0.0)
    req = requirement(heavy, POOL.as_pool(), SLO, PlannerConfig())
    best = max(POOL.feasible(), key=lambda k: headroom(POOL, k, req))
    assert d.reason == "pool_exhausted" and d.change and d.prefill_groups == best
    again = decide_split(heavy, best, POOL, SLO, PlannerConfig(k_intervals=1), d.state, 30.0)
    assert again.reason == "pool_exhausted" and not again.change


def test_rate_limit_and_minimums() -> None:
    cfg = PlannerConfig(k_intervals=1, max_changes_per_hour=1)
    first = decide_split(SUMMARISE, 4, POOL, SLO, cfg, PlannerState(), 0.0)
    assert first.change
    second = decide_split(Load(60.0, 2048, 2048), first.prefill_groups, POOL, SLO, cfg, first.state, 600.0)
    assert second.reason == "rate_limited" and not second.change
    assert second.prefill_groups == first.prefill_groups
    # min_decode 6 caps how far summaries may pull groups to prefill
    capped = GroupPool(POOL.prefill, POOL.decode, 0, 0, 12, 2, 1, 1, 6)
    d = decide_split(Load(60.0, 8192, 256), 4, capped, SLO, PlannerConfig(k_intervals=1), PlannerState(), 0.0)
    assert capped.counts(d.prefill_groups)[1] >= 6


def test_idle_unattainable_and_no_data_move_nothing() -> None:
    cfg = PlannerConfig(k_intervals=1)
    assert decide_split(Load(0.0, 2048, 2048), 4, POOL, SLO, cfg, PlannerState(), 0.0).reason == "idle"
    d = decide_split(CHAT, 4, POOL, Slo(5.0, 0.001), cfg, PlannerState(), 0.0)
    assert d.reason == "slo_unattainable" and not d.change and "TPOT" in d.detail
    d = decide_split(None, 4, POOL, SLO, cfg, PlannerState(), 0.0)
    assert d.reason == "no_data" and not d.change and d.prefill_groups == 4


def test_a_spike_inside_the_band_is_hysteresis() -> None:
    cfg = PlannerConfig(k_intervals=3)
    state, reasons = PlannerState(), []
    for i, load in enumerate([SUMMARISE, CHAT, SUMMARISE, CHAT]):
        d = decide_split(load, 4, POOL, SLO, cfg, state, 30.0 * i)
        state = d.state
        assert not d.change
        reasons.append(d.reason)
    assert reasons == ["hysteresis", "steady", "hysteresis", "steady"]


def test_no_group_leaves_a_stage_whose_measured_latency_misses_its_slo() -> None:
    """Summaries want groups moved to prefill; with decode's measured median TPOT over the SLO the move is
    held (observed_slo_miss), and a measured TTFT miss holds a move towards decode the same way."""
    from dataclasses import replace

    cfg = PlannerConfig(k_intervals=1)
    assert run(SUMMARISE, 4, cfg, 1)[-1].change  # what the model alone does
    held = run(replace(SUMMARISE, tpot_observed_s=0.4), 4, cfg, 1)[-1]
    assert not held.change and held.reason == "observed_slo_miss", held
    assert "measured median TPOT 400 ms > SLO 150 ms" in held.detail, held.detail
    chat = Load(60.0, 2048, 2048)
    assert run(chat, 8, cfg, 1)[-1].change
    assert run(replace(chat, ttft_observed_s=9.0), 8, cfg, 1)[-1].reason == "observed_slo_miss"
