"""OpenAI-compatible request parsing and response shapes (vLLM's dialect), without a tokenizer.

Token accounting: a prompt has one token per whitespace-separated word
(``/v1/completions``: a string, a one-element list of strings, or a list of
token ids counted as given); a chat prompt has the words of every message's
content plus ``CHAT_TOKENS_PER_MESSAGE`` per message (role and template
markers). Each generated token is one word. There is no EOS: generation always
stops at ``max_tokens`` (``finish_reason`` "length"), with or without
``ignore_eos``; ``max_tokens`` defaults to ``DEFAULT_MAX_TOKENS``.

Request ids follow vLLM 0.23.0 (vllm/entrypoints/openai/engine/serving.py
``_base_request_id``; completion/serving.py and chat_completion/serving.py;
vllm/v1/engine/input_processor.py ``assign_request_id``): the base id is the
``X-Request-Id`` header, else the body's ``request_id``, else a random 16-hex
id; the answer's ``id`` is ``cmpl-<base>`` (chat ``chatcmpl-<base>``); the
engine-side id is ``cmpl-<base>-0`` (chat ``chatcmpl-<base>``) plus ``-`` and 8
random hex digits, so a duplicate base id is accepted, not refused.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

CHAT_TOKENS_PER_MESSAGE = 4
DEFAULT_MAX_TOKENS = 16
WORDS = ("the", "model", "serves", "tokens", "on", "ascend", "with", "expert", "parallel", "decode")


class BadRequest(ValueError):
    """A request vLLM would answer with 400; the message names the problem."""


@dataclass
class ParsedRequest:
    """What the engine needs from one completion request."""

    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    kv_transfer_params: dict[str, Any] | None
    #: Base request id (X-Request-Id header, else body ``request_id``, else random).
    request_id: str = ""

    @property
    def response_id(self) -> str:
        """The answer's ``id``: ``cmpl-<base>`` / ``chatcmpl-<base>``, as vLLM builds it."""
        return ("chatcmpl-" if self.chat else "cmpl-") + self.request_id


def random_uuid() -> str:
    """vLLM's ``random_uuid``: 16 hex digits."""
    return f"{uuid.uuid4().int & ((1 << 64) - 1):016x}"


def engine_request_id(req: ParsedRequest) -> str:
    """The engine-side id of a (single-prompt) request: vLLM's sub-request id plus its random suffix.

    Unique even when clients reuse an X-Request-Id (vLLM 0.23.0 ``assign_request_id``).
    """
    sub = req.response_id if req.chat else f"{req.response_id}-0"
    return f"{sub}-{random_uuid()[:8]}"


def _count_words(text: Any) -> int:
    if isinstance(text, str):
        return len(text.split())
    if isinstance(text, list):  # content parts
        return sum(len(str(p.get("text", "")).split()) for p in text if isinstance(p, dict))
    return 0


def parse(body: Any, chat: bool, served_model: str, max_model_len: int,
          header_request_id: str | None = None) -> ParsedRequest:
    """Validate a request body; raises BadRequest. ``header_request_id``: the X-Request-Id header, if any."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    body_id = body.get("request_id")
    if body_id is not None and not isinstance(body_id, str):
        raise BadRequest("request_id must be a string")
    model = body.get("model", served_model)
    if model != served_model:
        raise BadRequest(f"The model `{model}` does not exist.")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("messages must be a non-empty list")
        prompt = sum(_count_words(m.get("content")) + CHAT_TOKENS_PER_MESSAGE for m in msgs if isinstance(m, dict))
    else:
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
            p = p[0]
        if isinstance(p, str):
            prompt = _count_words(p)
        elif isinstance(p, list) and p and all(isinstance(x, int) for x in p):
            prompt = len(p)
        else:
            raise BadRequest("prompt must be a string, a one-element list of strings or a list of token ids")
    prompt = max(prompt, 1)
    mt = body.get("max_completion_tokens") if chat and body.get("max_tokens") is None else body.get("max_tokens")
    max_tokens = DEFAULT_MAX_TOKENS if mt is None else mt
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("max_tokens must be an integer >= 1")
    min_tokens = body.get("min_tokens", 0) or 0
    if not isinstance(min_tokens, int) or min_tokens < 0 or min_tokens > max_tokens:
        raise BadRequest("min_tokens must be an integer within 0..max_tokens")
    if body.get("n", 1) != 1:
        raise BadRequest("the simulator supports n=1 only")
    if prompt + max_tokens > max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion)."
        )
    so = body.get("stream_options") or {}
    kv = body.get("kv_transfer_params")
    if kv is not None and not isinstance(kv, dict):
        raise BadRequest("kv_transfer_params must be an object")
    rid = header_request_id if header_request_id is not None else (body_id if body_id is not None else random_uuid())
    return ParsedRequest(chat, model, prompt, max_tokens, bool(body.get("stream", False)),
                         bool(isinstance(so, dict) and so.get("include_usage")), kv, rid)


def word(i: int) -> str:
    """Text of generated token ``i`` (one word with its leading space)."""
    return " " + WORDS[i % len(WORDS)]


class Responder:
    """Builds the JSON objects of one response."""

    def __init__(self, req: ParsedRequest) -> None:
        self.req = req
        self.id = req.response_id
        self.created = int(time.time())

    def usage(self, completion: int) -> dict[str, int]:
        """OpenAI usage object."""
        p = self.req.prompt_tokens
        return {"prompt_tokens": p, "completion_tokens": completion, "total_tokens": p + completion}

    def chunk(self, text: str, index: int, finish: str | None) -> dict[str, Any]:
        """One streaming chunk carrying ``text`` (token ``index``)."""
        if self.req.chat:
            delta: dict[str, Any] = {"content": text}
            if index == 0:
                delta["role"] = "assistant"
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.req.model, "choices": [choice]}

    def usage_chunk(self, completion: int) -> dict[str, Any]:
        """Final chunk with empty choices and usage (stream_options.include_usage)."""
        obj = "chat.completion.chunk" if self.req.chat else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.req.model, "choices": [],
                "usage": self.usage(completion)}

    def full(self, completion: int, finish: str) -> dict[str, Any]:
        """Non-streaming response."""
        text = "".join(word(i) for i in range(completion))
        if self.req.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": finish, "stop_reason": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.req.model, "choices": [choice],
                "usage": self.usage(completion)}


def error_body(message: str, code: int, err_type: str = "BadRequestError") -> dict[str, Any]:
    """vLLM/OpenAI error JSON."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}
