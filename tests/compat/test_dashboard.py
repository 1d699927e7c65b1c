"""vLLM's standard Grafana dashboard has data on the simulators' /metrics after some traffic.

The series below are every one that dashboard's panels query (vLLM's
examples/online_serving/prometheus_grafana/grafana.json, also published as
docs.vllm.ai "examples/observability/prometheus_grafana"; it is not in the wheel): E2E Request
Latency, Token Throughput, Inter Token Latency, Time Per Output Token, Scheduler State, Time To First
Token Latency, Cache Utilization, Request Prompt Length, Request Generation Length, Finish Reason, Queue
Time, Requests Prefill and Decode Time, Max Generation Token in Sequence Group. Every query filters on
``model_name="$model_name"``.
"""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.compat.conftest import MODEL

#: series -> True if the panel needs it to move (rate/increase of a counter or histogram), False for a gauge
DASHBOARD_SERIES = {
    "vllm:e2e_request_latency_seconds_bucket": True, "vllm:e2e_request_latency_seconds_sum": True,
    "vllm:e2e_request_latency_seconds_count": True,
    "vllm:prompt_tokens_total": True, "vllm:generation_tokens_total": True,
    "vllm:inter_token_latency_seconds_bucket": True, "vllm:inter_token_latency_seconds_sum": True,
    "vllm:inter_token_latency_seconds_count": True,
    "vllm:request_time_per_output_token_seconds_bucket": True,
    "vllm:request_time_per_output_token_seconds_sum": True,
    "vllm:request_time_per_output_token_seconds_count": True,
    "vllm:num_requests_running": False, "vllm:num_requests_waiting": False,
    "vllm:time_to_first_token_seconds_bucket": True, "vllm:time_to_first_token_seconds_sum": True,
    "vllm:time_to_first_token_seconds_count": True,
    "vllm:kv_cache_usage_perc": False,
    "vllm:request_prompt_tokens_bucket": True, "vllm:request_generation_tokens_bucket": True,
    "vllm:request_success_total": True,
    "vllm:request_queue_time_seconds_sum": True,
    "vllm:request_prefill_time_seconds_sum": True, "vllm:request_decode_time_seconds_sum": True,
    "vllm:request_max_num_generation_tokens_sum": True,
}


async def test_standard_dashboard_series_have_data(client, target):
    for _ in range(3):
        await client.completions.create(model=MODEL, prompt="one two three four", max_tokens=6)
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                             stream=True)
    values: dict[str, float] = {}
    seen: set[str] = set()
    async with aiohttp.ClientSession() as http:
        for sim in target.sims:  # Prometheus scrapes every instance; the panels sum over them
            async with http.get(sim.url + "/metrics") as r:
                text = await r.text()
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if s.labels.get("model_name") == MODEL:
                        seen.add(s.name)
                        values[s.name] = values.get(s.name, 0.0) + s.value
    missing = set(DASHBOARD_SERIES) - seen
    assert not missing, missing
    flat = [name for name, moving in DASHBOARD_SERIES.items() if moving and values[name] <= 0]
    assert not flat, flat
