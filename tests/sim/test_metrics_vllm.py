"""The simulator's /metrics are vLLM 0.23.0's: names and types of the release surface, labels model_name and
engine, vLLM's bucket boundaries, and the values vLLM's stat loggers record (vllm/v1/metrics/loggers.py,
stats.py), including on a decode instance whose KV was transferred."""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from ascend_runtime.engine.releases import METRICS
from ascend_runtime.engine.surface import load_surface
from ascend_runtime.planner import load_plan
from ascend_runtime.proxy.health import parse_vllm_load
from ascend_runtime.render.objects.common import Context
from ascend_runtime.render.objects.monitoring import dashboard_json
from ascend_runtime.sim import server as sim_server
from tests.sim.test_engine_core import engine, run_steps
from tests.sim.test_pd import PROXY_PREFILL_PARAMS

MODEL = "deepseek-ai/DeepSeek-R1"


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def total(fams: dict, family: str, sample: str, **labels: str) -> float:
    """Sum of ``sample`` over the series of ``family`` matching ``labels``."""
    return sum(s.value for s in fams[family].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


async def scrape(http, h) -> tuple[str, dict]:
    async with http.get(f"{h.url}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return text, families(text)


async def traffic(http, h) -> None:
    for _ in range(3):
        async with http.post(f"{h.url}/v1/completions", json={"prompt": "a b c d", "max_tokens": 5}) as r:
            assert r.status == 200
    async with http.post(f"{h.url}/v1/completions", json={"prompt": "a b c d", "max_tokens": 5, "n": 2}) as r:
        assert r.status == 200


async def test_every_vllm_family_is_in_the_release_surface_with_its_type(sim, http):
    surface = load_surface("0.23.0").metrics
    for overrides in ({}, {"mtp": True}, {"role": "prefill"}):
        h = await sim(**overrides)
        await traffic(http, h)
        _, fams = await scrape(http, h)
        vllm = {n: f.type for n, f in fams.items() if n.startswith("vllm:")}
        assert len(vllm) >= 33, sorted(vllm)  # 6 gauges, 12 counters, 15 histograms (+4 with MTP)
        wrong = {n: (t, surface.get(n)) for n, t in vllm.items() if surface.get(n) != t}
        assert not wrong, wrong
        assert all(n.startswith("ascend_sim:") for n in fams if not n.startswith("vllm:"))
        assert ("vllm:spec_decode_num_drafts" in vllm) == bool(overrides.get("mtp"))


async def test_labels_are_model_name_and_engine_per_dp_rank(sim, http):
    h = await sim()  # A2 decode: DP32
    await traffic(http, h)
    _, fams = await scrape(http, h)
    for name, fam in fams.items():
        if not name.startswith("vllm:"):
            continue
        engines = {s.labels.get("engine") for s in fam.samples}
        assert engines == {str(i) for i in range(32)}, name
        if name != "vllm:cache_config_info":
            assert {s.labels.get("model_name") for s in fam.samples} == {MODEL}, name
    info = fams["vllm:cache_config_info"].samples[0].labels
    assert "model_name" not in info and info["block_size"] == "128" and info["enable_prefix_caching"] == "True"
    reasons = {s.labels["finished_reason"] for s in fams["vllm:request_success"].samples}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}


def _bounds(fams: dict, name: str) -> list[float]:
    les = []
    for s in fams[name].samples:
        if s.name.endswith("_bucket") and s.labels["engine"] == "0":
            les.append(float(s.labels["le"]))
    return les


async def test_histogram_buckets_are_vllms(sim, http):
    h = await sim()
    _, fams = await scrape(http, h)
    inf = float("inf")
    latency = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0, inf]
    tokens = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, inf]  # 1-2-5 up to max_model_len
    itl = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
           inf]
    expected = {
        "vllm:time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                             2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, inf],
        "vllm:inter_token_latency_seconds": itl, "vllm:request_time_per_output_token_seconds": itl,
        "vllm:iteration_tokens_total": [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, inf],
        "vllm:request_params_n": [1, 2, 5, 10, 20, inf],
    }
    for name in ("e2e_request_latency", "request_queue_time", "request_inference_time", "request_prefill_time",
                 "request_decode_time"):
        expected[f"vllm:{name}_seconds"] = latency
    for name in ("request_prompt_tokens", "request_generation_tokens", "request_max_num_generation_tokens",
                 "request_params_max_tokens", "request_prefill_kv_computed_tokens"):
        expected[f"vllm:{name}"] = tokens
    for name, bounds in expected.items():
        assert _bounds(fams, name) == bounds, name


async def test_request_level_histograms_and_counters_after_traffic(sim, http):
    h = await sim()
    await traffic(http, h)  # 3 requests + one with n=2: 5 sequences of 4 prompt + 5 generated tokens
    _, f = await scrape(http, h)
    for name in ("e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds", "request_inference_time_seconds",
                 "request_time_per_output_token_seconds", "time_to_first_token_seconds"):
        assert total(f, f"vllm:{name}", f"vllm:{name}_count") == 5, name
    assert total(f, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum") == 20
    assert total(f, "vllm:request_generation_tokens", "vllm:request_generation_tokens_sum") == 25
    assert total(f, "vllm:request_params_max_tokens", "vllm:request_params_max_tokens_sum") == 25
    assert total(f, "vllm:request_prefill_kv_computed_tokens", "vllm:request_prefill_kv_computed_tokens_sum") == 20
    # n and the largest generation per request: once per request (its n choices finish together)
    assert total(f, "vllm:request_params_n", "vllm:request_params_n_count") == 4
    assert total(f, "vllm:request_params_n", "vllm:request_params_n_sum") == 3 + 2
    assert total(f, "vllm:request_max_num_generation_tokens", "vllm:request_max_num_generation_tokens_sum") == 20
    assert total(f, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 5 * 4
    assert total(f, "vllm:iteration_tokens_total", "vllm:iteration_tokens_total_sum") == 20 + 25
    assert total(f, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 20
    assert total(f, "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total", source="local_compute") == 20
    assert total(f, "vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == 20
    assert total(f, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 0
    assert total(f, "vllm:generation_tokens", "vllm:generation_tokens_total") == 25
    assert total(f, "vllm:request_success", "vllm:request_success_total", finished_reason="length") == 5
    assert total(f, "vllm:num_preemptions", "vllm:num_preemptions_total") == 0
    assert total(f, "vllm:engine_sleep_state", "vllm:engine_sleep_state", sleep_state="awake") == 32


async def test_decode_counts_the_transferred_prompt_and_times_from_arrival(sim, http, monkeypatch):
    p = await sim(role="prefill", instance="p0", link_gbps=8, speedup=2.0)  # KV pulls take >= 144 ms wall
    d = await sim(role="decode", instance="d0", speedup=100.0)
    prompt = " ".join(["w"] * 4096)
    async with http.post(f"{p.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "min_tokens": 1,
                                                          "kv_transfer_params": PROXY_PREFILL_PARAMS}) as r:
        kv = (await r.json())["kv_transfer_params"]
    during = []
    real_pull = sim_server.pull

    async def pull(*args, **kwargs):  # type: ignore[no-untyped-def]
        during.append(families(d.state.metrics.exposition().decode()))  # the metrics while the pull runs
        return await real_pull(*args, **kwargs)

    monkeypatch.setattr(sim_server, "pull", pull)
    async with http.post(f"{d.url}/v1/completions", json={"prompt": prompt, "max_tokens": 3,
                                                          "kv_transfer_params": kv}) as r:
        assert r.status == 200
        pull_s = float(r.headers["x-kv-transfer-ms"]) / 1000
        await r.read()
    (f,) = during  # waiting for remote KV counts as waiting, reason "deferred" (loggers.py record)
    assert total(f, "vllm:num_requests_waiting_by_reason", "vllm:num_requests_waiting_by_reason",
                 reason="deferred") == 1
    assert total(f, "vllm:num_requests_waiting", "vllm:num_requests_waiting") == 1
    _, f = await scrape(http, d)
    # the consumer counts the whole prompt, as loaded from the KV connector (stats.py PrefillStats)
    assert total(f, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 4096
    assert total(f, "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total",
                 source="external_kv_transfer") == 4096
    assert total(f, "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_by_source_total", source="local_compute") == 0
    assert total(f, "vllm:prompt_tokens_cached", "vllm:prompt_tokens_cached_total") == 4096
    assert total(f, "vllm:external_prefix_cache_hits", "vllm:external_prefix_cache_hits_total") == 4096
    assert total(f, "vllm:request_prefill_kv_computed_tokens", "vllm:request_prefill_kv_computed_tokens_sum") == 0
    # TTFT and queue time run from the request's arrival, so they include the KV pull
    assert total(f, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum") >= pull_s
    assert total(f, "vllm:request_queue_time_seconds", "vllm:request_queue_time_seconds_sum") >= pull_s
    _, pf = await scrape(http, p)
    assert total(pf, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == 4096
    assert total(pf, "vllm:external_prefix_cache_hits", "vllm:external_prefix_cache_hits_total") == 0


async def test_spec_decode_counters_with_mtp(sim, http):
    h = await sim(mtp=True, mtp_acceptance=0.5)
    await traffic(http, h)
    _, f = await scrape(http, h)
    drafts = total(f, "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_drafts_total")
    accepted = total(f, "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and total(f, "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_draft_tokens_total") \
        == drafts
    assert 0 <= accepted <= drafts
    assert total(f, "vllm:spec_decode_num_accepted_tokens_per_pos", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                 position="0") == accepted


async def test_one_inter_token_latency_per_output_even_with_mtp():
    e = engine(mtp=True, mtp_acceptance=1.0)
    s = e.submit(10, 9, prefilled=True)
    steps = 0
    while not s.finished:
        await run_steps(e, 1)
        steps += 1
    assert steps == 5 and s.generated == 9  # 2 tokens a step
    assert e.metrics.ttft.n == 1 and e.metrics.itl.n == steps - 1  # vLLM: one observation per engine output


async def test_the_kits_readers_find_their_metrics(sim, http):
    h = await sim()
    await traffic(http, h)
    text, fams = await scrape(http, h)
    samples = {s.name for f in fams.values() for s in f.samples}
    local = load_plan("local")  # the dashboard as rendered (the template assembles names and picks per release)
    dashboard = dashboard_json(Context(local), with_balancer=True)
    wanted = set(re.findall(r"vllm:[a-z_:]+", dashboard))
    assert wanted and not wanted - samples, wanted - samples
    for family in METRICS.values():
        assert family in fams, family
    kv, waiting = parse_vllm_load(text)  # the proxy's routing input (ascend_runtime/proxy/health.py)
    assert kv is not None and waiting == 0
    assert abs(kv - h.state.engine.kv_usage) < 1e-9
