"""The requests the conformance recording sends, one :class:`Case` each.

Every case is the same against the real engine, the simulator and the proxy, so their answers can be
compared shape for shape. Sampling is greedy (``temperature: 0``) or seeded and token counts are small,
so a recording of the real engine is the same from run to run. A case with ``stop_from_output`` is sent
twice: first without ``stop``, then with a stop string cut from the text that first answer generated,
so every target really stops on a string (whatever its model writes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: The name the recorded server serves its model under (the kit's real-engine target and the simulator's default).
MODEL = "deepseek-ai/DeepSeek-R1"
PROMPT = "The quick brown fox jumps over the lazy dog and runs into the forest"
MESSAGES = [{"role": "user", "content": "Say something about the quick brown fox."}]
#: A prompt longer than any supported max_model_len (the simulator's 32768, the kit's real engine's 2048).
LONG_PROMPT_WORDS = 40000


@dataclass(frozen=True)
class Case:
    """One request: ``body`` is JSON data, or ``raw`` bytes sent as they are (with ``content_type``)."""

    name: str
    method: str
    path: str
    body: Any = None
    raw: bytes | None = None
    content_type: str = "application/json"
    stop_from_output: bool = False
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def chat(self) -> bool:
        return self.path == "/v1/chat/completions"


def _cmpl(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, **kw}


def _chat(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "temperature": 0, **kw}


def _post(name: str, path: str, body: Any, **kw: Any) -> Case:
    return Case(name, "POST", path, body, **kw)


def _completions() -> list[Case]:
    c = "/v1/completions"
    usage = {"include_usage": True}
    return [
        _post("cmpl.basic", c, _cmpl()),
        _post("cmpl.stream", c, _cmpl(stream=True)),
        _post("cmpl.stream.usage", c, _cmpl(stream=True, stream_options=usage)),
        _post("cmpl.stream.continuous_usage", c,
              _cmpl(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})),
        _post("cmpl.n2", c, _cmpl(n=2, temperature=0.8, seed=7)),
        _post("cmpl.stream.n2", c, _cmpl(n=2, temperature=0.8, seed=7, stream=True)),
        _post("cmpl.logprobs", c, _cmpl(logprobs=3)),
        _post("cmpl.stream.logprobs", c, _cmpl(logprobs=3, stream=True)),
        _post("cmpl.echo", c, _cmpl(echo=True)),
        _post("cmpl.echo.logprobs", c, _cmpl(echo=True, logprobs=2)),
        _post("cmpl.echo.max_tokens0", c, _cmpl(echo=True, max_tokens=0)),
        _post("cmpl.stream.echo", c, _cmpl(echo=True, stream=True)),
        _post("cmpl.prompt_logprobs", c, _cmpl(prompt_logprobs=2)),
        _post("cmpl.stop", c, _cmpl(max_tokens=12), stop_from_output=True),
        _post("cmpl.stream.stop", c, _cmpl(max_tokens=12, stream=True), stop_from_output=True),
        _post("cmpl.stop_not_hit", c, _cmpl(stop=["\u2603\u2603"])),
        _post("cmpl.max_tokens1", c, _cmpl(max_tokens=1)),
        _post("cmpl.max_tokens0", c, _cmpl(max_tokens=0)),
        _post("cmpl.max_tokens_negative", c, _cmpl(max_tokens=-1)),
        _post("cmpl.max_tokens_over_len", c, _cmpl(max_tokens=1_000_000)),
        _post("cmpl.prompt_too_long", c, _cmpl(prompt="word " * LONG_PROMPT_WORDS)),
        _post("cmpl.batch", c, _cmpl(prompt=[PROMPT, "Another prompt about dogs"])),
        _post("cmpl.stream.batch", c, _cmpl(prompt=[PROMPT, "Another prompt about dogs"], stream=True)),
        _post("cmpl.token_ids", c, _cmpl(prompt=[5, 6, 7, 8, 9])),
        _post("cmpl.empty_prompt", c, _cmpl(prompt="")),
        _post("cmpl.suffix", c, _cmpl(suffix="tail")),
        _post("cmpl.temperature_negative", c, _cmpl(temperature=-1)),
        _post("cmpl.n0", c, _cmpl(n=0)),
        _post("cmpl.logprobs_over_max", c, _cmpl(logprobs=21)),
        _post("cmpl.stream.logprobs_over_max", c, _cmpl(logprobs=21, stream=True)),
        _post("cmpl.stream_options_without_stream", c, _cmpl(stream_options=usage)),
        _post("cmpl.response_format_json_object", c, _cmpl(response_format={"type": "json_object"})),
        _post("cmpl.bad_model", c, _cmpl(model="no-such-model")),
        _post("cmpl.stream.bad_model", c, _cmpl(model="no-such-model", stream=True)),
        Case("cmpl.bad_json", "POST", c, raw=b'{"model": "x", "prompt": '),
        Case("cmpl.wrong_content_type", "POST", c, raw=b'{"prompt": "hi"}', content_type="text/plain"),
        _post("cmpl.not_an_object", c, [1, 2, 3]),
        _post("cmpl.wrong_type.max_tokens", c, _cmpl(max_tokens="ten")),
        _post("cmpl.wrong_type.prompt", c, _cmpl(prompt={"text": "hi"})),
        _post("cmpl.wrong_type.stream", c, _cmpl(stream="yes please")),
        _post("cmpl.missing_prompt", c, {"model": MODEL, "max_tokens": 4}),
        _post("cmpl.missing_model", c, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0}),
        _post("cmpl.unknown_field", c, _cmpl(no_such_field=1)),
        # a PD prefill request as the proxy sends it (the answer's kv_transfer_params)
        _post("cmpl.pd_prefill", c, _cmpl(max_tokens=1, min_tokens=1, kv_transfer_params={
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None}), tags=("pd",)),
    ]


def _chats() -> list[Case]:
    c = "/v1/chat/completions"
    return [
        _post("chat.basic", c, _chat()),
        _post("chat.stream", c, _chat(stream=True)),
        _post("chat.stream.usage", c, _chat(stream=True, stream_options={"include_usage": True})),
        _post("chat.n2", c, _chat(n=2, temperature=0.8, seed=7)),
        _post("chat.stream.n2", c, _chat(n=2, temperature=0.8, seed=7, stream=True)),
        _post("chat.logprobs", c, _chat(logprobs=True, top_logprobs=2)),
        _post("chat.stream.logprobs", c, _chat(logprobs=True, top_logprobs=2, stream=True)),
        _post("chat.stop", c, _chat(max_tokens=12), stop_from_output=True),
        _post("chat.stream.stop", c, _chat(max_tokens=12, stream=True), stop_from_output=True),
        _post("chat.max_completion_tokens", c,
              {"model": MODEL, "messages": MESSAGES, "max_completion_tokens": 3, "temperature": 0}),
        _post("chat.max_tokens_over_len", c, _chat(max_tokens=1_000_000)),
        _post("chat.top_logprobs_without_logprobs", c, _chat(top_logprobs=2)),
        _post("chat.response_format_json_object", c, _chat(response_format={"type": "json_object"})),
        _post("chat.tool_choice_auto", c, _chat(tools=[{"type": "function", "function": {"name": "f"}}],
                                                tool_choice="auto")),
        _post("chat.bad_model", c, _chat(model="no-such-model")),
        Case("chat.bad_json", "POST", c, raw=b'{"messages": [}'),
        _post("chat.wrong_type.messages", c, _chat(messages="hello")),
        _post("chat.wrong_type.temperature", c, _chat(temperature="hot")),
        _post("chat.missing_messages", c, {"model": MODEL, "max_tokens": 4}),
        _post("chat.unknown_field", c, _chat(no_such_field={"a": 1})),
    ]


def _others() -> list[Case]:
    return [
        Case("health", "GET", "/health"),
        Case("models", "GET", "/v1/models"),
        Case("version", "GET", "/version"),
        Case("ping.get", "GET", "/ping"),
        Case("ping.post", "POST", "/ping"),
        Case("load", "GET", "/load"),
        _post("tokenize.prompt", "/tokenize", {"model": MODEL, "prompt": PROMPT}),
        _post("tokenize.messages", "/tokenize", {"model": MODEL, "messages": MESSAGES}),
        _post("tokenize.bad_model", "/tokenize", {"model": "no-such-model", "prompt": PROMPT}),
        _post("detokenize", "/detokenize", {"model": MODEL, "tokens": [5, 6, 7]}),
        Case("not_found", "GET", "/v1/no-such-route"),
        Case("method_not_allowed", "GET", "/v1/completions"),
        Case("metrics", "GET", "/metrics", tags=("metrics",)),
    ]


def corpus() -> list[Case]:
    """Every case, in the order they are sent (``/metrics`` last, after the traffic it counts)."""
    cases = _completions() + _chats() + _others()
    names = [case.name for case in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases
