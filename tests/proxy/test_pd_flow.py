"""The PD protocol through the proxy over real HTTP: handshake, relay, headers, recompute."""

from __future__ import annotations

import json

from ascend_runtime.proxy.pd import PREFILL_KV_TRANSFER_PARAMS

REQ = {"model": "deepseek-r1", "prompt": "the quick brown fox", "max_tokens": 5, "stream": True,
       "stream_options": {"include_usage": True}, "temperature": 0.5}


async def test_handshake_fields_reach_decode_exactly(stubs, proxy, http):
    p = await stubs("prefill", "p0", kv_port=31000)
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 200
        assert resp.headers["x-prefill-instance"] == "p0"
        assert resp.headers["x-decode-instance"] == "d0"
        body = await resp.read()
    # prefill got the PD copy of the request
    (preq,) = p.engine.requests
    assert preq["kv_transfer_params"] == PREFILL_KV_TRANSFER_PARAMS
    assert (preq["max_tokens"], preq["min_tokens"], preq["stream"]) == (1, 1, False)
    assert "stream_options" not in preq and preq["temperature"] == 0.5 and preq["prompt"] == REQ["prompt"]
    # decode got the original request plus the prefill's kv_transfer_params, untouched
    (dreq,) = d.engine.requests
    prefill_kv = json.loads(p.engine.sent[0])["kv_transfer_params"]
    assert dreq["kv_transfer_params"] == prefill_kv
    assert prefill_kv["remote_port"] == 31000 and prefill_kv["tp_size"] == 1
    assert {k: v for k, v in dreq.items() if k != "kv_transfer_params"} == REQ
    # the stream is relayed byte for byte
    assert body == d.engine.sent[0]
    assert body.endswith(b"data: [DONE]\n\n")


async def test_non_stream_and_chat(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3}) as resp:
        assert resp.status == 200
        raw = await resp.read()
    assert raw == d.engine.sent[0]
    assert json.loads(raw)["choices"][0]["message"]["content"] == " w0 w1 w2"
    assert p.engine.requests[0]["messages"] == [{"role": "user", "content": "hi there"}]


async def test_recomputed_answer_is_continued_like_the_reference(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", recompute_after=2)
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json={**REQ, "max_tokens": 6}) as resp:
        body = await resp.read()
    texts = [json.loads(line[6:])["choices"][0]["text"] for line in body.decode().split("\n\n")
             if line.startswith("data: {")]
    # first attempt relayed w0 w1, held back the recomputed w2; the continuation is relayed whole
    assert texts[:2] == [" w0", " w1"]
    assert b"recomputed" not in body
    assert len(d.engine.requests) == 2 and len(p.engine.requests) == 2
    second = d.engine.requests[1]
    assert second["prompt"] == "the quick brown fox w0 w1 w2"
    assert second["max_tokens"] == 6 - 3 + 1  # original - tokens so far (incl. recomputed chunk) + retries
    assert second["kv_transfer_params"]["remote_block_ids"] == json.loads(p.engine.sent[1])["kv_transfer_params"][
        "remote_block_ids"]
    assert body.endswith(b"data: [DONE]\n\n")


async def test_recomputed_non_stream_answer_carries_all_text(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", recompute_after=2)
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json={"prompt": "a b", "max_tokens": 4}) as resp:
        answer = await resp.json()
    assert d.engine.requests[1]["prompt"] == "a b w0 w1"
    assert d.engine.requests[1]["max_tokens"] == 4 - 2 + 1
    assert answer["choices"][0]["text"] == " w0 w1 w0 w1 w2"


async def test_recompute_of_a_token_id_prompt_ends_the_stream_with_an_error_event(stubs, proxy, http):
    """No continuation can be built from token ids without the tokenizer: the stream ends with an error
    event naming why (a 502), instead of a continuation whose prompt is the list's repr."""
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", recompute_after=2)
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json={**REQ, "prompt": [11, 12, 13]}) as resp:
        assert resp.status == 200
        body = await resp.read()
    events = [json.loads(line[6:]) for line in body.decode().split("\n\n") if line.startswith("data: {")]
    assert [e["choices"][0]["text"] for e in events[:2]] == [" w0", " w1"]
    assert events[-1]["error"]["code"] == 502 and "send the prompt as text" in events[-1]["error"]["message"]
    assert len(d.engine.requests) == 1  # nothing garbled reached an engine
    async with http.get(px.url + "/metrics") as resp:
        text = await resp.text()
    assert 'outcome="stream_error"' in text


async def test_client_errors_are_relayed(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", data=b"not json") as resp:
        assert resp.status == 400
    # the stub prefill rejects max_tokens != 1 only if the proxy broke the protocol; here a 400 from
    # the decode (no kv params) cannot happen, so check /v1/models and the health routes instead
    async with http.get(px.url + "/v1/models") as resp:
        assert (await resp.json())["data"][0]["id"] == "deepseek-r1"
    for path in ("/health", "/healthcheck"):
        async with http.get(px.url + path) as resp:
            assert resp.status == 200
            assert (await resp.json())["decode"]["routable"] == 1


async def test_metrics_exposed(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        await resp.read()
    async with http.get(px.url + "/metrics") as resp:
        text = await resp.text()
    assert 'ascend_proxy_requests_total{endpoint="/v1/completions",outcome="success",status="200"} 1.0' in text
    assert 'ascend_proxy_routing_decisions_total{instance="d0",role="decode"} 1.0' in text
    assert "ascend_proxy_ttft_seconds_count 1.0" in text
    assert "ascend_proxy_itl_seconds_count" in text
    assert 'ascend_proxy_inflight{instance="p0",role="prefill"} 0.0' in text
