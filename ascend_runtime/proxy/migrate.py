"""Moving an in-flight decode stream to another decode instance (a drain with ``migrate``).

An evacuated stream stops being relayed at an SSE event boundary (relay.py
``DecodeConnection.stop_relay``: only complete events were ever written to the
client), its upstream connection is closed (the engine aborts the request when
the client side disconnects), and the answer is continued the way a
``recomputed`` answer is (pd.py ``RecomputeTracker``): a fresh prefill of the
prompt plus the text relayed so far, then a decode elsewhere for the tokens
still due. The client sees one stream: the continuation's role-only first chat
chunk is dropped, and the continuation's text starts where the relayed text
ended (it is generated after it, not repeated).

The continuation request (:func:`continuation_request`):

- completions: ``prompt`` = original prompt + text so far;
- chat: the original messages plus an assistant message holding the text so
  far, with ``add_generation_prompt: false`` and ``continue_final_message:
  true`` so the model continues that message (vLLM 0.23.0
  ``ChatCompletionRequest``, vllm/entrypoints/openai/chat_completion/protocol.py:
  both fields, and the check that they are not both true); a request that
  already continued its final message gets the text appended to it;
- the token limit the request had (chat: ``max_completion_tokens`` if set, else
  ``max_tokens``, as that protocol's ``to_sampling_params`` reads them;
  completions: ``max_tokens``, default 16) minus the tokens relayed, counted as
  one per SSE event with text (vLLM streams one event per engine step, so with
  speculative decoding (MTP) an event may carry more than one token and the
  continuation may run over the limit by the extra tokens); ``min_tokens``
  reduced the same way; no limit stays no limit.

Streams that are not continued this way finish in place (the drain then waits
for them): more than one choice (``n`` > 1), ``echo``, a prompt that is not
one string (token ids, batches), and a stream with fewer than
:data:`MIN_TOKENS_LEFT` tokens left.

The continuation is the same answer to the client (:func:`continuation_rewrite`): its events carry the
first attempt's ``id`` and ``created``, and its ``usage`` counts the original prompt (the first prefill
answer's ``usage.prompt_tokens``) and every token the client got (those relayed before plus the
continuation's), not the continuation's own prompt (original prompt + text so far), so a client that
bills by usage is charged for what it asked and got. The same holds after a recompute.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ascend_runtime.proxy.boundedjson import JsonError, load_json
from ascend_runtime.proxy.pd import RecomputeTracker, sse_events, with_text
from ascend_runtime.proxy.relay import DecodeConnection, deframe

#: a stream with fewer tokens than this left finishes where it is (a re-prefill would cost more)
MIN_TOKENS_LEFT = 2


@dataclass
class MigrationTracker(RecomputeTracker):
    """:class:`RecomputeTracker` plus what a migration needs: the validated fields and a count.

    ``fields``: validate.py's checked fields of the request; ``migrations``: continuations after a
    migration so far; ``resume``: the request being sent continues a migrated stream.
    """

    fields: Any = None
    migrations: int = 0
    resume: bool = False
    #: the answer as the client first saw it: its ``id`` and ``created``, and the original prompt's tokens
    stream_id: str | None = None
    stream_created: int | None = None
    prompt_tokens: int | None = None

    def note_identity(self, events: list[dict[str, Any]]) -> None:
        """Keep the ``id`` and ``created`` of the first relayed event (the answer's, for its continuations)."""
        if self.stream_id is None and events:
            first = events[0]
            if isinstance(first.get("id"), str):
                self.stream_id = first["id"]
            if isinstance(first.get("created"), int):
                self.stream_created = first["created"]

    def note_prompt_tokens(self, prefill_answer: Any) -> None:
        """Keep the original prompt's token count from the first prefill answer's ``usage``."""
        if self.prompt_tokens is None and isinstance(prefill_answer, dict):
            usage = prefill_answer.get("usage")
            tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if isinstance(tokens, int) and not isinstance(tokens, bool):
                self.prompt_tokens = tokens

    def limit(self) -> int | None:
        """The request's output token limit (None: none)."""
        f = self.fields
        if f is None:
            return self.origin_max_tokens
        if self.chat:
            return f.max_completion_tokens if f.max_completion_tokens is not None else f.max_tokens
        return f.max_tokens

    def tokens_relayed(self) -> int:
        """Output tokens the client has so far (recomputed events are not tokens: see pd.py)."""
        return self.completion_tokens - self.retries


def migratable(tracker: MigrationTracker) -> bool:
    """True if this request's stream can be continued on another instance (module docstring)."""
    req, f = tracker.original, tracker.fields
    if f is None or not f.stream or f.echo:
        return False
    n = req.get("n")
    if n not in (None, 1) or req.get("best_of") not in (None, 1):
        return False
    if tracker.chat:
        messages = req.get("messages")
        return isinstance(messages, list) and bool(messages) and all(isinstance(m, dict) for m in messages)
    return isinstance(req.get("prompt"), str)


def relayed_events(history: list[bytes], chunked: bool) -> list[dict[str, Any]]:
    """The JSON events of what the relay wrote to the client (``history`` of ``DecodeConnection.relay``)."""
    return sse_events(b"".join(deframe(history) if chunked else history))


def _text(choice: dict[str, Any]) -> str:
    return (choice.get("delta") or {}).get("content") or choice.get("text") or ""


def account(tracker: MigrationTracker, events: list[dict[str, Any]]) -> int:
    """Feed the tracker the relayed events that carry text; returns how many (tokens, one per event)."""
    n = 0
    for event in events:
        choices = event.get("choices") or []
        if choices and _text(choices[0]):
            tracker.add_choice(choices[0], None)
            n += 1
    return n


def continuation_request(tracker: MigrationTracker) -> dict[str, Any]:
    """The request that continues a migrated stream (module docstring); marks the tracker ``resume``."""
    tracker.migrations += 1
    tracker.resume = True
    req = copy.deepcopy(tracker.original)
    req.pop("kv_transfer_params", None)
    text = tracker.generated
    if tracker.chat:
        messages = req["messages"]
        last = messages[-1]
        continued = with_text(last.get("content"), text) if req.get("continue_final_message") else None
        if continued is not None:
            last["content"] = continued
        else:
            messages.append({"role": "assistant", "content": text})
            req["add_generation_prompt"] = False
            req["continue_final_message"] = True
    else:
        req["prompt"] = f"{tracker.origin_prompt}{text}"
    used = tracker.tokens_relayed()
    limit = tracker.limit()
    if limit is not None:
        left = max(1, limit - used)
        if tracker.chat and tracker.fields is not None and tracker.fields.max_completion_tokens is not None:
            req["max_completion_tokens"] = left
            if req.get("max_tokens") is not None:
                req["max_tokens"] = left
        else:
            req["max_tokens"] = left
    if isinstance(req.get("min_tokens"), int) and not isinstance(req.get("min_tokens"), bool):
        req["min_tokens"] = max(0, req["min_tokens"] - used)
    tracker.current = req
    return req


def continuation_rewrite(tracker: MigrationTracker) -> Callable[[bytes], bytes]:
    """A rewrite of a continuation's complete SSE events (module docstring): the first attempt's ``id`` and
    ``created``; ``usage`` with the original prompt's tokens and, as completion tokens, the
    ``tracker.tokens_relayed()`` tokens before this continuation plus its own. Lines that are not JSON
    ``data:`` objects pass unchanged."""
    before = tracker.tokens_relayed()

    def fix(obj: dict[str, Any]) -> None:
        if tracker.stream_id is not None and "id" in obj:
            obj["id"] = tracker.stream_id
        if tracker.stream_created is not None and "created" in obj:
            obj["created"] = tracker.stream_created
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            if tracker.prompt_tokens is not None:
                usage["prompt_tokens"] = tracker.prompt_tokens
            usage["completion_tokens"] += before
            if isinstance(usage.get("prompt_tokens"), int):
                usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]

    def rewrite(data: bytes) -> bytes:
        lines = data.split(b"\n")
        for i, line in enumerate(lines):
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            try:
                obj = load_json(line[5:])
            except JsonError:
                continue
            if isinstance(obj, dict):
                fix(obj)
                lines[i] = b"data: " + json.dumps(obj, separators=(",", ":")).encode()
        return b"\n".join(lines)

    return rewrite


def drop_role_events(payload: bytes) -> bytes:
    """``payload`` (SSE bytes) without its complete chat events that only announce the role."""
    if b'"role"' not in payload:
        return payload
    parts = payload.split(b"\n\n")
    kept = []
    for raw in parts[:-1]:
        events = sse_events(raw + b"\n\n") if b'"role"' in raw else []
        if events and all(_role_only(e) for e in events):
            continue
        kept.append(raw + b"\n\n")
    return b"".join(kept) + parts[-1]


def _role_only(event: dict[str, Any]) -> bool:
    choices = event.get("choices") or []
    return bool(choices) and all(
        "role" in (c.get("delta") or {}) and not (c.get("delta") or {}).get("content") and not c.get("finish_reason")
        for c in choices)


class StreamHandle:
    """A stream being relayed from a decode instance, as the pool's evacuation sees it (pool.track)."""

    __slots__ = ("conn", "tracker", "history", "chunked")

    def __init__(self, conn: DecodeConnection, tracker: MigrationTracker, history: list[bytes], chunked: bool) -> None:
        self.conn, self.tracker, self.history, self.chunked = conn, tracker, history, chunked

    def finished(self) -> bool:
        """The last write already ended the answer (a finish reason, or the usage chunk)."""
        if not self.history:
            return False
        if b"[DONE]" in self.history[-1]:
            return True
        for event in relayed_events(self.history[-1:], self.chunked):
            choices = event.get("choices")
            if not choices or any(c.get("finish_reason") for c in choices):
                return True
        return False

    def continuable(self, min_left: int = MIN_TOKENS_LEFT) -> bool:
        """True if the rest of this stream can come from another instance (module docstring); ``min_left``: the
        fewest tokens still due that make a continuation worth a prefill (a broken stream takes any: 1)."""
        t = self.tracker
        if not migratable(t):
            return False
        limit = t.limit()
        if limit is not None:
            relayed = sum(d.count(b"\n\n") for d in self.history)  # events this attempt: an upper bound of tokens
            if limit - t.tokens_relayed() - relayed < min_left:
                return False
        return not self.finished()

    def migrate(self) -> bool:
        """Stop relaying this stream so it is continued elsewhere; False if it finishes in place."""
        return self.continuable() and self.conn.stop_relay()
