"""The vLLM-Ascend PD (prefill/decode) request protocol, as pure functions.

Mirrors vllm-ascend ``examples/disaggregated_prefill_v1/
load_balance_proxy_server_example.py``:

1. the prefill instance gets a copy of the request with ``stream=false``,
   ``max_tokens=1``, ``min_tokens=1`` (``max_completion_tokens=1`` if present),
   no ``stream_options``, and the ``kv_transfer_params`` request block below;
2. the ``kv_transfer_params`` of the prefill response are copied, as is, into
   the original request, which goes to a decode instance;
3. a decode answer whose choice has ``stop_reason == "recomputed"`` is
   re-sent (new prefill, new decode) with prompt = original prompt + text so far
   (chat: the first message's content) and ``max_tokens = original max_tokens -
   tokens so far + number of recomputes``.

Request ids (as the reference mints one per prefill/decode pair,
``assign_instances`` -> ``next_req_id()`` in that example, vllm-ascend
v0.23.0): every request the proxy sends to an engine carries a fresh
``X-Request-Id`` (:func:`new_request_id`), one per prefill try, per decode try
and per recomputed continuation, never the client's. vLLM 0.23.0 takes the
engine request id from that header (``_base_request_id`` in
vllm/entrypoints/openai/engine/serving.py; it wins over a body ``request_id``)
and answers ``id = "cmpl-<it>"`` / ``"chatcmpl-<it>"``. The prefill and decode
legs of one attempt do not share an id: the Mooncake connector hands the
prefill's own engine id to the decode in ``kv_transfer_params.remote_request_id``
(``MooncakeConnectorScheduler.request_finished`` in
vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py, v0.23.0),
which the proxy copies through unchanged. The client's ``X-Request-Id`` travels
separately in ``X-Client-Request-Id`` (vLLM ignores it).
"""

from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

from ascend_runtime.proxy import errors
from ascend_runtime.proxy.answers import usable_event
from ascend_runtime.proxy.boundedjson import JsonError, load_json

PREFILL_KV_TRANSFER_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
RECOMPUTED = "recomputed"
#: module-level ``random`` (re-seeded in a forked child by random.py itself; a private Random() would not be)
_getrandbits = random.getrandbits
#: Header carrying the engine request id (vLLM reads it); a fresh value per attempt.
REQUEST_ID_HEADER = "X-Request-Id"
#: Header carrying the client's own X-Request-Id to the engines (informational; vLLM ignores it).
CLIENT_REQUEST_ID_HEADER = "X-Client-Request-Id"


def new_request_id() -> str:
    """A fresh request id (32 hex digits): one per engine attempt, and for clients that sent none.

    128 random bits from :mod:`random` (seeded from the OS at start and re-seeded in a forked child, so
    workers never share a sequence): unique like ``uuid4().hex`` without a ``getrandom`` call per id,
    and not meant to be unguessable (these ids name requests in logs and engine metrics).
    """
    return f"{_getrandbits(128):032x}"


def build_prefill_request(req: dict[str, Any]) -> dict[str, Any]:
    """Return the prefill copy of client request ``req`` (``req`` is not modified)."""
    payload = dict(req)
    payload["kv_transfer_params"] = dict(PREFILL_KV_TRANSFER_PARAMS)
    payload["stream"] = False
    payload["max_tokens"] = 1
    payload["min_tokens"] = 1
    if "max_completion_tokens" in payload:
        payload["max_completion_tokens"] = 1
    payload.pop("stream_options", None)
    return payload


#: vLLM 0.23.0's length refusals (``_token_len_check`` / ``_text_len_check`` in vllm/renderers/params.py),
#: as the prefill copy's ``max_tokens: 1`` makes them read
_TOKENS_REFUSAL = re.compile(r"you requested 1 output tokens and your prompt contains (at least )?(\d+) input tokens, "
                             r"for a total of (at least )?(\d+) tokens")
_CHARS_REFUSAL = re.compile(r"maximum context length is (\d+) tokens\. However, you requested 1 output tokens and your "
                            r"prompt contains (\d+) characters \(more than (\d+) characters, which is the upper bound "
                            r"for (\d+) input tokens\)")
#: the members the prefill copy adds, as a refusal's ``input`` echo shows them (Python repr of the body)
_KV_ECHO = re.compile(r"'kv_transfer_params': \{[^{}]*\}(, )?")


def client_view_of_prefill_refusal(body: bytes, client_req: dict[str, Any]) -> bytes:
    """A prefill's 4xx answer as the client's own request would have got it: the length refusal names the
    client's ``max_tokens`` (and the total and bounds that follow from it), not the prefill copy's 1, and a
    refusal that echoes its input (pydantic's ``'input': {...}``, the body parsed into a dict) echoes the
    client's request, not the proxy's prefill copy with its ``kv_transfer_params``, ``max_tokens: 1`` and
    ``stream: False``. Anything else is returned unchanged."""
    if b"you requested 1 output tokens" not in body and b"kv_transfer_params" not in body:
        return body
    try:
        answer = load_json(body)
        message = answer["error"]["message"]
    except (JsonError, KeyError, TypeError, IndexError):
        return body
    if not isinstance(message, str):
        return body
    wanted = client_max_tokens(client_req)
    if wanted is not None and wanted != 1:
        def tokens(m: re.Match[str]) -> str:
            at = m.group(1) or ""
            return (f"you requested {wanted} output tokens and your prompt contains {at}{m.group(2)} input tokens, "
                    f"for a total of {at}{int(m.group(2)) + wanted} tokens")

        def chars(m: re.Match[str]) -> str:
            total, text_len, bound, inputs = (int(g) for g in m.groups())
            per_token = bound // inputs if inputs else 0  # the tokenizer's max_chars_per_token (an int)
            inputs = max(0, total - wanted)
            return (f"maximum context length is {total} tokens. However, you requested {wanted} output tokens and "
                    f"your prompt contains {text_len} characters (more than {int(inputs * per_token)} characters, "
                    f"which is the upper bound for {inputs} input tokens)")

        message = _CHARS_REFUSAL.sub(chars, _TOKENS_REFUSAL.sub(tokens, message))
    # the echo is the repr of the JSON body the prefill got: the prefill copy, keys in the order sent
    message = message.replace(repr(build_prefill_request(client_req)), repr(client_req))
    message = _KV_ECHO.sub("", message)  # any other echo of the proxy's member
    answer["error"]["message"] = message
    return json.dumps(answer).encode()


def client_max_tokens(req: dict[str, Any]) -> int | None:
    """The output token limit the client asked for (chat: ``max_completion_tokens`` before ``max_tokens``,
    as vLLM 0.23.0's ``to_sampling_params`` reads them; completions: ``max_tokens``, 16 when not given, the
    default of ``CompletionRequest``); None for a chat that gave none."""
    chat = "messages" in req and "prompt" not in req
    for key in ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",):
        value = req.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None if chat else 16


def build_decode_request(req: dict[str, Any], prefill_response: dict[str, Any]) -> dict[str, Any]:
    """Return ``req`` plus the prefill response's ``kv_transfer_params`` (when it has any)."""
    kv = prefill_response.get("kv_transfer_params")
    if not kv:
        return req
    out = dict(req)
    out["kv_transfer_params"] = kv
    return out


#: the member the decode request gets, as it appears in a JSON body
_KV_KEY = b'"kv_transfer_params"'


def decode_body(req: dict[str, Any], prefill_response: dict[str, Any], raw: bytes | None = None) -> bytes:
    """The decode request's JSON body: :func:`build_decode_request` of ``req``, serialized.

    ``raw``: the client's body bytes ``req`` was parsed from (None: ``req`` is serialized). When given and
    it is a non-empty UTF-8 JSON object with no ``kv_transfer_params`` member of its own, its bytes are
    reused instead of serializing the prompt again: unchanged when the prefill answer has no
    ``kv_transfer_params``, else with that member appended before the closing brace. Parsed, both give
    the same object as ``json.dumps(build_decode_request(req, prefill_response))``.
    """
    kv = prefill_response.get("kv_transfer_params")
    if raw is not None and req:
        body = raw if raw[:1] == b"{" and raw[-1:] == b"}" else raw.strip()  # no copy when nothing to strip
        if body[:1] == b"{" and body[-1:] == b"}" and _KV_KEY not in body:
            if not kv:
                return body
            return b"%b,%b:%b}" % (body[:-1], _KV_KEY, json.dumps(kv).encode())
    return json.dumps(build_decode_request(req, prefill_response)).encode()


def _words(value: Any) -> int:
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            return len(value)  # token ids
        return sum(_words(v) for v in value)
    if isinstance(value, dict):
        return _words(value.get("content")) + _words(value.get("text"))
    return 0


def estimate_prompt_tokens(req: dict[str, Any]) -> int:
    """Prompt size used for prefill routing: whitespace words (token-id lists count ids).

    An estimate only (real tokenizers give ~1.3 tokens per English word); it
    just has to rank instances by outstanding work. At least 1.
    """
    if "prompt" in req:
        return max(1, _words(req["prompt"]))
    return max(1, _words(req.get("messages") or []))


class NotContinuable(ValueError):
    """A recomputed request whose continuation cannot be built (the message says why)."""


def _continued_messages(messages: Any, generated: str) -> list[Any]:
    """The chat conversation of a continuation: the text generated so far appended to the first message's
    content, as vLLM-Ascend's reference proxy continues a recomputed chat (v0.23.0
    ``examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py``). The content forms of
    vLLM 0.23.0's chat protocol are kept: a string gets the text appended, a list of content parts gets
    one more text part, a missing or null content becomes the text. An empty conversation (which the
    reference proxy would fail on) becomes one user message holding the text."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return [{"role": "user", "content": generated}]
    first = dict(messages[0])
    first["content"] = with_text(first.get("content"), generated) or generated
    return [first, *messages[1:]]


def with_text(content: Any, text: str) -> str | list[Any] | None:
    """A chat message's ``content`` with ``text`` appended in its own form (vLLM 0.23.0 chat protocol): a
    string gets it appended, a list of content parts one more text part; None for any other content."""
    if isinstance(content, str):
        return content + text
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    return None


@dataclass
class RecomputeTracker:
    """State needed to continue a decode answer that came back ``recomputed``.

    Built from the client's original request; :meth:`continue_request` returns
    the next request to send (same kv-less shape as the client's request).
    """

    original: dict[str, Any]
    chat: bool = False
    origin_prompt: Any = ""
    origin_max_tokens: int = 16
    generated: str = ""
    completion_tokens: int = 0
    retries: int = 0
    current: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def for_request(cls, req: dict[str, Any], max_tokens: int | None = None) -> "RecomputeTracker":
        """max_tokens: the request's validated ``max_tokens`` (validate.py); else read from ``req``
        (an int there, anything else counts as absent); absent = 16."""
        if max_tokens is None:
            raw = req.get("max_tokens")
            max_tokens = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
        chat = "messages" in req and "prompt" not in req
        messages = req.get("messages")
        if "prompt" in req:
            prompt = req["prompt"]
        elif chat and isinstance(messages, list) and messages and isinstance(messages[0], dict):
            prompt = messages[0].get("content", "")
        else:
            prompt = ""
        return cls(original=req, chat=chat, origin_prompt=prompt, origin_max_tokens=max_tokens or 16, current=req)

    def add_choice(self, choice: dict[str, Any], usage_tokens: int | None) -> bool:
        """Account one answer chunk/choice; return True if it asks for a recompute.

        usage_tokens: None for a stream chunk (counts 1), else the answer's
        ``usage.completion_tokens`` (non-stream).
        """
        delta = choice.get("delta") or {}
        message = choice.get("message") or {}
        self.generated += delta.get("content") or message.get("content") or choice.get("text") or ""
        self.completion_tokens += 1 if usage_tokens is None else usage_tokens
        return choice.get("stop_reason") == RECOMPUTED

    def continue_request(self) -> dict[str, Any]:
        """Next request after a recompute: prompt + text so far, reduced max_tokens."""
        self.retries += 1
        req = copy.deepcopy(self.original)
        req.pop("kv_transfer_params", None)
        if self.chat:
            req["messages"] = _continued_messages(req.get("messages"), self.generated)
        elif isinstance(self.origin_prompt, str):
            req["prompt"] = f"{self.origin_prompt}{self.generated}"
        else:  # token ids, a batch of prompts or no prompt: no text to append the answer to
            raise NotContinuable("the engine asked for a recompute, and a completion whose prompt is not "
                                 "one string cannot be continued by the proxy; send the prompt as text")
        req["max_tokens"] = self.origin_max_tokens - self.completion_tokens + self.retries
        self.current = req
        return req

    def finalize_json(self, body: dict[str, Any]) -> dict[str, Any]:
        """Non-stream final answer after recomputes: the choice carries all text so far."""
        choices = body.get("choices") or []
        if choices:
            if self.chat:
                if not isinstance(choices[0].get("message"), dict):
                    choices[0]["message"] = {"role": "assistant"}
                choices[0]["message"]["content"] = self.generated
            else:
                choices[0]["text"] = self.generated
        return body


def _data_payloads(events: list[bytes]) -> Iterator[bytes]:
    """The payload of every ``data:`` line of the given SSE events (raw bytes, stripped)."""
    for raw in events:
        for line in raw.split(b"\n"):
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip()


def sse_events(blob: bytes) -> list[dict[str, Any]]:
    """Parse the JSON ``data:`` events in ``blob`` (complete SSE events); skip [DONE] and junk: text that is
    not JSON (or nested too deep, boundedjson.py) and events of a shape the proxy does not read
    (answers.usable_event)."""
    out = []
    for data in _data_payloads(blob.split(b"\n\n")):
        if data == b"[DONE]":
            continue
        try:
            obj = load_json(data)
        except JsonError:
            continue
        if usable_event(obj):
            out.append(obj)
    return out


def _has_output(event: dict[str, Any]) -> bool:
    """Whether one SSE event object is part of an answer: an error object, or a choice with text, a delta
    field other than the role (content, reasoning, tool calls, ...), log-probabilities or a finish reason.
    A chat stream's role-only chunk (``delta: {"role": "assistant", "content": ""}``) and the usage chunk
    (``choices: []``) are not; an object of another shape counts as output (relayed as before)."""
    if "error" in event:
        return True
    choices = event.get("choices")
    if not isinstance(choices, list):
        return True
    for c in choices:
        if not isinstance(c, dict):
            return True
        if (c.get("finish_reason") is not None or c.get("text") or c.get("logprobs") is not None
                or c.get("token_ids")):
            return True
        delta = c.get("delta")
        if isinstance(delta, dict) and any(v for k, v in delta.items() if k != "role"):
            return True
        if c.get("message") is not None:
            return True
    return False


def stream_output_state(blob: bytes) -> bool | None:
    """Has the decode stream whose first body bytes are ``blob`` produced an answer?

    True: a complete event with output (:func:`_has_output`) came before ``[DONE]``. False: ``[DONE]`` came
    first: the stream is empty. None: only events without output so far (or no complete event): read on.

    vLLM 0.23.0 streams nothing but those events for a request that fails before its first token: a
    decode whose KV load fails (vllm/v1/core/sched/scheduler.py, ``kv_load_failure_policy`` "fail" by
    default, vllm/config/kv_transfer.py; vllm-ascend v0.23.0's Mooncake connector reports the failed
    blocks, kv_p2p/mooncake_connector.py ``get_block_ids_with_load_errors``) or an aborted one finishes with
    no token, and the stream generators skip an output with no text and no token before they check its
    finish reason ("Chunked prefill case, don't return empty chunks", vllm/entrypoints/openai/
    completion/serving.py and chat_completion/serving.py, v0.23.0). So the client would get 200, the chat
    role chunk, the usage chunk and ``data: [DONE]``; the non-streaming answer to the same failure is 500.
    """
    for data in _data_payloads(blob.split(b"\n\n")[:-1]):  # the last piece is incomplete (or empty)
        if data == b"[DONE]":
            return False
        try:
            obj = load_json(data)
        except JsonError:
            return True
        if not isinstance(obj, dict) or _has_output(obj):
            return True
    return None


def sse_error_event(message: str, code: int = 502, err_type: str | None = None) -> bytes:
    """A clean, final SSE error event followed by ``[DONE]`` (vLLM 0.23.0's error shape, see errors.py)."""
    return errors.sse_error_event(message, code, err_type)


def error_body(message: str, code: int, err_type: str | None = None) -> dict[str, Any]:
    """vLLM 0.23.0's ``ErrorResponse`` JSON (see errors.py)."""
    return errors.error_body(message, code, err_type)
