"""An output limit above the engines' context limit is refused before prefill runs the prompt, in vLLM
0.23.0's words (renderers/params.py ``TokenizeParams``); the limit is what the instances' ``/v1/models``
report, read by the health loop."""

from __future__ import annotations

import asyncio

import pytest

from tests.proxy.test_errors import assert_error_shape

LIMIT = 2048


async def _ready(handle, role: str = "decode") -> None:
    for _ in range(200):
        if handle.pool.max_model_len(role) is not None:
            return
        await asyncio.sleep(0.02)
    pytest.fail("the health loop never read max_model_len from /v1/models")


@pytest.mark.parametrize(("path", "field"), [("/v1/completions", "max_tokens"),
                                             ("/v1/chat/completions", "max_tokens"),
                                             ("/v1/chat/completions", "max_completion_tokens")])
async def test_an_impossible_output_limit_is_refused_before_prefill(stubs, proxy, http, path, field):
    p = await stubs("prefill", "p0", max_model_len=LIMIT)
    d = await stubs("decode", "d0", max_model_len=LIMIT)
    handle = await proxy(p, d, health_interval_s=0.05)
    await _ready(handle)
    body = {"model": "deepseek-r1", field: 1_000_000}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "a b c"})
    async with http.post(handle.url + path, json=body) as resp:
        answer = await resp.json()
    assert resp.status == 400
    assert_error_shape(answer, 400, "BadRequestError")
    assert answer["error"]["param"] == field
    assert answer["error"]["message"].startswith(
        f"{field}=1000000 cannot be greater than max_model_len=max_total_tokens={LIMIT}. "), answer
    assert p.engine.requests == [] and d.engine.requests == []  # no engine did any work for it


async def test_a_limit_within_the_context_goes_to_the_engines(stubs, proxy, http):
    p = await stubs("prefill", "p0", max_model_len=LIMIT)
    d = await stubs("decode", "d0", max_model_len=LIMIT)
    handle = await proxy(p, d, health_interval_s=0.05)
    await _ready(handle)
    async with http.post(handle.url + "/v1/completions",
                         json={"model": "deepseek-r1", "prompt": "a b c", "max_tokens": LIMIT}) as resp:
        await resp.read()
    assert resp.status == 200  # whether the prompt fits beside it is the engine's to judge
    assert len(p.engine.requests) == 1 and len(d.engine.requests) == 1


async def test_the_smallest_decode_limit_counts_and_an_unknown_one_refuses_nothing(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d0 = await stubs("decode", "d0", max_model_len=4096)
    d1 = await stubs("decode", "d1", max_model_len=1024)
    handle = await proxy(p, d0, d1, health_interval_s=0.05)
    await _ready(handle)
    for _ in range(100):
        if handle.pool.max_model_len("decode") == 1024:
            break
        await asyncio.sleep(0.02)
    assert handle.pool.max_model_len("decode") == 1024
    assert handle.pool.max_model_len("prefill") is None  # its /v1/models has no max_model_len
    async with http.post(handle.url + "/v1/completions",
                         json={"model": "deepseek-r1", "prompt": "a", "max_tokens": 2000}) as resp:
        assert resp.status == 400
    d1_state = handle.pool.get("d1")
    handle.pool.remove("d1")
    assert d1_state is not None and handle.pool.max_model_len("decode") == 4096
