"""OpenAI surface over real HTTP: completions, chat, streaming, usage, models, health, metrics."""

from __future__ import annotations

import asyncio
import json

from prometheus_client.parser import text_string_to_metric_families

VLLM_METRICS = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_success_total", "ascend_sim:step_modelled_seconds_bucket", "ascend_sim:balancedness",
    "ascend_sim:speedup",
}


async def read_sse(resp) -> list[dict]:
    events, done = [], False
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line:
            continue
        assert line.startswith("data: "), line
        payload = line[len("data: "):]
        if payload == "[DONE]":
            done = True
            continue
        events.append(json.loads(payload))
    assert done, "stream did not end with [DONE]"
    return events


async def test_completion_non_streaming_counts_words(sim, http):
    h = await sim(instance="d-api")
    async with http.post(f"{h.url}/v1/completions",
                         json={"model": "deepseek-ai/DeepSeek-R1", "prompt": "one two three four", "max_tokens": 5,
                               "ignore_eos": True}) as r:
        assert r.status == 200
        assert r.headers["x-instance"] == "d-api"
        body = await r.json()
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9,
                             "prompt_tokens_details": None}
    assert len(body["choices"][0]["text"].split()) == 5
    assert body["choices"][0]["finish_reason"] == "length"


async def test_chat_streaming_with_usage(sim, http):
    h = await sim()
    req = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there you"}],
           "max_tokens": 7, "min_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(f"{h.url}/v1/chat/completions", json=req) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(r)
    content = [e for e in events if e["choices"]]
    # vLLM sends a role-only chunk first (chat_completion/serving.py), then one chunk per token
    assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(content) == 8 and all("role" not in e["choices"][0]["delta"] for e in content[1:])
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == []
    # 5 words + 4 per message overhead x 2 messages
    assert events[-1]["usage"] == {"prompt_tokens": 13, "completion_tokens": 7, "total_tokens": 20}


async def test_bad_requests_are_400(sim, http):
    h = await sim()
    for body in ({"prompt": "x", "max_tokens": 0}, {"prompt": "x", "model": "other"},
                 {"prompt": "x", "max_tokens": 2, "min_tokens": 3}, {"prompt": "x", "max_tokens": 40000}):
        async with http.post(f"{h.url}/v1/completions", json=body) as r:
            assert r.status == (404 if "model" in body else 400), body
            err = (await r.json())["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == r.status


async def test_models_and_health_after_startup_delay(sim, http):
    h = await sim(startup_delay=0.3)
    async with http.get(f"{h.url}/health") as r:
        assert r.status == 503
        assert r.headers["x-instance"] == h.config.instance
    await asyncio.sleep(0.35)
    async with http.get(f"{h.url}/health") as r:
        assert r.status == 200
    async with http.get(f"{h.url}/v1/models") as r:
        data = await r.json()
    assert [m["id"] for m in data["data"]] == ["deepseek-ai/DeepSeek-R1"]


async def test_metrics_parse_and_count(sim, http):
    h = await sim()
    async with http.post(f"{h.url}/v1/completions", json={"prompt": "a b c", "max_tokens": 4}) as r:
        assert r.status == 200
    async with http.get(f"{h.url}/metrics") as r:
        text = await r.text()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append(s)
    missing = VLLM_METRICS - set(samples)
    assert not missing, missing
    assert all(s.labels.get("model_name") == "deepseek-ai/DeepSeek-R1" for s in samples["vllm:prompt_tokens_total"])
    assert samples["vllm:prompt_tokens_total"][0].value == 3
    assert samples["vllm:generation_tokens_total"][0].value == 4
    assert sum(s.value for s in samples["vllm:request_success_total"]) == 1
    assert samples["ascend_sim:speedup"][0].value == 100.0
