"""A completions request with several prompts, served as one PD request per prompt and answered as one.

vLLM answers a batch of prompts with one ``kv_transfer_params`` for the whole request (the first prompt's:
``CompletionResponse`` in vllm/entrypoints/openai/completion/serving.py, vLLM 0.23.0), so a decode given
that answer would load the first prompt's KV for every prompt. The proxy therefore sends each prompt as
its own completions request, to itself (its own listening address: each part gets the whole PD flow,
its own prefill/decode pair, retries and migration), and joins the answers as vLLM 0.23.0's server joins
a batch's (``OpenAIServingCompletion``, same file):

- every part is validated by the engines before any text is sent: the first part (in prompt order) that is
  refused is the answer, and the other parts are cancelled;
- choices are numbered ``prompt_index * n + choice_index`` (``n`` choices per prompt), in the answer and in
  every stream event; ``id`` and ``created`` are the first part's, for every event;
- ``usage`` is the sum over the parts (prompt, completion and total tokens); in a stream, the final
  usage-only event (``stream_options.include_usage``) is sent once, after the last part ended, with the
  sums; a per-event ``usage`` (``continuous_usage_stats``) stays the part's own, as vLLM's is the prompt's;
- stream events are sent as they arrive from the parts (vLLM interleaves a batch's prompts the same way);
  an error event of a part ends the stream after it, and one ``data: [DONE]`` ends every stream.

Each part carries the client's ``X-Request-Id`` with ``-<prompt index>`` appended, and its
``Authorization`` header; in ``requests_total`` a batch of N prompts counts N + 1 requests (the parts and
the batch). Chat requests have no batch form.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http import HttpVersion11

from ascend_runtime.proxy.errors import error_response
from ascend_runtime.proxy.pd import REQUEST_ID_HEADER

DONE = b"data: [DONE]\n\n"
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def batch_prompts(req: dict[str, Any]) -> list[Any] | None:
    """The prompts of a completions request with more than one (strings or token-id lists), else None."""
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, (str, list)) for p in prompt):
        return prompt
    return None


def parts(req: dict[str, Any], prompts: list[Any]) -> list[dict[str, Any]]:
    """One request per prompt: the client's request with ``prompt`` replaced."""
    return [{**req, "prompt": p} for p in prompts]


def _sum_usage(usages: list[dict[str, Any]]) -> dict[str, Any]:
    total = dict(usages[0])
    for key in USAGE_KEYS:
        total[key] = sum(int(u.get(key) or 0) for u in usages)
    return total


def join_answers(answers: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The batch's answer from each prompt's (in prompt order): choices renumbered, usage summed."""
    joined = dict(answers[0])
    choices = []
    for i, answer in enumerate(answers):
        for choice in answer.get("choices") or []:
            choices.append({**choice, "index": i * n + int(choice.get("index") or 0)})
    joined["choices"] = choices
    usages = [a["usage"] for a in answers if isinstance(a.get("usage"), dict)]
    if usages:
        joined["usage"] = _sum_usage(usages)
    return joined


class StreamJoiner:
    """Rewrites the events of each part's stream into the batch's stream (see the module docstring)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.id: Any = None
        self.created: Any = None
        self.usage_events: list[dict[str, Any]] = []
        self.failed = False

    def event(self, index: int, data: bytes) -> bytes | None:
        """The bytes to send for part ``index``'s event ``data`` (one ``data: ...`` line), or None."""
        payload = data[len(b"data: "):].strip()
        if payload == b"[DONE]":
            return None
        try:
            doc = json.loads(payload)
        except ValueError:
            return data if data.endswith(b"\n\n") else data + b"\n\n"
        if not isinstance(doc, dict) or "error" in doc:
            self.failed = True
            return b"data: " + payload + b"\n\n"
        if self.id is None:
            self.id, self.created = doc.get("id"), doc.get("created")
        doc["id"], doc["created"] = self.id, self.created
        choices = doc.get("choices")
        if choices == [] and isinstance(doc.get("usage"), dict):  # the part's final usage event
            self.usage_events.append(doc)
            return None
        for choice in choices or []:
            choice["index"] = index * self.n + int(choice.get("index") or 0)
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    def final(self) -> bytes:
        """The summed usage event (when the parts sent theirs) and ``[DONE]``."""
        out = b""
        if self.usage_events and not self.failed:
            last = dict(self.usage_events[-1])
            last["usage"] = _sum_usage([e["usage"] for e in self.usage_events])
            out += b"data: " + json.dumps(last, separators=(",", ":")).encode() + b"\n\n"
        return out + DONE


async def _events(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The ``data:`` events of an SSE body, one at a time (without the blank line)."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data:"):
                    yield line
    if buf.strip().startswith(b"data:"):
        yield buf.strip()


class BatchServer:
    """Serves a batch of prompts through ``self_url`` (the proxy's own address), one request per prompt."""

    def __init__(self, session: aiohttp.ClientSession, self_url: str) -> None:
        self.session, self.self_url = session, self_url.rstrip("/")

    def _headers(self, request: web.Request, client_id: str, index: int) -> dict[str, str]:
        headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: f"{client_id}-{index}"}
        auth = request.headers.get("Authorization")
        if auth:
            headers["Authorization"] = auth
        return headers

    async def serve(self, request: web.Request, req: dict[str, Any], prompts: list[Any], n: int, stream: bool,
                    client_id: str) -> tuple[web.StreamResponse, str]:
        """The batch's answer and its outcome label (``success``, ``client_error``, ``upstream_error``,
        ``stream_error``)."""
        url = self.self_url + "/v1/completions"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with contextlib.AsyncExitStack() as stack:
            async def open_part(i: int, body: dict[str, Any]) -> aiohttp.ClientResponse:
                return await stack.enter_async_context(self.session.post(
                    url, data=json.dumps(body).encode(), headers=self._headers(request, client_id, i),
                    timeout=timeout))

            try:
                resps = await asyncio.gather(*(open_part(i, b) for i, b in enumerate(parts(req, prompts))))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                return error_response(502, f"a prompt of the batch could not be sent: {type(exc).__name__}"), \
                    "upstream_error"
            refused = next((r for r in resps if r.status != 200), None)
            if refused is not None:  # as vLLM, which validates every prompt before it generates
                body = await refused.read()
                outcome = "client_error" if 400 <= refused.status < 500 else "upstream_error"
                return web.Response(status=refused.status, body=body,
                                    content_type=refused.content_type or "application/json"), outcome
            if not stream:
                answers = [await r.json(content_type=None) for r in resps]
                joined = json.dumps(join_answers(answers, n), separators=(",", ":")).encode()
                return web.Response(body=joined, headers={"Content-Type": "application/json"}), "success"
            return await self._stream(request, resps, n, client_id)

    async def _stream(self, request: web.Request, resps: list[aiohttp.ClientResponse], n: int,
                      client_id: str) -> tuple[web.StreamResponse, str]:
        client = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                         REQUEST_ID_HEADER: client_id})
        if request.version >= HttpVersion11:
            client.enable_chunked_encoding()
        await client.prepare(request)
        joiner = StreamJoiner(n)
        queue: asyncio.Queue[tuple[int, bytes | None]] = asyncio.Queue()

        async def pump(i: int, resp: aiohttp.ClientResponse) -> None:
            try:
                async for data in _events(resp):
                    await queue.put((i, data))
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                await queue.put((i, b"data: " + json.dumps({"error": {
                    "message": f"prompt {i} of the batch broke off: {type(exc).__name__}", "type": "BadGateway",
                    "param": None, "code": 502}}).encode()))
            finally:
                await queue.put((i, None))

        pumps = [asyncio.create_task(pump(i, r)) for i, r in enumerate(resps)]
        try:
            open_parts = len(resps)
            while open_parts:
                i, data = await queue.get()
                if data is None:
                    open_parts -= 1
                    continue
                out = joiner.event(i, data)
                if out is not None:
                    await client.write(out)
                if joiner.failed:
                    break
            await client.write(joiner.final())
            await client.write_eof()
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
        return client, ("stream_error" if joiner.failed else "success")

