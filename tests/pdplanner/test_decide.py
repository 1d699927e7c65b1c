"""The decision function on fixed load snapshots: each decision and its reason."""

from __future__ import annotations

import math

import pytest

from ascend_runtime.pdplanner.decide import (
    Load,
    PlannerConfig,
    PlannerState,
    Pool,
    Slo,
    StagePool,
    decide,
    requirement,
)
from ascend_runtime.perf import model as pm

#: 8 CM384 nodes: prefill DP2 x TP8 (1 node), decode DP32 x TP1 (2 nodes).
POOL = Pool(8, StagePool(pm.StageShape("cm384", "prefill", 2, 8, 16, max_num_batched_tokens=16384), 1),
            StagePool(pm.StageShape("cm384", "decode", 32, 1, 32, max_num_seqs=96), 2))
SLO = Slo(ttft_s=2.0, tpot_s=0.050)
SUMMARISE = Load(50.0, 8192, 128)  # long prompts, short answers
CHAT = Load(150.0, 512, 1024)  # short prompts, long answers


def run(load: Load, current: tuple[int, int], cfg: PlannerConfig, intervals: int, t0: float = 0.0,
        state: PlannerState | None = None, step_s: float = 30.0):
    """Decide ``intervals`` times on the same load, applying changes; returns every decision."""
    out, state = [], state or PlannerState()
    for i in range(intervals):
        d = decide(load, current, POOL, SLO, cfg, state, t0 + i * step_s)
        state, current = d.state, (d.prefill, d.decode)
        out.append(d)
    return out


def test_ttft_bound_summarisation_moves_capacity_to_prefill() -> None:
    ds = run(SUMMARISE, (2, 3), PlannerConfig(k_intervals=3), 3)
    assert [d.reason for d in ds] == ["hysteresis", "hysteresis", "slo_ttft"]
    assert [d.change for d in ds] == [False, False, True]
    last = ds[-1]
    assert last.prefill > 2 and last.decode < 3
    assert POOL.nodes_used(last.prefill, last.decode) <= POOL.nodes
    # the fewest NPUs: one prefill instance less would miss the requirement
    assert last.prefill == math.ceil(last.requirement.need_p) and last.decode == 1


def test_tpot_bound_chat_moves_capacity_to_decode() -> None:
    ds = run(CHAT, (4, 2), PlannerConfig(k_intervals=2), 2)
    assert [d.reason for d in ds] == ["hysteresis", "slo_tpot"]
    assert ds[-1].change and ds[-1].decode == 3 and ds[-1].prefill == 1


def test_hysteresis_holds_on_noise() -> None:
    cfg = PlannerConfig(k_intervals=3)
    base = requirement(CHAT, POOL, SLO, cfg)
    # a rate where decode needs just over 2 instances: inside the margin band of 2
    rate = CHAT.arrival_rate * 2.05 / base.need_d
    current, state, reasons = (1, 2), PlannerState(), []
    for i in range(24):
        noisy = Load(rate * (1 + 0.04 * (-1) ** i * (i % 3) / 2), CHAT.prompt_tokens, CHAT.output_tokens)
        d = decide(noisy, current, POOL, SLO, cfg, state, 30.0 * i)
        state = d.state
        assert not d.change
        reasons.append(d.reason)
    assert set(reasons) <= {"hysteresis", "steady"} and "hysteresis" in reasons


def test_a_single_spike_does_not_change_the_split() -> None:
    cfg = PlannerConfig(k_intervals=3)
    state, current = PlannerState(), (1, 3)
    for i, load in enumerate([CHAT, SUMMARISE, CHAT, SUMMARISE, CHAT]):
        d = decide(load, current, POOL, SLO, cfg, state, 30.0 * i)
        state = d.state
        assert not d.change
    assert state.streak <= 1


def test_rate_limit_holds_a_second_change_within_the_hour() -> None:
    cfg = PlannerConfig(k_intervals=1, max_changes_per_hour=1)
    first = decide(SUMMARISE, (2, 3), POOL, SLO, cfg, PlannerState(), 0.0)
    assert first.change and first.reason == "slo_ttft"
    second = decide(CHAT, (first.prefill, first.decode), POOL, SLO, cfg, first.state, 600.0)
    assert not second.change and second.reason == "rate_limited"
    assert (second.prefill, second.decode) == (first.prefill, first.decode)
    later = decide(CHAT, (first.prefill, first.decode), POOL, SLO, cfg, second.state, 3700.0)
    assert later.change and later.reason == "slo_tpot"


def test_pool_exhaustion_is_reported_and_the_split_fits() -> None:
    heavy = Load(200.0, 8192, 256)
    cfg = PlannerConfig(k_intervals=1)
    d = decide(heavy, (2, 3), POOL, SLO, cfg, PlannerState(), 0.0)
    assert d.reason == "pool_exhausted"
    assert POOL.nodes_used(d.prefill, d.decode) <= POOL.nodes
    assert d.change and d.prefill > 2
    again = decide(heavy, (d.prefill, d.decode), POOL, SLO, cfg, d.state, 30.0)
    assert again.reason == "pool_exhausted" and not again.change


def test_idle_shrinks_to_one_of_each() -> None:
    ds = run(Load(0.0, 2048, 2048), (3, 2), PlannerConfig(k_intervals=2), 2)
    assert [d.reason for d in ds] == ["hysteresis", "idle"]
    assert (ds[-1].prefill, ds[-1].decode) == (1, 1)


def test_unattainable_tpot_and_missing_data_change_nothing() -> None:
    d = decide(CHAT, (1, 3), POOL, Slo(2.0, 0.005), PlannerConfig(k_intervals=1), PlannerState(), 0.0)
    assert d.reason == "slo_unattainable" and not d.change and "TPOT" in d.detail
    d = decide(None, (1, 3), POOL, SLO, PlannerConfig(), PlannerState(), 0.0)
    assert d.reason == "no_data" and not d.change


def test_steady_when_the_current_split_is_the_optimum() -> None:
    d = decide(CHAT, (1, 3), POOL, SLO, PlannerConfig(), PlannerState(), 0.0)
    assert d.reason == "steady" and not d.change and d.optimum == (1, 3)


@pytest.mark.parametrize("rate", [10.0, 40.0, 160.0])
def test_requirement_scales_with_the_arrival_rate(rate: float) -> None:
    a = requirement(Load(rate, 2048, 512), POOL, SLO, PlannerConfig())
    b = requirement(Load(2 * rate, 2048, 512), POOL, SLO, PlannerConfig())
    assert b.need_p == pytest.approx(2 * a.need_p) and b.need_d == pytest.approx(2 * a.need_d)


def test_a_measured_tpot_over_the_slo_never_scales_decode_down() -> None:
    """SUMMARISE on (2, 3) (the 8-node pool full): the model moves capacity to prefill and takes decode down
    to 1; with the proxy measuring a median TPOT of 423 ms against a 50 ms SLO, decode keeps its 3."""
    modelled = run(SUMMARISE, (2, 3), PlannerConfig(k_intervals=1), 1)[-1]
    assert modelled.change and modelled.decode < 3  # what the model alone asks
    measured = Load(50.0, 8192, 128, tpot_observed_s=0.423)
    d = run(measured, (2, 3), PlannerConfig(k_intervals=1), 1)[-1]
    assert d.decode == 3 and not d.change, d
    assert "measured median TPOT 423 ms > SLO 50 ms" in d.detail, d.detail
    # a lighter load the model serves with 1P + 1D: the measured miss grows decode by one
    light = Load(5.0, 8192, 128)
    assert run(light, (1, 1), PlannerConfig(k_intervals=1), 1)[-1].reason == "steady"
    grown = run(Load(5.0, 8192, 128, tpot_observed_s=0.423), (1, 1), PlannerConfig(k_intervals=1), 1)[-1]
    assert grown.change and (grown.prefill, grown.decode) == (1, 2) and grown.reason == "slo_tpot", grown


def test_a_measured_ttft_over_the_slo_grows_prefill_when_the_model_is_steady() -> None:
    steady = run(CHAT, (1, 3), PlannerConfig(k_intervals=1), 1)[-1]
    measured = Load(150.0, 512, 1024, ttft_observed_s=5.0)
    d = run(measured, (steady.prefill, steady.decode), PlannerConfig(k_intervals=1), 1)[-1]
    assert d.prefill == steady.prefill + 1 and d.reason == "slo_ttft", d
    within = Load(150.0, 512, 1024, ttft_observed_s=0.5, tpot_observed_s=0.01)  # measured within: the model decides
    assert run(within, (steady.prefill, steady.decode), PlannerConfig(k_intervals=1), 1)[-1].reason == steady.reason
