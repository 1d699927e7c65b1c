"""A completions request with several prompts: one PD request per prompt through the proxy itself, joined
into one answer as vLLM 0.23.0's server joins a batch (batch.py)."""

from __future__ import annotations

import json

from ascend_runtime.proxy.batch import StreamJoiner, join_answers
from tests.proxy.test_request_corpus import speak_vllm


def _events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


async def test_a_batch_is_one_pd_pair_per_prompt_joined(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    handle = await proxy(p, d)
    body = {"model": "deepseek-r1", "prompt": ["first prompt", "second prompt", "third"], "max_tokens": 3}
    async with http.post(handle.url + "/v1/completions", json=body, headers={"X-Request-Id": "batch-1"}) as resp:
        answer = await resp.json()
    assert resp.status == 200, answer
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert sorted(r["prompt"] for r in p.engine.requests) == sorted(body["prompt"])  # one prompt per prefill
    assert sorted(r["prompt"] for r in d.engine.requests) == sorted(body["prompt"])
    assert sorted(p.engine.client_request_ids) == [f"batch-1-{i}" for i in range(3)]
    assert answer["usage"]["completion_tokens"] == 9


async def test_a_streamed_batch_numbers_choices_per_prompt_and_ends_once(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    handle = await proxy(p, d)
    body = {"model": "deepseek-r1", "prompt": ["a", "b"], "max_tokens": 4, "stream": True}
    async with http.post(handle.url + "/v1/completions", json=body) as resp:
        raw = await resp.read()
    assert resp.status == 200
    events = _events(raw)
    assert events[-1] == b"data: [DONE]" and raw.count(b"[DONE]") == 1
    docs = [json.loads(e[6:]) for e in events[:-1]]
    texts: dict[int, str] = {}
    for doc in docs:
        for c in doc["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert sorted(texts) == [0, 1] and all(t.split() == ["w0", "w1", "w2", "w3"] for t in texts.values()), texts
    assert len({doc["id"] for doc in docs}) == 1


async def test_a_refused_prompt_is_the_batch_answer(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    speak_vllm(p, d)  # the stubs refuse what vLLM 0.23.0 refuses: here the empty prompt
    handle = await proxy(p, d)
    body = {"model": "deepseek-r1", "prompt": ["fine", ""], "max_tokens": 2}
    async with http.post(handle.url + "/v1/completions", json=body) as resp:
        answer = await resp.json()
    assert resp.status == 400 and answer["error"]["param"] == "prompt", answer


def test_join_renumbers_n_choices_per_prompt_and_sums_usage() -> None:
    answers = [{"id": f"cmpl-{i}", "created": i, "choices": [{"index": 0, "text": f"p{i}a"}, {"index": 1, "text": f"p{i}b"}],
                "usage": {"prompt_tokens": 3 + i, "completion_tokens": 2, "total_tokens": 5 + i}} for i in range(3)]
    joined = join_answers(answers, n=2)
    assert [(c["index"], c["text"]) for c in joined["choices"]] == [
        (0, "p0a"), (1, "p0b"), (2, "p1a"), (3, "p1b"), (4, "p2a"), (5, "p2b")]
    assert joined["usage"] == {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}
    assert joined["id"] == "cmpl-0" and joined["created"] == 0


def test_stream_joiner_holds_usage_until_the_end_and_stops_at_an_error() -> None:
    j = StreamJoiner(n=1)
    first = j.event(1, b'data: {"id":"cmpl-b","created":2,"choices":[{"index":0,"text":"x"}]}')
    assert json.loads(first[6:]) == {"id": "cmpl-b", "created": 2, "choices": [{"index": 1, "text": "x"}]}
    again = j.event(0, b'data: {"id":"cmpl-a","created":1,"choices":[{"index":0,"text":"y"}]}')
    assert json.loads(again[6:])["id"] == "cmpl-b"  # one id for the whole batch
    assert j.event(0, b'data: {"id":"cmpl-a","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,'
                      b'"total_tokens":3}}') is None
    assert j.event(1, b'data: {"id":"cmpl-b","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":5,'
                      b'"total_tokens":9}}') is None
    assert j.event(0, b"data: [DONE]") is None
    tail = j.final().split(b"\n\n")
    assert json.loads(tail[0][6:])["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    assert tail[1] == b"data: [DONE]"
    broken = StreamJoiner(n=1)
    out = broken.event(0, b'data: {"error":{"message":"boom","type":"x","param":null,"code":500}}')
    assert broken.failed and b"boom" in out and broken.final() == b"data: [DONE]\n\n"
