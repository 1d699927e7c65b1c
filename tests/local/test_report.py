"""The local report: goodput in real time, why the published figure is far off, and host overload named."""

from __future__ import annotations

import pytest

from ascend_runtime.checks.metrics import SLO, RequestResult, ThroughputResult
from ascend_runtime.checks.smoke import ItemResult, SmokeReport
from ascend_runtime.local.host import (
    CpuSample,
    CpuUse,
    HostLoad,
    mean_modelled_step,
    parse_step_totals,
)
from ascend_runtime.local.report import LocalReport, comparison_lines, host_load
from ascend_runtime.planner import load_plan

SPEEDUP = 10.0


def _result(n: int = 64, ttft_s: float = 0.1, tpot_s: float = 0.005, failed: int = 0,
            duration_s: float = 2.0) -> ThroughputResult:
    out = 128
    ok = [RequestResult(success=True, ttft=ttft_s, latency=ttft_s + (out - 1) * tpot_s, itl=[tpot_s] * (out - 1),
                        prompt_tokens=512, output_tokens=out, content_chunks=out, usage_reported=True)
          for _ in range(n - failed)]
    bad = [RequestResult(error="HTTP 503") for _ in range(failed)]
    return ThroughputResult(ok + bad, duration_s, slo=SLO(ttft_ms=300, tpot_ms=15))


def _smoke(passed: bool = True) -> SmokeReport:
    return SmokeReport("http://x", [ItemResult("proxy GET /health", passed, "", 0.01)])


def _host(lag: float | None, others: float = 0.0, ours: float = 1.9) -> HostLoad:
    return HostLoad(lag=lag, modelled_step_ms=15.0, cpu=CpuUse(ours=ours, others=others, cpus=2), load_average=None)


def test_goodput_is_compared_in_real_time() -> None:
    result = _result(duration_s=2.0)  # 64 good requests in 2 wall seconds: 32 per wall second
    assert result.request_goodput == pytest.approx(32.0)
    report = LocalReport(_smoke(), result, [], min_goodput=3.0, speedup=SPEEDUP)
    assert report.goodput == pytest.approx(3.2)  # per real-time second
    assert report.verdict == "PASS"
    assert LocalReport(_smoke(), result, [], min_goodput=4.0, speedup=SPEEDUP).verdict == "FAIL"


def test_the_lines_speak_real_time_and_explain_the_published_figure() -> None:
    plan = load_plan("local")
    lines = "\n".join(comparison_lines(plan, _result(), _host(1.1)))
    assert "goodput: 3.2 req/s real time (32 per wall second / speedup 10)" in lines
    assert "TTFT <= 3000 ms, TPOT <= 150 ms (real time; 300 / 15 ms wall)" in lines
    assert "threshold 0.1 req/s real time" in lines
    published = next(line for line in lines.splitlines() if line.startswith("published figure"))
    assert "1.00 sequences per NPU" in published and "published figure 72" in published
    assert "behind their clock" not in published
    clock = next(line for line in lines.splitlines() if line.startswith("simulator clock"))
    assert "1.1x" in clock and "under 2x: the figures are the model's" in clock


@pytest.mark.parametrize("tpot_s", [0.001, 0.005, 0.05])
def test_the_published_figure_is_explained_by_the_runs_own_numbers(tpot_s: float) -> None:
    """The explanation is batch share x per-sequence rate ratio, each printed, and their product is the share."""
    import re

    plan = load_plan("local")
    published = next(line for line in comparison_lines(plan, _result(tpot_s=tpot_s, duration_s=128 * tpot_s + 0.1),
                                                       None) if line.startswith("published figure"))
    share = float(re.search(r"this run ([\d.]+)% of it", published).group(1))
    batch = float(re.search(r"\(([\d.]+)% of its batch\)", published).group(1))
    rate = float(re.search(r"([\d.]+)x the published point's", published).group(1))
    assert f"{batch:.3g}% x {rate:.3g} = {share:.3g}%" in published
    assert batch * rate == pytest.approx(share, rel=0.02)
    assert "costs about the same" not in published and "as expected" not in published


def test_a_goodput_miss_on_a_lagging_host_is_inconclusive_and_names_the_host() -> None:
    plan = load_plan("local")
    slow = _result(ttft_s=2.0, tpot_s=0.05, duration_s=20.0)  # every request misses its SLOs
    busy = _host(6.0, others=1.5, ours=0.5)
    report = LocalReport(_smoke(), slow, comparison_lines(plan, slow, busy), 0.1, SPEEDUP, busy)
    assert report.verdict == "INCONCLUSIVE" and not report.passed
    line = report.verdict_line()
    assert line.startswith("checks: INCONCLUSIVE") and "6.0x behind their clock" in line
    assert "overloaded by other work (other processes kept 1.5 and the stack 0.5 of 2 CPUs busy)" in line
    assert "not the deployment" in line
    assert any("bound by this host" in text for text in report.lines)
    own = _host(6.0, others=0.1, ours=1.9)
    assert "own processes need more CPU" in LocalReport(_smoke(), slow, [], 0.1, SPEEDUP, own).verdict_line()


def test_failures_stay_failures_on_a_lagging_host() -> None:
    lagging = _host(6.0, others=1.5)
    assert LocalReport(_smoke(), _result(failed=3), [], 0.0, SPEEDUP, lagging).verdict == "FAIL"
    assert LocalReport(_smoke(False), _result(), [], 0.0, SPEEDUP, lagging).verdict == "FAIL"
    slow = _result(ttft_s=2.0, duration_s=20.0)
    assert LocalReport(_smoke(), slow, [], 0.1, SPEEDUP, _host(1.2)).verdict == "FAIL"  # the host kept up
    assert "goodput 0 req/s < 0.1 (real time)" in LocalReport(_smoke(), slow, [], 0.1, SPEEDUP, _host(1.2)).verdict_line()


def test_the_lag_is_measured_tpot_over_the_modelled_step_at_speedup() -> None:
    plan = load_plan("local")
    before = {"d0": (1.0, 100.0), "d1": (2.0, 100.0)}
    after = {"d0": (2.5, 200.0), "d1": (3.5, 200.0)}  # 3 modelled seconds over 200 steps: 15 ms a step
    assert mean_modelled_step(before, after) == pytest.approx(0.015)
    host = host_load(plan, _result(tpot_s=0.006), before, after, None)
    assert host.lag == pytest.approx(0.006 / 0.0015) and host.host_bound


def test_metrics_text_and_cpu_samples() -> None:
    text = ('ascend_sim:step_modelled_seconds_bucket{le="+Inf",model_name="m"} 7.0\n'
            'ascend_sim:step_modelled_seconds_count{model_name="m"} 7.0\n'
            'ascend_sim:step_modelled_seconds_sum{model_name="m"} 0.105\n')
    assert parse_step_totals(text) == (0.105, 7.0)
    assert parse_step_totals("vllm:num_requests_running 1\n") is None
    use = CpuUse.between(CpuSample(0, total=1000, busy=400, ours=100, cpus=2), CpuSample(1, total=1200, busy=560, ours=140, cpus=2))
    assert use is not None and use.ours == pytest.approx(0.4) and use.others == pytest.approx(1.2)


def test_a_median_over_the_slo_fails_even_when_goodput_clears_its_threshold() -> None:
    """40 of 64 requests miss the TTFT SLO (median 4000 ms real time > 3000): goodput 1.2 req/s > 0.1 still FAILs."""
    fast, slow = _result(n=24, ttft_s=0.1), _result(n=40, ttft_s=0.4)
    mixed = ThroughputResult(fast.requests + slow.requests, 2.0, slo=SLO(ttft_ms=300, tpot_ms=15))
    report = LocalReport(_smoke(), mixed, [], min_goodput=0.1, speedup=SPEEDUP, host=_host(1.1))
    assert report.goodput == pytest.approx(1.2)
    assert report.verdict == "FAIL"
    assert "median TTFT 4000 ms > slo.ttft_ms 3000 ms (real time)" in report.verdict_line()
    assert LocalReport(_smoke(), mixed, [], 0.1, SPEEDUP, _host(6.0, others=1.5)).verdict == "INCONCLUSIVE"
    assert LocalReport(_smoke(), _result(tpot_s=0.02), [], 0.0, SPEEDUP, _host(1.1)).verdict_line() == (
        "checks: FAIL (median TPOT 200 ms > slo.tpot_ms 150 ms (real time))")
