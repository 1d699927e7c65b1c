"""The planner process against a fake proxy metrics endpoint, in dry-run mode."""

from __future__ import annotations

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ascend_runtime.pdplanner.daemon import DaemonConfig, PDPlanner
from ascend_runtime.pdplanner.decide import PlannerConfig
from ascend_runtime.proxy.metrics import ProxyMetrics
from tests.pdplanner.test_decide import POOL, SLO

INTERVAL = 30.0  # modelled seconds between scrapes (the planner's clock is injected)


class FakeProxy:
    """Proxy metrics advancing by one interval of a summarisation load (50 req/s, 128 output tokens) per scrape."""

    def __init__(self) -> None:
        self.m = ProxyMetrics()
        for role, names in (("prefill", ["p0", "p1"]), ("decode", ["d0", "d1", "d2"])):
            for n in names:
                self.m.routable.labels(role, n).set(1)
                self.m.inflight.labels(role, n).set(4)
        self.scrapes = 0

    async def metrics(self, _: web.Request) -> web.Response:
        if self.scrapes:
            requests = int(50 * INTERVAL)
            labels = {n: "success" if n == "outcome" else "200" if n == "status" else "/v1/completions"
                      for n in self.m.requests._labelnames}  # whatever labels the proxy's counter carries
            self.m.requests.labels(**labels).inc(requests)
            for _ in range(requests):
                self.m.ttft.observe(1.5)
            for _ in range(requests * 127):
                self.m.itl.observe(0.03)
        self.scrapes += 1
        return web.Response(body=generate_latest(self.m.registry), content_type="text/plain")


def _sample(registry, name: str, **labels: str) -> float | None:  # type: ignore[no-untyped-def]
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


async def test_dry_run_decides_exports_and_never_publishes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fake = FakeProxy()
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    ticks = iter(i * INTERVAL for i in range(100))
    async with TestServer(app, host="127.0.0.1") as server:
        cfg = DaemonConfig(metrics_url=str(server.make_url("/metrics")), dry_run=True, default_prompt_tokens=8192)
        planner = PDPlanner(cfg, POOL, SLO, PlannerConfig(k_intervals=2), current=(1, 1), clock=lambda: next(ticks))
        async with ClientSession() as session:
            records = [await planner.run_cycle(session) for _ in range(3)]
    reasons = [r["decision"].reason for r in records]
    assert reasons == ["no_data", "hysteresis", "slo_ttft"]
    last = records[-1]["decision"]
    assert last.change and last.prefill > 2 and last.decode == 1
    obs = records[-1]["observation"]
    assert obs.arrival_rate == 50.0 and obs.output_tokens == 128.0 and obs.instances == {"prefill": 2, "decode": 3}
    assert 1.0 <= obs.ttft_p90 <= 2.5 and obs.tpot_p50 <= 0.04
    assert planner.current == (2, 3)  # dry run: the split in service is untouched
    assert list(tmp_path.iterdir()) == []
    reg = planner.metrics.registry
    assert _sample(reg, "ascend_pdplanner_decisions_total", reason="slo_ttft", change="true") == 1
    assert _sample(reg, "ascend_pdplanner_decisions_total", reason="hysteresis", change="false") == 1
    assert _sample(reg, "ascend_pdplanner_last_decision", reason="slo_ttft") == 1
    assert _sample(reg, "ascend_pdplanner_target_instances", role="prefill") == last.prefill
    assert _sample(reg, "ascend_pdplanner_dry_run") == 1
    assert _sample(reg, "ascend_pdplanner_forecast", series="arrival_rate") == 50.0
    missing = [s.labels["series"] for f in text_string_to_metric_families(generate_latest(reg).decode())
               for s in f.samples if s.name == "ascend_pdplanner_missing_series"]
    assert any(m.startswith("prompt_tokens") for m in missing)


async def test_a_failed_scrape_is_counted_and_decides_nothing() -> None:
    cfg = DaemonConfig(metrics_url="http://127.0.0.1:9/metrics", dry_run=True)
    planner = PDPlanner(cfg, POOL, SLO, PlannerConfig(), current=(1, 1))
    async with ClientSession() as session:
        assert await planner.run_cycle(session) is None
    assert _sample(planner.metrics.registry, "ascend_pdplanner_scrape_errors_total") == 1
