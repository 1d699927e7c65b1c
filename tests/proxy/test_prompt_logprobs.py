"""A request for the prompt's log-probabilities is served whole by one prefill instance: a decode given a
remote prefill's KV never ran the prompt (prompt_logprobs.py)."""

from __future__ import annotations

import pytest

from ascend_runtime.proxy.prompt_logprobs import needs_prompt_logprobs


@pytest.mark.parametrize(("req", "chat", "needs"), [
    ({"prompt_logprobs": 0}, False, True),
    ({"prompt_logprobs": 2}, True, True),
    ({"echo": True, "logprobs": 1}, False, True),
    ({"echo": True, "logprobs": 0}, False, True),
    ({"echo": True}, False, False),
    ({"logprobs": 3}, False, False),
    ({"echo": True, "top_logprobs": 2}, True, True),
    ({"echo": True, "logprobs": True}, True, False),  # chat's logprobs is a switch; top_logprobs asks
    ({"prompt_logprobs": None, "echo": False}, False, False),
])
def test_which_requests_need_the_prompts_log_probabilities(req: dict, chat: bool, needs: bool) -> None:
    assert needs_prompt_logprobs(req, chat) is needs


async def test_prompt_logprobs_are_answered_by_a_prefill_alone(stubs, proxy, http):
    p = await stubs("prefill", "p0", plain_requests=True)
    d = await stubs("decode", "d0")
    handle = await proxy(p, d)
    body = {"model": "deepseek-r1", "prompt": "a b c", "max_tokens": 3, "prompt_logprobs": 1}
    async with http.post(handle.url + "/v1/completions", json=body) as resp:
        answer = await resp.json()
    assert resp.status == 200, answer
    assert d.engine.requests == []  # decode never sees it
    assert p.engine.requests == [body]  # the client's request as it came: no KV handover asked
    assert answer["choices"][0]["text"].split() == ["w0", "w1", "w2"]


async def test_a_streamed_echo_with_logprobs_is_relayed_from_the_prefill(stubs, proxy, http):
    p = await stubs("prefill", "p0", plain_requests=True)
    d = await stubs("decode", "d0")
    handle = await proxy(p, d)
    body = {"model": "deepseek-r1", "prompt": "a b", "max_tokens": 2, "echo": True, "logprobs": 1, "stream": True}
    async with http.post(handle.url + "/v1/completions", json=body) as resp:
        raw = await resp.read()
    assert resp.status == 200 and raw.rstrip().endswith(b"data: [DONE]"), raw
    assert d.engine.requests == [] and len(p.engine.requests) == 1


async def test_a_failing_prefill_is_tried_on_another_and_chat_without_echo_stays_pd(stubs, proxy, http):
    bad = await stubs("prefill", "p0", plain_requests=True)
    good = await stubs("prefill", "p1", plain_requests=True)
    d = await stubs("decode", "d0")
    bad.engine.faults.error_rate = 1.0
    handle = await proxy(bad, good, d)
    chat = {"model": "deepseek-r1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for _ in range(2):  # whichever prefill is picked first, the answer comes from p1
        async with http.post(handle.url + "/v1/chat/completions", json={**chat, "echo": True, "top_logprobs": 1,
                                                                       "logprobs": True}) as resp:
            assert resp.status == 200, await resp.text()
    assert d.engine.requests == []
    async with http.post(handle.url + "/v1/chat/completions", json={**chat, "logprobs": True, "top_logprobs": 1}) as resp:
        assert resp.status == 200
    assert len(d.engine.requests) == 1  # sampled log-probabilities only: the decode gives them
