"""Fixtures for the checks tests: an OpenAI-compatible fake with fixed, known timing.

The fake counts one token per whitespace-separated word (plus ``CHAT_OVERHEAD``
template tokens for chat), streams its first content chunk ``ttft_s`` after
the request arrived and then one chunk every ``itl_s`` on absolute deadlines
(so sleep overshoot never accumulates), sends the PD headers when asked, and
can fail in the ways the load generator must recognise.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from aiohttp import web

CHAT_OVERHEAD = 7
MODEL = "deepseek-ai/DeepSeek-R1"


@dataclass
class FakeBehaviour:
    """What the fake does; tests mutate it. Times in seconds."""

    ttft_s: float = 0.0
    itl_s: float = 0.0
    pd_headers: bool = True
    health_status: int = 200
    models_status: int = 200
    http_status: int = 200
    error_after: int | None = None  # send an SSE error event after this many chunks
    omit_done: bool = False
    role_chunk: bool = True  # chat: a role-only chunk right away (not a content chunk)
    #: /metrics as a decode with a KV connector: the share of each prompt loaded through the connector
    #: (vllm:external_prefix_cache_hits_total); None: no /metrics at all
    kv_loaded_share: float | None = 1.0
    block_size: int = 16


class FakeOpenAI:
    """The aiohttp app and its behaviour; ``url`` once started."""

    def __init__(self, behaviour: FakeBehaviour | None = None) -> None:
        self.b = behaviour or FakeBehaviour()
        self.url = ""
        self.requests = 0
        self.external_hits = 0
        #: per streaming request: perf_counter() at handler start and before each content write
        self.stream_log: list[tuple[float, list[float]]] = []
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.b.health_status, text="" if self.b.health_status == 200 else "unhealthy")

    async def models(self, request: web.Request) -> web.Response:
        if self.b.models_status != 200:
            return web.Response(status=self.b.models_status, text="no")
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        if self.b.kv_loaded_share is None:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=(
            "# TYPE vllm:external_prefix_cache_hits counter\n"
            f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="{MODEL}"}} {float(self.external_hits)}\n'
            "# TYPE vllm:prefix_cache_hits counter\n"
            f'vllm:prefix_cache_hits_total{{engine="0",model_name="{MODEL}"}} 0.0\n'
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.b.block_size}",engine="0"}} 1.0\n'))

    def _headers(self) -> dict[str, str]:
        return {"x-prefill-instance": "prefill-0", "x-decode-instance": "decode-0"} if self.b.pd_headers else {}

    async def generate(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        arrival = time.perf_counter()
        self.requests += 1
        body = await request.json()
        chat = "messages" in body
        if self.b.http_status != 200:
            return web.json_response({"error": {"message": "overloaded"}}, status=self.b.http_status)
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        prompt_tokens = len(prompt.split()) + (CHAT_OVERHEAD if chat else 0)
        self.external_hits += int(prompt_tokens * (self.b.kv_loaded_share or 0.0))
        n = int(body.get("max_tokens", 16))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            text = " ".join(f"w{i}" for i in range(n))
            choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
            return web.json_response({"id": "x", "object": obj, "choices": [choice], "usage": usage}, headers=self._headers())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **self._headers()})
        await resp.prepare(request)
        writes: list[float] = []
        self.stream_log.append((arrival, writes))

        def event(d: dict) -> bytes:
            return b"data: " + json.dumps(d).encode() + b"\n\n"

        for i in range(n):
            if self.b.error_after is not None and i == self.b.error_after:
                await resp.write(event({"error": {"message": "decode instance lost", "code": 502}}))
                return resp
            delay = t0 + self.b.ttft_s + i * self.b.itl_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if i == 0 and chat and self.b.role_chunk:  # vLLM sends the role chunk with the first token
                writes.append(time.perf_counter())  # a token event for `vllm bench serve` too
                await resp.write(event({"object": obj + ".chunk",
                                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
            piece = f" w{i}"
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            writes.append(time.perf_counter())
            await resp.write(event({"object": obj + ".chunk", "choices": [choice], "usage": None}))
        if body.get("stream_options", {}).get("include_usage"):
            await resp.write(event({"object": obj + ".chunk", "choices": [], "usage": usage}))
        if not self.b.omit_done:
            await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    """A fake in the test's own event loop (no thread; best timing)."""
    server = FakeOpenAI()
    await server.start()
    yield server
    await server.stop()


class ThreadedFake:
    """The fake running in its own thread and loop, for synchronous (CLI) tests."""

    def __init__(self) -> None:
        self.server = FakeOpenAI()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self.server

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def threaded_fake() -> Iterator[FakeOpenAI]:
    """A fake served from a background thread (its URL works for `ascend-deploy check ...`)."""
    with ThreadedFake() as server:
        yield server
