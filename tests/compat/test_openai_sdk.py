"""The official openai SDK against a simulator and against the PD proxy, expecting what vLLM 0.23.0 answers.

References (vLLM 0.23.0): vllm/entrypoints/openai/completion/serving.py and chat_completion/serving.py
(choices, indexes, chunks, usage), engine/protocol.py (ErrorResponse), engine/serving.py (_check_model),
serve/render/serving.py (tool choice), vllm/sampling_params.py (value checks).
"""

from __future__ import annotations

import openai
import pytest

from tests.compat.conftest import MODEL

MSG = [{"role": "user", "content": "hello there"}]


async def collect(stream) -> list:  # type: ignore[no-untyped-def]
    return [chunk async for chunk in stream]


# ---------------------------------------------------------------- completions
async def test_completion(client):
    r = await client.completions.create(model=MODEL, prompt="one two three", max_tokens=5)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.model == MODEL
    (c,) = r.choices
    assert c.index == 0 and c.finish_reason == "length" and len(c.text.split()) == 5
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 5, 8)
    chunks = await collect(await client.completions.create(model=MODEL, prompt="one two three", max_tokens=5,
                                                           stream=True))
    assert len(chunks) == 5 and all(ch.id == chunks[0].id for ch in chunks)
    assert [ch.choices[0].finish_reason for ch in chunks] == [None] * 4 + ["length"]
    assert len("".join(ch.choices[0].text for ch in chunks).split()) == 5


@pytest.mark.parametrize("stream", [False, True])
async def test_n_with_one_prompt_and_with_a_list_of_prompts(client, target, stream):
    """n > 1 answers every choice, for one prompt and for a list of prompts (through PD, one PD request per
    prompt joined by the proxy: proxy/batch.py), numbered prompt x n + choice, usage summed."""
    kw = {"model": MODEL, "prompt": ["a b c"], "n": 2, "max_tokens": 4}
    if not stream:
        r = await client.completions.create(**kw)
        assert [c.index for c in r.choices] == [0, 1]
        assert all(c.finish_reason == "length" and len(c.text.split()) == 4 for c in r.choices)
        assert r.choices[0].text != r.choices[1].text
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 8)
    else:
        chunks = await collect(await client.completions.create(**kw, stream=True))
        texts: dict[int, str] = {}
        finished = []
        for ch in chunks:
            (c,) = ch.choices
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finished.append(c.index)
        assert sorted(texts) == [0, 1] and sorted(finished) == [0, 1]
        assert all(len(t.split()) == 4 for t in texts.values())
    batch = {**kw, "prompt": ["a b c", "d e"]}
    if not stream:
        r = await client.completions.create(**batch)
        assert [c.index for c in r.choices] == [0, 1, 2, 3]
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 16)
        return
    chunks = await collect(await client.completions.create(**batch, stream=True,
                                                           stream_options={"include_usage": True}))
    indexes = {c.index for ch in chunks for c in ch.choices}
    assert indexes == {0, 1, 2, 3} and len({ch.id for ch in chunks}) == 1
    usage = [ch.usage for ch in chunks if not ch.choices]
    assert len(usage) == 1 and (usage[0].prompt_tokens, usage[0].completion_tokens) == (5, 16), usage


async def test_completion_stop(client):
    r = await client.completions.create(model=MODEL, prompt="a", max_tokens=40, stop=[" parallel"], n=2)
    for c in r.choices:
        assert c.finish_reason == "stop" and "parallel" not in c.text
    chunks = await collect(await client.completions.create(model=MODEL, prompt="a", max_tokens=40,
                                                           stop=" parallel", stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "parallel" not in "".join(ch.choices[0].text for ch in chunks)


async def test_completion_logprobs_and_echo(client):
    r = await client.completions.create(model=MODEL, prompt="one two", max_tokens=3, logprobs=2, echo=True)
    c = r.choices[0]
    assert c.text.startswith("one two")
    lp = c.logprobs
    assert lp.tokens[:2] == ["one", " two"] and "".join(lp.tokens) == c.text
    assert lp.token_logprobs[0] is None and all(v < 0 for v in lp.token_logprobs[1:])
    assert lp.top_logprobs[0] is None
    for top in lp.top_logprobs[1:]:
        assert len(top) == 2 and list(top.values()) == sorted(top.values(), reverse=True)
    chunks = await collect(await client.completions.create(model=MODEL, prompt="one two", max_tokens=3, logprobs=1,
                                                           stream=True))
    assert all(len(ch.choices[0].logprobs.tokens) == 1 for ch in chunks)


# ---------------------------------------------------------------- chat
async def test_chat(client):
    r = await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4, n=2)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.role == "assistant" and c.finish_reason == "length" for c in r.choices)
    assert r.usage.completion_tokens == 8


async def test_chat_stream_starts_with_a_role_only_chunk(client):
    chunks = await collect(await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=3, n=2,
                                                                stream=True))
    heads = [ch.choices[0] for ch in chunks[:2]]
    assert [(c.index, c.delta.role, c.delta.content) for c in heads] == [(0, "assistant", ""), (1, "assistant", "")]
    rest = [ch.choices[0] for ch in chunks[2:]]
    assert all(c.delta.role is None and c.delta.content for c in rest) and len(rest) == 6
    assert sorted(c.index for c in rest if c.finish_reason == "length") == [0, 1]


async def test_chat_stop_logprobs_and_eos(client):
    r = await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=40, stop=["expert"])
    assert r.choices[0].finish_reason == "stop" and "expert" not in r.choices[0].message.content
    r = await client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=3, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob < 0 and len(t.top_logprobs) == 3 and t.top_logprobs[0].token == t.token
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
    r = await client.chat.completions.create(model=MODEL, messages=MSG)  # no limit: the model stops (EOS)
    assert r.choices[0].finish_reason == "stop"


async def test_usage_options(client):
    chunks = await collect(await client.chat.completions.create(
        model=MODEL, messages=MSG, max_tokens=3, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3
    assert all(ch.usage is None for ch in chunks[:-1])
    chunks = await collect(await client.completions.create(
        model=MODEL, prompt="a b", max_tokens=3, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert [ch.usage.completion_tokens for ch in chunks[:-1]] == [1, 2, 3]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 5


# ---------------------------------------------------------------- errors
def _err(exc: openai.APIError, status: int, err_type: str, param: str | None = None) -> str:
    assert exc.body is not None and set(exc.body) == {"message", "type", "param", "code"}, exc.body
    assert (exc.body["code"], exc.type, exc.param) == (status, err_type, param), exc.body
    return exc.body["message"]


async def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as e:
        await client.completions.create(model="gpt-4o", prompt="a")
    assert e.value.status_code == 404
    assert _err(e.value, 404, "NotFoundError", "model") == "The model `gpt-4o` does not exist."
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="gpt-4o", messages=MSG)


@pytest.mark.parametrize("kw,message,param", [
    ({"temperature": -1}, "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
     "temperature"),
    ({"top_p": 2}, "top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)", "top_p"),
    ({"presence_penalty": 5}, "presence_penalty must be in [-2, 2], got 5.0.", None),
])
async def test_bad_values_are_400(client, kw, message, param):
    with pytest.raises(openai.BadRequestError) as e:
        await client.completions.create(model=MODEL, prompt="a", **kw)
    assert _err(e.value, 400, "BadRequestError", param) == message
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model=MODEL, messages=MSG, **kw)
    assert _err(e.value, 400, "BadRequestError", param) == message


async def test_tools_are_refused(client):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model=MODEL, messages=MSG, tools=[tool])
    assert _err(e.value, 400, "BadRequestError") == ('"auto" tool choice requires --enable-auto-tool-choice and '
                                                     "--tool-call-parser to be set")
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model=MODEL, messages=MSG, tools=[tool], tool_choice="required")
    assert _err(e.value, 400, "BadRequestError") == 'tool_choice="required" requires --tool-call-parser to be set'
    r = await client.chat.completions.create(model=MODEL, messages=MSG, tools=[tool], tool_choice="none",
                                             max_tokens=2)
    assert r.choices[0].finish_reason == "length"


async def test_structured_outputs_are_refused(client, target):
    rf = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as e:
        await client.chat.completions.create(model=MODEL, messages=MSG, response_format=rf)
    message = _err(e.value, 400, "BadRequestError")
    assert "structured output backend" in message
    # streamed, vLLM has answered 200 before its engine refuses: the SDK raises on the error event; behind the
    # proxy the (non-streamed) prefill refuses first and the proxy relays that 400
    with pytest.raises(openai.APIError) as e:
        await collect(await client.chat.completions.create(model=MODEL, messages=MSG, response_format=rf,
                                                           stream=True))
    assert isinstance(e.value, openai.BadRequestError) == (target.kind == "pd")
    assert _err(e.value, 400, "BadRequestError") == message


async def test_stream_options_without_stream_is_a_validation_error(client):
    with pytest.raises(openai.BadRequestError) as e:
        await client.completions.create(model=MODEL, prompt="a", stream_options={"include_usage": True})
    assert "Stream options can only be defined when `stream=True`." in _err(e.value, 400, "Bad Request",
                                                                           "stream_options")


async def test_models(client):
    page = await client.models.list()
    assert [m.id for m in page.data] == [MODEL] and page.data[0].owned_by == "vllm"
