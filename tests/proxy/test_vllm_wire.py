"""The proxy against vLLM 0.23.0's exact answers (tests/proxy/vllm_wire.py), where the simulator once differed.

- A decode whose KV load fails streams no output and no error (vllm/entrypoints/openai/completion/serving.py,
  chat_completion/serving.py, v0.23.0: the failed output has no token and is skipped before its finish reason
  is checked): the proxy must try another prefill + decode, not relay an empty answer.
- vLLM closes a connection idle for ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` (5 s): the proxy must not send a request
  on a connection that old (aiohttp does not resend a POST whose reused connection was closed).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import InstanceSpec
from ascend_runtime.proxy.pd import stream_output_state
from ascend_runtime.proxy.server import start_proxy
from tests.proxy.vllm_wire import (
    DONE,
    Request,
    WireEngine,
    event,
    json_answer,
    sse_answer,
)

MODEL = "deepseek-v3"
KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "p0-0123abcd",
      "remote_request_id": "cmpl-x-0-1234abcd", "remote_block_ids": [7], "remote_host": "10.0.0.1",
      "remote_port": 30000, "tp_size": 8}


def prefill_script(req: Request, i: int) -> bytes:
    """The prefill answer (CompletionResponse.model_dump(), kv_transfer_params from the connector)."""
    chat = "messages" in req.body
    choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": " the", "refusal": None,
                                                       "annotations": None, "audio": None, "function_call": None,
                                                       "tool_calls": [], "reasoning": None},
                               "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None}
                              if chat else
                              {"index": 0, "text": " the", "logprobs": None, "finish_reason": "length",
                               "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                               "prompt_token_ids": None})
    rid = req.headers["x-request-id"]
    return json_answer({"id": ("chatcmpl-" if chat else "cmpl-") + rid,
                        "object": "chat.completion" if chat else "text_completion", "created": 1, "model": MODEL,
                        "choices": [choice], "service_tier": None, "system_fingerprint": None,
                        "usage": {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1,
                                  "prompt_tokens_details": None},
                        "kv_transfer_params": dict(KV, remote_request_id=f"cmpl-{rid}-0-{i:08x}")})


def chunk(chat: bool, rid: str, choice: dict[str, Any], **extra: Any) -> bytes:
    return event({"id": ("chatcmpl-" if chat else "cmpl-") + rid,
                  "object": "chat.completion.chunk" if chat else "text_completion", "created": 1, "model": MODEL,
                  "choices": [choice], **extra})


def role_chunk(rid: str) -> bytes:
    return chunk(True, rid, {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}, prompt_token_ids=None, prompt_text=None)


def usage_chunk(chat: bool, rid: str) -> bytes:
    return event({"id": ("chatcmpl-" if chat else "cmpl-") + rid,
                  "object": "chat.completion.chunk" if chat else "text_completion", "created": 1, "model": MODEL,
                  "choices": [], "usage": {"prompt_tokens": 3, "total_tokens": 3, "completion_tokens": 0}})


def failed_kv_stream(req: Request) -> bytes:
    """vLLM 0.23.0's streamed answer to a decode whose KV load failed: no output, no error event."""
    chat, rid = "messages" in req.body, req.headers["x-request-id"]
    usage = (req.body.get("stream_options") or {}).get("include_usage")
    return sse_answer(([role_chunk(rid)] if chat else []) + ([usage_chunk(chat, rid)] if usage else []) + [DONE])


def good_stream(req: Request) -> bytes:
    chat, rid = "messages" in req.body, req.headers["x-request-id"]
    events = [role_chunk(rid)] if chat else []
    for i, word in enumerate([" the", " model"]):
        last = i == 1
        if chat:
            choice = {"index": 0, "delta": {"content": word}, "logprobs": None,
                      "finish_reason": "length" if last else None}
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = None
        else:
            choice = {"index": 0, "text": word, "logprobs": None, "finish_reason": "length" if last else None,
                      "stop_reason": None, "prompt_token_ids": None, "token_ids": None}
        events.append(chunk(chat, rid, choice))
    return sse_answer(events + [DONE])


def good_json(req: Request) -> bytes:
    rid = req.headers["x-request-id"]
    return json_answer({"id": "cmpl-" + rid, "object": "text_completion", "created": 1, "model": MODEL,
                        "choices": [{"index": 0, "text": " the model", "logprobs": None, "finish_reason": "length",
                                     "stop_reason": None, "token_ids": None, "prompt_logprobs": None,
                                     "prompt_token_ids": None}],
                        "service_tier": None, "system_fingerprint": None,
                        "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2,
                                  "prompt_tokens_details": None}, "kv_transfer_params": None})


@pytest.fixture
async def wire() -> AsyncIterator[Callable[..., Any]]:
    started: list[Any] = []

    async def make(*engines: tuple[str, str, WireEngine], **cfg: Any) -> Any:
        for _, _, e in engines:
            await e.start()
            started.append(e)
        specs = [InstanceSpec(name=n, role=r, url=e.url) for n, r, e in engines]  # type: ignore[arg-type]
        proxy = await start_proxy(ProxyConfig(host="127.0.0.1", port=0, instances=specs,
                                              **{"health_interval_s": 0, **cfg}))
        started.append(proxy)
        return proxy

    yield make
    for s in reversed(started):
        await s.stop()


@pytest.mark.parametrize("chat,include_usage", [(False, False), (False, True), (True, False), (True, True)])
async def test_empty_decode_stream_is_retried_elsewhere(wire, chat: bool, include_usage: bool) -> None:
    decodes: list[str] = []

    def decode_script(name: str) -> Callable[[Request, int], bytes]:
        def script(req: Request, i: int) -> bytes:
            decodes.append(name)
            assert req.body["kv_transfer_params"]["do_remote_prefill"] is True
            return failed_kv_stream(req) if len(decodes) == 1 else good_stream(req)
        return script

    p0 = WireEngine(prefill_script)
    d0, d1 = WireEngine(decode_script("d0")), WireEngine(decode_script("d1"))
    proxy = await wire(("p0", "prefill", p0), ("d0", "decode", d0), ("d1", "decode", d1))
    body: dict[str, Any] = {"model": MODEL, "stream": True, "max_tokens": 2}
    body.update({"messages": [{"role": "user", "content": "a b c"}]} if chat else {"prompt": "a b c"})
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + path, json=body) as r:
            assert r.status == 200
            raw = await r.read()
    events = [json.loads(e[6:]) for e in raw.decode().split("\n\n") if e.startswith("data: {")]
    text = "".join((c.get("delta") or {}).get("content") or c.get("text") or "" for e in events for c in e["choices"])
    assert text == " the model", raw
    assert [c["finish_reason"] for e in events for c in e["choices"]][-1] == "length"
    assert raw.endswith(DONE) and raw.count(DONE) == 1
    assert sum("role" in (c.get("delta") or {}) for e in events for c in e["choices"]) == (1 if chat else 0)
    assert sorted(decodes) == ["d0", "d1"]  # the failed decode is not tried again for this request
    assert len(p0.requests) == 2  # a fresh prefill for the second decode: the first KV was not loaded
    assert len({r.headers["x-request-id"] for r in p0.requests + d0.requests + d1.requests}) == 4


async def test_empty_decode_stream_everywhere_is_a_clean_error(wire) -> None:
    p0 = WireEngine(prefill_script)
    d0 = WireEngine(lambda req, i: failed_kv_stream(req))
    proxy = await wire(("p0", "prefill", p0), ("d0", "decode", d0))
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/completions", json={"prompt": "a", "stream": True}) as r:
            assert r.status == 503  # no decode left for this request, each named with its failure
            err = (await r.json())["error"]
    assert err["code"] == 503 and "without any output" in err["message"] and "d0" in err["message"]


def test_stream_output_state_on_engine_bytes() -> None:
    rid = "r"
    assert stream_output_state(role_chunk(rid)) is None
    assert stream_output_state(role_chunk(rid) + usage_chunk(True, rid)) is None
    assert stream_output_state(role_chunk(rid) + DONE) is False
    assert stream_output_state(DONE) is False
    assert stream_output_state(role_chunk(rid) + b'data: {"choices":[{"index":0,"delta":{"cont') is None  # partial
    assert stream_output_state(role_chunk(rid) + chunk(True, rid, {"index": 0, "delta": {"content": " a"}})) is True
    assert stream_output_state(chunk(True, rid, {"index": 0, "delta": {"reasoning": "x"}})) is True
    assert stream_output_state(chunk(False, rid, {"index": 0, "text": " a", "finish_reason": None})) is True
    assert stream_output_state(chunk(False, rid, {"index": 0, "text": "", "finish_reason": "stop"})) is True
    # an engine-stage error of a stream (vLLM's create_streaming_error_response: json.dumps) is an answer
    assert stream_output_state(b'data: {"error": {"message": "m", "type": "BadRequestError", "param": null, '
                               b'"code": 400}}\n\n' + DONE) is True


async def test_no_request_on_a_connection_the_engine_is_closing(wire) -> None:
    # scaled 1:10 from the defaults: engines close idle connections after 0.5 s (vLLM: 5 s), the proxy
    # reuses one for at most 0.4 s (engine_keepalive_s default 4 s)
    p0 = WireEngine(prefill_script, keepalive_s=0.5)
    d0 = WireEngine(lambda req, i: good_json(req), keepalive_s=0.5)
    proxy = await wire(("p0", "prefill", p0), ("d0", "decode", d0), engine_keepalive_s=0.4)
    async with aiohttp.ClientSession() as http:
        statuses = []
        for pause in (0.6, 0.0, 0.0):  # the third request comes at once: its connections are reused
            async with http.post(proxy.url + "/v1/completions", json={"prompt": "a b c", "max_tokens": 2}) as r:
                statuses.append(r.status)
                body = await r.read()
            assert r.status != 200 or json.loads(body)["choices"][0]["text"] == " the model"
            await asyncio.sleep(pause)
    assert statuses == [200, 200, 200]
    assert d0.dropped == p0.dropped == 0
    assert len(d0.requests) == 3 and d0.connections == 2  # reused once, never past the engine's keep-alive
