"""The load generator against a fake with fixed, known timing: metrics within 2% of the truth."""

from __future__ import annotations

import json
import random
import statistics

import pytest

from ascend_runtime.checks.http import make_session
from ascend_runtime.checks.loadgen import ThroughputConfig, run_batch, run_throughput
from ascend_runtime.checks.metrics import SLO

# First token 200 ms after the request arrives, then one every 25 ms (absolute deadlines).
X, Y, N_OUT = 0.200, 0.025, 12


def _within(measured_ms: float, truth_s: float, rel: float = 0.02) -> bool:
    return abs(measured_ms - truth_s * 1000) <= rel * truth_s * 1000


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_ttft_tpot_itl_e2el_within_two_percent(fake, api) -> None:
    """Measured means within 2% of the truth: the fake's own write times against the client's send times.

    Fake and client share one process and perf_counter, so the truth is exact
    even when the loaded 2-core box makes the fake miss its nominal schedule
    (X, Y) by a few ms; the nominal schedule is checked loosely on top.
    """
    fake.b.ttft_s, fake.b.itl_s = X, Y
    cfg = ThroughputConfig(
        endpoint=fake.url, input_len=50, output_len=N_OUT, num_prompts=8, concurrency=8, api=api, progress=False, npus=2
    )
    res = await run_throughput(cfg)
    d = res.to_dict()
    assert d["completed"] == 8 and d["failed"] == 0, d["errors"]
    log = fake.stream_log[-8:]
    assert all(len(w) == N_OUT for _, w in log)
    sends = statistics.fmean(r.start for r in res.requests)
    truth = {
        "mean_ttft_ms": statistics.fmean(w[0] for _, w in log) - sends,
        "mean_tpot_ms": statistics.fmean((w[-1] - w[0]) / (N_OUT - 1) for _, w in log),
        "mean_itl_ms": statistics.fmean(b - a for _, w in log for a, b in zip(w, w[1:])),
        "mean_e2el_ms": statistics.fmean(w[-1] for _, w in log) - sends,
    }
    off = {k: (round(d[k], 2), round(v * 1000, 2)) for k, v in truth.items() if not _within(d[k], v)}
    assert not off, off
    # the nominal schedule, loosely (the box may deschedule the fake itself)
    for key, nominal in (("median_ttft_ms", X), ("median_tpot_ms", Y), ("median_itl_ms", Y)):
        assert _within(d[key], nominal, 0.25), (key, d[key])
    # prompts sized by the server's own counts (chat adds template tokens the fit must absorb)
    assert d["total_input_tokens"] == 8 * 50
    assert d["total_output_tokens"] == 8 * N_OUT
    assert d["max_concurrent_requests"] == 8
    assert d["per_npu_output_throughput"] == pytest.approx(d["output_throughput"] / 2)
    # one wave of 8 requests, each X + 11 Y = 475 ms
    assert 0.47 < d["duration"] < 0.7


async def test_warmup_requests_are_not_measured(fake) -> None:
    cfg = ThroughputConfig(endpoint=fake.url, input_len=10, output_len=4, num_prompts=5, warmup=3, concurrency=8, progress=False)
    before = fake.requests
    d = (await run_throughput(cfg)).to_dict()
    assert d["completed"] == 5
    assert fake.requests - before >= 5 + 3  # plus the sizing probes


async def test_poisson_arrivals_follow_the_seeded_schedule(fake) -> None:
    rate, n, seed = 100.0, 20, 7
    rng = random.Random(seed)
    schedule = sum(rng.gammavariate(1.0, 1.0 / rate) for _ in range(n - 1))
    body = json.dumps({"model": "m", "prompt": "a b", "max_tokens": 2, "stream": True}).encode()
    async with make_session(10) as s:
        out = await run_batch(s, fake.url + "/v1/completions", [body] * n, None, rate, seed=seed)
    assert all(r.success for r in out.results)
    assert schedule <= out.duration < schedule + 0.5
    assert out.peak_inflight < n  # arrivals spread out, unlike an all-at-once batch


@pytest.mark.parametrize(
    ("setting", "value", "error"),
    [("error_after", 2, "stream error event: decode instance lost"), ("omit_done", True, "stream ended without [DONE]"), ("http_status", 503, "HTTP 503")],
)
async def test_failed_requests_are_counted_with_their_error(fake, setting, value, error) -> None:
    async with make_session(10) as s:
        ok_body = json.dumps({"model": "m", "prompt": "a", "max_tokens": 3, "stream": True}).encode()
        setattr(fake.b, setting, value)
        out = await run_batch(s, fake.url + "/v1/completions", [ok_body] * 3, 2, None)
    assert [r.success for r in out.results] == [False] * 3
    assert all(r.error.startswith(error) for r in out.results), out.results[0].error


async def test_slo_goodput_from_a_full_run(fake) -> None:
    fake.b.ttft_s, fake.b.itl_s = 0.05, 0.005
    cfg = ThroughputConfig(endpoint=fake.url, input_len=8, output_len=4, num_prompts=4, concurrency=4,
                           slo=SLO(ttft_ms=20), progress=False)
    d = (await run_throughput(cfg)).to_dict()
    assert d["completed"] == 4 and d["request_goodput"] == 0.0


async def test_metrics_within_two_percent_of_a_fixed_schedule_in_another_process() -> None:
    """The server in its own process writes the first token X after arrival, then one every Y (absolute
    deadlines); TTFT, TPOT and ITL measured by the load generator are within 2% of X and Y."""
    import subprocess
    import sys
    from pathlib import Path

    x, y, n_out = 0.500, 0.040, 16
    root = Path(__file__).resolve().parents[2]
    server = subprocess.Popen([sys.executable, "-m", "tests.checks.fixed_timing_server", str(x), str(y)],
                              cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        cfg = ThroughputConfig(endpoint=url, input_len=20, output_len=n_out, num_prompts=8, concurrency=8,
                               progress=False)
        d = (await run_throughput(cfg)).to_dict()
    finally:
        server.kill()
        server.wait()
    assert d["completed"] == 8 and d["failed"] == 0, d["errors"]
    assert _within(d["mean_ttft_ms"], x), d["mean_ttft_ms"]
    assert _within(d["median_ttft_ms"], x), d["median_ttft_ms"]
    assert _within(d["mean_tpot_ms"], y), d["mean_tpot_ms"]
    assert _within(d["mean_itl_ms"], y), d["mean_itl_ms"]
    assert _within(d["median_itl_ms"], y), d["median_itl_ms"]
    assert _within(d["mean_e2el_ms"], x + (n_out - 1) * y), d["mean_e2el_ms"]
