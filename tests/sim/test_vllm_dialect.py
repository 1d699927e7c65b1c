"""The simulator answers as vLLM 0.23.0 does: error stages and shapes, n, prompt lists, stop, logprobs, echo,
usage options, chunk order. Over real HTTP, raw JSON (tests/compat drives the same with the openai SDK)."""

from __future__ import annotations

import ast
import json

import pytest

MODEL = "deepseek-ai/DeepSeek-R1"


async def post(http, h, path: str, body: dict) -> tuple[int, dict | list[dict], str]:
    """(status, JSON body or list of SSE events, content type)."""
    async with http.post(f"{h.url}{path}", json=body) as r:
        text = await r.text()
        if r.content_type == "text/event-stream":
            events = [e[len("data: "):] for e in text.split("\n\n") if e.startswith("data: ")]
            assert events[-1] == "[DONE]", events
            return r.status, [json.loads(e) for e in events[:-1]], r.content_type
        return r.status, json.loads(text), r.content_type


def assert_error(body: dict, status: int, err_type: str, param: str | None = None) -> str:
    """vLLM 0.23.0 ErrorResponse (vllm/entrypoints/openai/engine/protocol.py); returns the message."""
    assert list(body) == ["error"] and list(body["error"]) == ["message", "type", "param", "code"], body
    assert (body["error"]["code"], body["error"]["type"], body["error"]["param"]) == (status, err_type, param), body
    return body["error"]["message"]


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("field,value,message,param", [
    ("temperature", -1, "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
     "temperature"),
    ("top_p", 2, "top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)", "top_p"),
    ("presence_penalty", 5, "presence_penalty must be in [-2, 2], got 5.0.", None),
    ("frequency_penalty", -3, "frequency_penalty must be in [-2, 2], got -3.0.", None),
    ("max_tokens", 0, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"),
    ("n", 0, "n must be at least 1, got 0.", None),
    ("min_tokens", 50, "min_tokens must be less than or equal to max_tokens=16, got 50.", None),
])
async def test_sampling_values_are_refused_as_sampling_params_does(sim, http, field, value, message, param):
    h = await sim()
    for path, body in (("/v1/completions", {"prompt": "a b"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 16})):
        status, err, _ = await post(http, h, path, {**body, "model": MODEL, field: value})
        assert status == 400
        assert assert_error(err, 400, "BadRequestError", param) == message


async def test_greedy_sampling_with_n_above_1_is_refused(sim, http):
    h = await sim()
    status, err, _ = await post(http, h, "/v1/completions", {"prompt": "a", "n": 2, "temperature": 0})
    assert status == 400 and assert_error(err, 400, "BadRequestError") == "n must be 1 when using greedy sampling, got 2."


async def test_unknown_model_is_404_not_found(sim, http):
    h = await sim()
    for path, body in (("/v1/completions", {"prompt": "a"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]})):
        status, err, _ = await post(http, h, path, {**body, "model": "gpt-4"})
        assert status == 404
        assert assert_error(err, 404, "NotFoundError", "model") == "The model `gpt-4` does not exist."


async def test_protocol_errors_are_fastapi_validation_errors(sim, http):
    h = await sim()
    status, err, _ = await post(http, h, "/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}})
    assert status == 400
    msg = assert_error(err, 400, "Bad Request", "stream_options")
    # str() of FastAPI's RequestValidationError (count, one line per error, the endpoint), then the error list
    head, _, listed = msg.partition("\n    POST /v1/completions ")
    assert head.startswith("1 validation error:\n  {'type': 'value_error'") and head.endswith(
        ", in create_completion"), msg
    errors = ast.literal_eval(listed.replace("VLLMValidationError(", "("))
    assert errors[0]["type"] == "value_error" and errors[0]["loc"] == ("body",)
    assert errors[0]["msg"] == ("Value error, Stream options can only be defined when `stream=True`. "
                                "(parameter=stream_options)")
    # a field of the wrong type: pydantic's own error, located under body
    status, err, _ = await post(http, h, "/v1/completions", {"prompt": "a", "max_tokens": "many"})
    msg = assert_error(err, 400, "Bad Request")
    assert "'loc': ('body', 'max_tokens')" in msg and "'type': 'int_parsing'" in msg
    status, err, _ = await post(http, h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                                   "top_logprobs": 3})
    assert "when using `top_logprobs`, `logprobs` must be set to true." in assert_error(err, 400, "Bad Request",
                                                                                        "top_logprobs")
    status, err, _ = await post(http, h, "/v1/completions", {"prompt": ""})
    assert "Either prompt or prompt_embeds must be provided and non-empty." in assert_error(err, 400, "Bad Request",
                                                                                             "prompt")
    async with http.post(f"{h.url}/v1/completions", data=b"{oops", headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400 and "'type': 'json_invalid'" in assert_error(await r.json(), 400, "Bad Request")
    async with http.post(f"{h.url}/v1/completions", data=b"{}", headers={"Content-Type": "text/plain"}) as r:
        assert "Unsupported Media Type" in assert_error(await r.json(), 400, "Bad Request")


async def test_tools_are_refused_as_vllm_without_a_tool_parser(sim, http):
    h = await sim()
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    msgs = [{"role": "user", "content": "weather?"}]
    cases = [
        ({"tools": [tool]}, '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'),
        ({"tools": [tool], "tool_choice": "required"}, 'tool_choice="required" requires --tool-call-parser to be set'),
        ({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
         "tool_choice=\"function=ChatCompletionNamedFunction(name='get_weather') type='function'\" requires "
         "--tool-call-parser to be set"),
    ]
    for extra, message in cases:
        status, err, _ = await post(http, h, "/v1/chat/completions", {"messages": msgs, **extra})
        assert status == 400 and assert_error(err, 400, "BadRequestError") == message
    status, body, _ = await post(http, h, "/v1/chat/completions",
                                 {"messages": msgs, "tools": [tool], "tool_choice": "none", "max_tokens": 2})
    assert status == 200 and body["choices"][0]["message"]["tool_calls"] == []
    status, err, _ = await post(http, h, "/v1/chat/completions", {"messages": msgs, "tools": []})
    assert "`tools` must not be an empty array" in assert_error(err, 400, "Bad Request")


async def test_structured_outputs_are_refused_where_vllm_validates_them(sim, http):
    h = await sim()
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    body = {"messages": [{"role": "user", "content": "json please"}], "response_format": rf}
    status, err, _ = await post(http, h, "/v1/chat/completions", body)
    assert status == 400 and "structured output backend" in assert_error(err, 400, "BadRequestError")
    # a stream is answered 200 first: the engine's refusal is its only event (chat_completion/serving.py)
    status, events, ctype = await post(http, h, "/v1/chat/completions", {**body, "stream": True})
    assert status == 200 and ctype == "text/event-stream" and len(events) == 1
    assert "structured output backend" in assert_error(events[0], 400, "BadRequestError")
    status, body, _ = await post(http, h, "/v1/chat/completions", {**body, "response_format": {"type": "text"},
                                                                    "max_tokens": 2})
    assert status == 200


async def test_engine_side_limits_in_stream_and_not(sim, http):
    h = await sim()
    status, err, _ = await post(http, h, "/v1/completions", {"prompt": "a", "logprobs": 21})
    assert status == 400 and assert_error(err, 400, "BadRequestError", "logprobs") == (
        "Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)")
    status, events, _ = await post(http, h, "/v1/completions", {"prompt": [1, 200000], "stream": True})
    assert status == 200 and assert_error(events[0], 400, "BadRequestError") == "Token id 200000 is out of vocabulary"


async def test_context_length_errors(sim, http):
    h = await sim()
    status, err, _ = await post(http, h, "/v1/completions", {"prompt": "x", "max_tokens": 40000})
    assert assert_error(err, 400, "BadRequestError", "max_tokens").startswith(
        "max_tokens=40000 cannot be greater than max_model_len=max_total_tokens=32768.")
    _status, err, _ = await post(http, h, "/v1/completions", {"prompt": [5] * 32000, "max_tokens": 1000})
    assert assert_error(err, 400, "BadRequestError", "input_tokens").startswith(
        "This model's maximum context length is 32768 tokens. However, you requested 1000 output tokens and your "
        "prompt contains 32000 input tokens, for a total of 33000 tokens.")


async def test_unknown_routes_answer_json(sim, http):
    h = await sim()
    async with http.get(f"{h.url}/v1/embeddings") as r:
        assert r.status == 404 and r.content_type == "application/json" and await r.json() == {"detail": "Not Found"}
    async with http.get(f"{h.url}/v1/chat/completions") as r:
        assert r.status == 405 and await r.json() == {"detail": "Method Not Allowed"}


# ---------------------------------------------------------------- what is modelled
async def test_n_and_prompt_lists_number_choices_as_vllm(sim, http):
    h = await sim()
    status, body, _ = await post(http, h, "/v1/completions", {"prompt": ["a b c", "d e"], "n": 2, "max_tokens": 5})
    assert status == 200
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["prompt_tokens"] == 3 + 2 and body["usage"]["completion_tokens"] == 4 * 5
    texts = [c["text"] for c in body["choices"]]
    assert texts[0] != texts[1] and texts[2] != texts[3]  # n choices are independent samples
    status, events, _ = await post(http, h, "/v1/completions", {"prompt": ["a b c", "d e"], "n": 2, "max_tokens": 3,
                                                                "stream": True})
    by_index: dict[int, str] = {}
    for e in events:
        (c,) = e["choices"]
        by_index[c["index"]] = by_index.get(c["index"], "") + c["text"]
    assert sorted(by_index) == [0, 1, 2, 3] and all(len(t.split()) == 3 for t in by_index.values())
    status, body, _ = await post(http, h, "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 2})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 11, "completion_tokens": 6,
                             "prompt_tokens_details": None}


async def test_seed_makes_the_text_reproducible(sim, http):
    h = await sim()
    req = {"prompt": "a", "n": 3, "max_tokens": 4, "seed": 7}
    first = (await post(http, h, "/v1/completions", req))[1]
    second = (await post(http, h, "/v1/completions", req))[1]
    assert [c["text"] for c in first["choices"]] == [c["text"] for c in second["choices"]]


async def test_stop_strings_end_the_text(sim, http):
    h = await sim()
    base = {"prompt": "a", "max_tokens": 30, "seed": 1}
    full = (await post(http, h, "/v1/completions", {**base, "max_tokens": 12}))[1]["choices"][0]["text"]
    stop = full.split()[5]  # a word met after some tokens
    status, body, _ = await post(http, h, "/v1/completions", {**base, "stop": [" " + stop]})
    c = body["choices"][0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == " " + stop
    assert c["text"] == full[: full.index(" " + stop)] and body["usage"]["completion_tokens"] == 6
    body = (await post(http, h, "/v1/completions", {**base, "stop": " " + stop, "include_stop_str_in_output": True}))[1]
    assert body["choices"][0]["text"] == full[: full.index(" " + stop) + len(stop) + 1]
    # min_tokens: a stop string is not looked for before that many tokens
    # (the words repeat every 10 tokens, so the next occurrence is token 16)
    body = (await post(http, h, "/v1/completions", {**base, "stop": [" " + stop], "min_tokens": 8}))[1]
    assert body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "stop"
    # streamed: deltas (with the stop string held back) add up to the same text
    status, events, _ = await post(http, h, "/v1/completions", {**base, "stop": [" " + stop], "stream": True})
    assert "".join(e["choices"][0]["text"] for e in events) == c["text"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"][0]["stop_reason"] == " " + stop
    # chat too
    _status, body, _ = await post(http, h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                                    "max_tokens": 30, "stop": ["the"]})
    assert body["choices"][0]["finish_reason"] == "stop" and "the" not in body["choices"][0]["message"]["content"]


async def test_chat_without_a_limit_ends_with_eos(sim, http):
    h = await sim()
    _status, body, _ = await post(http, h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]})
    c = body["choices"][0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] is None
    assert body["usage"]["completion_tokens"] == 16 and len(c["message"]["content"].split()) == 15  # EOS not shown


async def test_logprobs_are_plausible(sim, http):
    h = await sim()
    body = (await post(http, h, "/v1/completions", {"prompt": "a b", "max_tokens": 4, "logprobs": 3}))[1]
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 4
    assert "".join(lp["tokens"]) == body["choices"][0]["text"]
    assert all(isinstance(t, str) for t in lp["tokens"]) and all(v < 0 for v in lp["token_logprobs"])
    for tok, val, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert len(top) == 3 and next(iter(top)) == tok and top[tok] == val
        assert list(top.values()) == sorted(top.values(), reverse=True)
    assert lp["text_offset"] == [0, len(lp["tokens"][0]), sum(map(len, lp["tokens"][:2])),
                                 sum(map(len, lp["tokens"][:3]))]
    body = (await post(http, h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                          "max_tokens": 3, "logprobs": True, "top_logprobs": 2}))[1]
    content = body["choices"][0]["logprobs"]["content"]
    assert "".join(p["token"] for p in content) == body["choices"][0]["message"]["content"]
    for p in content:
        assert p["logprob"] < 0 and p["bytes"] == list(p["token"].encode())
        assert len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["token"] == p["token"]
        assert p["top_logprobs"][0]["logprob"] >= p["top_logprobs"][1]["logprob"]
    body = (await post(http, h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                                          "max_tokens": 3, "logprobs": True}))[1]
    assert all(p["top_logprobs"] == [] for p in body["choices"][0]["logprobs"]["content"])


async def test_echo_returns_the_prompt_first(sim, http):
    h = await sim()
    body = (await post(http, h, "/v1/completions", {"prompt": "one two three", "max_tokens": 2, "echo": True,
                                                     "logprobs": 1}))[1]
    c = body["choices"][0]
    assert c["text"].startswith("one two three") and len(c["text"].split()) == 5
    lp = c["logprobs"]
    assert lp["tokens"][:3] == ["one", " two", " three"] and lp["token_logprobs"][0] is None
    assert lp["top_logprobs"][0] is None and lp["text_offset"][:3] == [0, 3, 7]
    body = (await post(http, h, "/v1/completions", {"prompt": "one two", "max_tokens": 0, "echo": True}))[1]
    assert body["choices"][0]["text"] == "one two"
    _status, events, _ = await post(http, h, "/v1/completions", {"prompt": "one two", "max_tokens": 2, "echo": True,
                                                                "stream": True})
    assert events[0]["choices"][0]["text"].startswith("one two")
    # chat: echo prepends the last message when it has the answer's role
    body = (await post(http, h, "/v1/chat/completions", {"messages": [{"role": "user", "content": "q"},
                                                                       {"role": "assistant", "content": "Sure,"}],
                                                          "max_tokens": 2, "echo": True}))[1]
    assert body["choices"][0]["message"]["content"].startswith("Sure,")


async def test_usage_options(sim, http):
    h = await sim()
    req = {"prompt": ["a b", "c"], "n": 2, "max_tokens": 3, "stream": True,
           "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, events, _ = await post(http, h, "/v1/completions", req)
    *chunks, last = events
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 3, "total_tokens": 15, "completion_tokens": 12}
    for e in chunks:  # continuous usage: the choice's own prompt and tokens so far
        (c,) = e["choices"]
        assert e["usage"]["prompt_tokens"] == (2 if c["index"] < 2 else 1)
    assert sorted(e["usage"]["completion_tokens"] for e in chunks) == [1] * 4 + [2] * 4 + [3] * 4
    _status, events, _ = await post(http, h, "/v1/completions", {**req, "stream_options": {"include_usage": False}})
    assert all("usage" not in e for e in events)


async def test_chat_stream_starts_with_a_role_only_chunk_per_choice(sim, http):
    h = await sim()
    _status, events, _ = await post(http, h, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 2, "stream": True})
    first = [e["choices"][0] for e in events[:2]]
    assert [(c["index"], c["delta"]) for c in first] == [(0, {"role": "assistant", "content": ""}),
                                                         (1, {"role": "assistant", "content": ""})]
    rest = [e["choices"][0] for e in events[2:]]
    assert all(set(c["delta"]) == {"content"} for c in rest) and len(rest) == 4
    assert [c["finish_reason"] for c in rest if c["finish_reason"]] == ["length", "length"]
    assert set(events[0]) == {"id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"}
