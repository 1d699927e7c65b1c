"""The planner survives any scrape: one bad /metrics answer of the proxy or of a prefill engine is a failed sample
for that cycle (counted, logged), never an exception out of the planner loop."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

import ascend_runtime.pdplanner.daemon as daemon
from ascend_runtime.pdplanner.daemon import DaemonConfig, PDPlanner
from ascend_runtime.pdplanner.decide import PlannerConfig
from ascend_runtime.pdplanner.observe import parse, parse_engine_prompts
from tests.pdplanner.test_daemon import INTERVAL, FakeProxy, _sample
from tests.pdplanner.test_decide import POOL, SLO

#: answers of the proxy's /metrics no sample can come from: (body, status)
BAD: dict[str, tuple[bytes, int]] = {
    "not UTF-8": (b"ascend_proxy_requests_total 1\n\xff\xfe\xfd\n", 200),
    "garbage": (b"<html><body>502 Bad Gateway</body></html>", 200),
    "binary": (bytes(range(256)) * 64, 200),
    "larger than the bound": (b"# " + b"x" * (17 << 20) + b"\n", 200),
    "NaN counter": (b'ascend_proxy_requests_total{outcome="success"} NaN\n', 200),
    "negative counter": (b'ascend_proxy_requests_total{outcome="success"} -5\n', 200),
    "infinite gauge": (b'ascend_proxy_inflight{role="prefill",instance="p0"} 1e400\n', 200),
    "bucket without le": (b"ascend_proxy_ttft_seconds_bucket 3\n", 200),
    "bucket le not a number": (b'ascend_proxy_ttft_seconds_bucket{le="soon"} 3\n', 200),
    "bad labels": (b"ascend_proxy_requests_total{a=b} 1\n", 200),
    "server error": (b"oops", 500),
    "timeout": (b"", 200),  # answered after the (shortened) scrape timeout
}


class Flaky(FakeProxy):
    """The fake proxy, answering its scrape number ``bad_at`` with ``answer`` (and hanging for ``timeout``)."""

    def __init__(self, answer: str, bad_at: int) -> None:
        super().__init__()
        self.answer, self.bad_at, self.served = answer, bad_at, 0

    async def metrics(self, request: web.Request) -> web.Response:
        self.served += 1
        if self.served - 1 != self.bad_at:
            return await super().metrics(request)
        if self.answer == "timeout":
            await asyncio.sleep(5)
        body, status = BAD[self.answer]
        return web.Response(body=body, status=status, content_type="text/plain")


@pytest.mark.parametrize("answer", sorted(BAD))
async def test_a_bad_proxy_scrape_is_a_failed_sample_and_the_loop_goes_on(answer: str, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(daemon, "PROXY_SCRAPE_TIMEOUT_S", 0.5)
    fake = Flaky(answer, bad_at=1)
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    ticks = iter(i * INTERVAL for i in range(100))
    async with TestServer(app, host="127.0.0.1") as server:
        cfg = DaemonConfig(metrics_url=str(server.make_url("/metrics")), dry_run=True, interval_s=0.01,
                           default_prompt_tokens=8192)
        planner = PDPlanner(cfg, POOL, SLO, PlannerConfig(k_intervals=2), current=(1, 1), clock=lambda: next(ticks))
        with caplog.at_level(logging.WARNING, logger="ascend_runtime.pdplanner"):
            await asyncio.wait_for(planner.run(max_cycles=4), timeout=60)  # the loop itself, not one cycle
    assert fake.served == 4, "the planner loop stopped after the bad scrape"
    reg = planner.metrics.registry
    assert _sample(reg, "ascend_pdplanner_scrape_errors_total") == 1
    assert _sample(reg, "ascend_pdplanner_cycle_errors_total") == 0
    assert any("scraping" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records), "a bad scrape is no fault of the planner's own"
    assert planner.cycles == 3  # three good samples were planned on, the bad one left out
    assert planner.history[-1]["decision"].reason != "no_data"


async def test_a_bad_engine_scrape_leaves_that_engine_out(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The prefill engines' /metrics (prompt lengths): a bad answer leaves that engine out of the interval."""
    monkeypatch.setattr(daemon, "ENGINE_SCRAPE_TIMEOUT_S", 0.5)
    fake = FakeProxy()
    good_engine = b"vllm:request_prompt_tokens_sum 4096\nvllm:request_prompt_tokens_count 2\n"
    engines = {"/good/metrics": good_engine, "/utf8/metrics": b"vllm:request_prompt_tokens_sum 1\n\xff\n",
               "/nan/metrics": b"vllm:request_prompt_tokens_sum NaN\nvllm:request_prompt_tokens_count 1\n",
               "/garbage/metrics": b"{not an exposition", "/slow/metrics": b""}

    async def engine(request: web.Request) -> web.Response:
        if request.path == "/slow/metrics":
            await asyncio.sleep(5)
        return web.Response(body=engines[request.path], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    for path in engines:
        app.router.add_get(path, engine)
    async with TestServer(app, host="127.0.0.1") as server:
        base = str(server.make_url("")).rstrip("/")
        cfg = DaemonConfig(metrics_url=base + "/metrics", dry_run=True)
        urls = [base + path.removesuffix("/metrics") for path in engines]
        planner = PDPlanner(cfg, POOL, SLO, PlannerConfig(), current=(1, 1), engine_urls=lambda: urls)
        async with ClientSession() as session:
            record = await planner.run_cycle(session)
    assert record is not None
    assert planner.previous is not None and list(planner.previous.engine_prompts) == [base + "/good"]


@pytest.mark.parametrize("body", [b for b, _ in BAD.values() if b])
def test_the_parsers_refuse_with_a_value_error_only(body: bytes) -> None:
    """What observe.py cannot read is a ValueError, the one exception a failed sample is (never a KeyError,
    a TypeError or an overflow from the middle of a cycle)."""
    text = body.decode("utf-8", "replace")
    for reader in (lambda: parse(text, 0.0), lambda: parse_engine_prompts(text.replace("ascend_proxy", "vllm:x"))):
        try:
            reader()
        except ValueError:
            pass
