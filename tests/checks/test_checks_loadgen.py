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
    (X, Y) by a few ms; on top, the fake is checked never to write early.
    """
    fake.b.ttft_s, fake.b.itl_s = X, Y
    cfg = ThroughputConfig(
        endpoint=fake.url, input_len=50, output_len=N_OUT, num_prompts=8, concurrency=8, api=api, progress=False, npus=2
    )
    res = await run_throughput(cfg)
    d = res.to_dict()
    assert d["completed"] == 8 and d["failed"] == 0, d["errors"]
    log = fake.stream_log[-8:]
    # chat: the role chunk with the first token is a token event too, as `vllm bench serve` counts it
    assert all(len(w) == N_OUT + (api == "chat") for _, w in log)
    sends = statistics.fmean(r.start for r in res.requests)
    truth = {
        "mean_ttft_ms": statistics.fmean(w[0] for _, w in log) - sends,
        "mean_tpot_ms": statistics.fmean((w[-1] - w[0]) / (N_OUT - 1) for _, w in log),
        "mean_itl_ms": statistics.fmean(b - a for _, w in log for a, b in zip(w, w[1:])),
        "mean_e2el_ms": statistics.fmean(w[-1] for _, w in log) - sends,
    }
    off = {k: (round(d[k], 2), round(v * 1000, 2)) for k, v in truth.items() if not _within(d[k], v)}
    assert not off, off
    # the fake kept a real schedule: a busy box can make it late, never early
    for arrival, w in log:
        content = w[1:] if api == "chat" else w  # the role chunk goes with the first token
        for i, t in enumerate(content):
            assert t - arrival >= X + i * Y - 0.001, (i, t - arrival)
    # prompts sized by the server's own counts (chat adds template tokens the fit must absorb)
    assert d["total_input_tokens"] == 8 * 50
    assert d["total_output_tokens"] == 8 * N_OUT
    assert d["max_concurrent_requests"] == 8
    assert d["per_npu_output_throughput"] == pytest.approx(d["output_throughput"] / 2)
    # one wave of 8 requests, each at least X + 11 Y = 475 ms; the run lasts as long as the slowest
    assert d["duration"] >= max(w[-1] for _, w in log) - min(r.start for r in res.requests) > X + (N_OUT - 1) * Y - 0.001


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


async def test_a_batch_that_fails_midway_leaves_no_request_running(fake) -> None:
    """Arrivals that cannot be drawn (a gamma scale that underflowed) end the batch with that error; the requests
    already sent are cancelled with it, not left to fail later on a closed session ("Task exception was never
    retrieved")."""
    import asyncio

    body = json.dumps({"model": "m", "prompt": "a b", "max_tokens": 50, "stream": True}).encode()
    async with make_session(10) as s:
        with pytest.raises(ValueError, match="gammavariate"):
            await run_batch(s, fake.url + "/v1/completions", [body] * 3, None, 5.0, burstiness=1e308)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and "run_batch" in repr(t)]
    assert left == []


@pytest.mark.parametrize(("options", "named"), [
    (dict(request_rate=5.0, burstiness=1e308), "--burstiness"),
    (dict(request_rate=1e-9), "more than a day"),
    (dict(request_rate=2e6), "--request-rate"),
])
def test_arrival_settings_that_cannot_run_are_refused(options: dict, named: str) -> None:
    cfg = ThroughputConfig(endpoint="http://127.0.0.1:9", input_len=8, output_len=4, num_prompts=4, **options)
    with pytest.raises(ValueError, match=named):
        cfg.validate()
    ThroughputConfig(endpoint="http://127.0.0.1:9", input_len=8, output_len=4, num_prompts=4, request_rate=5.0,
                     burstiness=1000.0).validate()  # the bounds themselves are fine


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
    deadlines) and reports when it really wrote each (GET /stream-log). TTFT, TPOT, ITL and E2EL measured
    by the load generator are within 2% of that kept schedule. A busy host can make the server late
    against X and Y; it cannot make the load generator's numbers disagree with what the server did."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import aiohttp

    assert "CLOCK_MONOTONIC" in time.get_clock_info("perf_counter").implementation, \
        "server and client instants are compared across processes: perf_counter must be CLOCK_MONOTONIC"
    x, y, n_out = 0.500, 0.040, 16
    root = Path(__file__).resolve().parents[2]
    server = subprocess.Popen([sys.executable, "-m", "tests.checks.fixed_timing_server", str(x), str(y)],
                              cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        cfg = ThroughputConfig(endpoint=url, input_len=20, output_len=n_out, num_prompts=8, concurrency=8,
                               progress=False)
        res = await run_throughput(cfg)
        async with aiohttp.ClientSession() as session, session.get(url + "/stream-log") as resp:
            kept = [entry for entry in await resp.json() if len(entry["writes"]) == n_out][-8:]
    finally:
        server.kill()
        server.wait()
    d = res.to_dict()
    assert d["completed"] == 8 and d["failed"] == 0, d["errors"]
    assert len(kept) == 8, kept
    # the server kept a real schedule: no write before its deadline (it may be late, never early)
    for entry in kept:
        for i, w in enumerate(entry["writes"]):
            assert w - entry["arrival"] >= x + i * y - 0.001, (i, w - entry["arrival"])
    sends = statistics.fmean(r.start for r in res.requests)
    writes = [entry["writes"] for entry in kept]
    gaps = [b - a for w in writes for a, b in zip(w, w[1:])]
    truth = {
        "mean_ttft_ms": statistics.fmean(w[0] for w in writes) - sends,
        "mean_tpot_ms": statistics.fmean((w[-1] - w[0]) / (n_out - 1) for w in writes),
        "mean_itl_ms": statistics.fmean(gaps),
        "median_itl_ms": statistics.median(gaps),
        "mean_e2el_ms": statistics.fmean(w[-1] for w in writes) - sends,
    }
    off = {k: (round(d[k], 2), round(v * 1000, 2)) for k, v in truth.items() if not _within(d[k], v)}
    assert not off, off
