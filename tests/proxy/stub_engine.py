"""A small, protocol-faithful stand-in for a vLLM-Ascend prefill or decode instance.

Follows the simulator contract: OpenAI completions/chat (SSE or JSON), PD
kv_transfer_params handshake, /health (503 until ready), /metrics with vLLM
names, POST /admin/faults, ``x-instance`` header, one token per word. For
tests it also records every request it got (``stub.requests``), the
``X-Request-Id`` / ``X-Client-Request-Id`` headers of each (``stub.request_ids``,
``stub.client_request_ids``, same order) and the exact bytes of each answer
(``stub.sent``), and can answer ``stop_reason: "recomputed"`` after
``recompute_after`` tokens (once). ``health_hang`` / ``health_status`` make
``/health`` never answer or answer another status; ``health_calls`` counts them.
Answers of the wrong shape: ``prefill_rewrite`` (any prefill answer),
``decode_raw`` (the bytes of every decode answer), ``metrics_raw`` and
``models_raw`` (the bytes of ``/metrics`` and ``/v1/models``).

Request ids: a request whose ``X-Request-Id`` is already live on this stub is
refused with 400 and a vLLM 0.23-shaped error body. This is a deliberate
tripwire, stricter than vLLM 0.23.0, which accepts a duplicate external id and
makes the engine-side id unique itself (vllm/v1/engine/input_processor.py
``assign_request_id``); it lets the proxy tests catch an attempt id reused
while it is still running.

Run standalone: ``python -m tests.proxy.stub_engine --role decode --name d0 --port 8200``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def error_body(message: str, code: int, err_type: str = "BadRequestError") -> dict[str, Any]:
    """vLLM 0.23.0's ErrorResponse JSON (vllm/entrypoints/openai/engine/protocol.py)."""
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


@dataclass
class Faults:
    error_rate: float = 0.0
    added_latency_ms: float = 0.0
    hang: bool = False


@dataclass
class StubEngine:
    role: str
    name: str
    kv_port: int = 30000
    token_interval_s: float = 0.0
    ready_after_s: float = 0.0
    recompute_after: int | None = None
    kv_usage: float = 0.0
    health_hang: bool = False  # /health never answers (a saturated engine, as far as a short timeout sees)
    health_status: int | None = None  # /health answers this status instead
    health_calls: int = 0
    #: prefill answers as an engine without a KV connector does: no kv_transfer_params
    no_kv_handover: bool = False
    #: rewrites every prefill answer: gets the answer object, returns what to send with 200 (bytes as they are,
    #: anything else as JSON); for answers of the wrong shape
    prefill_rewrite: Callable[[dict[str, Any]], Any] | None = None
    #: sent as the 200 body of every decode answer instead of the usual one (a stream: these bytes after the head)
    decode_raw: bytes | None = None
    #: sent as the 200 body of GET /metrics and GET /v1/models instead of the usual answer (bytes as they are)
    metrics_raw: bytes | None = None
    models_raw: bytes | None = None
    #: a prefill stub answers a plain request (no kv_transfer_params) as a whole engine does, instead of 400
    plain_requests: bool = False
    #: the context limit /v1/models reports (vLLM's ModelCard.max_model_len); None: the key is left out
    max_model_len: int | None = None
    faults: Faults = field(default_factory=Faults)
    requests: list[dict[str, Any]] = field(default_factory=list)
    request_ids: list[str | None] = field(default_factory=list)
    client_request_ids: list[str | None] = field(default_factory=list)
    live_ids: set[str] = field(default_factory=set)
    refused_duplicates: int = 0
    sent: list[bytes] = field(default_factory=list)
    cancelled: int = 0
    running: int = 0
    started: float = field(default_factory=time.monotonic)

    def app(self) -> web.Application:
        app = web.Application()
        app.add_routes([
            web.post("/v1/completions", self.completion),
            web.post("/v1/chat/completions", self.completion),
            web.get("/v1/models", self.models),
            web.get("/health", self.health),
            web.get("/metrics", self.metrics),
            web.post("/admin/faults", self.set_faults),
        ])
        return app

    def _hdr(self) -> dict[str, str]:
        return {"x-instance": self.name}

    async def health(self, request: web.Request) -> web.Response:
        self.health_calls += 1
        if self.health_hang:
            await asyncio.sleep(3600)
        if self.health_status is not None:
            return web.Response(status=self.health_status, headers=self._hdr())
        ready = time.monotonic() - self.started >= self.ready_after_s
        return web.Response(status=200 if ready else 503, headers=self._hdr())

    async def models(self, request: web.Request) -> web.Response:
        if self.models_raw is not None:
            return web.Response(body=self.models_raw, content_type="application/json", headers=self._hdr())
        card: dict[str, Any] = {"id": "deepseek-r1", "object": "model"}
        if self.max_model_len is not None:
            card["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [card]}, headers=self._hdr())

    async def metrics(self, request: web.Request) -> web.Response:
        if self.metrics_raw is not None:
            return web.Response(body=self.metrics_raw, content_type="text/plain", headers=self._hdr())
        text = (f'vllm:num_requests_running{{engine="0",model_name="deepseek-r1"}} {self.running}\n'
                f'vllm:num_requests_waiting{{engine="0",model_name="deepseek-r1"}} 0\n'
                f'vllm:kv_cache_usage_perc{{engine="0",model_name="deepseek-r1"}} {self.kv_usage}\n')
        return web.Response(text=text, headers=self._hdr())

    async def set_faults(self, request: web.Request) -> web.Response:
        data = await request.json()
        if data.get("exit"):
            os._exit(1)
        for key in ("error_rate", "added_latency_ms", "hang"):
            if key in data:
                setattr(self.faults, key, data[key])
        return web.json_response({"ok": True})

    async def completion(self, request: web.Request) -> web.StreamResponse:
        req = await request.json()
        rid = request.headers.get("X-Request-Id")
        self.requests.append(req)
        self.request_ids.append(rid)
        self.client_request_ids.append(request.headers.get("X-Client-Request-Id"))
        if rid is not None and rid in self.live_ids:
            self.refused_duplicates += 1
            msg = f"request id {rid!r} is already running on {self.name} (stub tripwire)"
            return web.json_response({"error": {"message": msg, "type": "BadRequestError", "param": None,
                                                 "code": 400}}, status=400, headers=self._hdr())
        if rid is not None:
            self.live_ids.add(rid)
        self.running += 1
        try:
            if self.faults.hang:
                await asyncio.sleep(3600)
            if self.faults.added_latency_ms:
                await asyncio.sleep(self.faults.added_latency_ms / 1000)
            if self.faults.error_rate and random.random() < self.faults.error_rate:
                return web.json_response(error_body("injected fault", 500, "InternalServerError"), status=500,
                                         headers=self._hdr())
            chat = request.path.endswith("/chat/completions")
            if self.role == "prefill":
                if self.plain_requests and not (req.get("kv_transfer_params") or {}).get("do_remote_decode"):
                    # answered as a whole engine would: generated here, no KV handed over
                    return await self._decode_answer(request, {**req, "kv_transfer_params": {"do_remote_prefill": True}},
                                                     chat)
                return self._prefill_answer(req, chat)
            return await self._decode_answer(request, req, chat)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
            if rid is not None:
                self.live_ids.discard(rid)

    def _prefill_answer(self, req: dict[str, Any], chat: bool) -> web.Response:
        kv = req.get("kv_transfer_params") or {}
        if not kv.get("do_remote_decode") or req.get("max_tokens") != 1 or req.get("stream"):
            return web.json_response(error_body("not a PD prefill request", 400), status=400)
        n = len(self.requests)
        body = {
            "id": f"cmpl-{self.name}-{n}", "object": "chat.completion" if chat else "text_completion",
            "model": req.get("model", "deepseek-r1"),
            "choices": [{"index": 0, "finish_reason": "length",
                         **({"message": {"role": "assistant", "content": "x"}} if chat else {"text": "x"})}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            "kv_transfer_params": {
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_engine_id": f"engine-{self.name}", "remote_request_id": f"cmpl-{self.name}-{n}",
                "remote_block_ids": [n, n + 1, n + 2],
                "remote_host": "127.0.0.1", "remote_port": self.kv_port, "tp_size": 1,
            },
        }
        if self.no_kv_handover:
            body["kv_transfer_params"] = None
        sent = body if self.prefill_rewrite is None else self.prefill_rewrite(body)
        raw = sent if isinstance(sent, bytes) else json.dumps(sent).encode()
        self.sent.append(raw)
        return web.Response(body=raw, content_type="application/json", headers=self._hdr())

    def _chunk(self, chat: bool, text: str, finish: str | None, stop: str | None) -> bytes:
        if chat:
            choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish, "stop_reason": stop}
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish, "stop_reason": stop}
        obj = {"id": "cmpl-stub", "object": "chat.completion.chunk" if chat else "text_completion",
               "model": "deepseek-r1", "choices": [choice]}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    async def _decode_answer(self, request: web.Request, req: dict[str, Any], chat: bool) -> web.StreamResponse:
        kv = req.get("kv_transfer_params") or {}
        if not kv.get("do_remote_prefill"):
            return web.json_response(error_body("decode needs kv_transfer_params", 400), status=400)
        if self.decode_raw is not None:
            return await self._raw_decode_answer(request, bool(req.get("stream")))
        max_tokens = int(req.get("max_tokens", 16))
        recompute_at = self.recompute_after
        if recompute_at is not None:
            self.recompute_after = None  # recompute only once
        words = [f"w{i}" for i in range(max_tokens)]
        if not req.get("stream"):
            if recompute_at is not None:
                words = words[:recompute_at]
            text = " " + " ".join(words)
            stop = "recomputed" if recompute_at is not None else None
            choice = ({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            body = {"id": "cmpl-stub", "object": "chat.completion" if chat else "text_completion",
                    "choices": [{"index": 0, **choice, "finish_reason": "stop" if stop else "length",
                                 "stop_reason": stop}],
                    "usage": {"completion_tokens": len(words)}}
            raw = json.dumps(body).encode()
            self.sent.append(raw)
            return web.Response(body=raw, content_type="application/json", headers=self._hdr())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", **self._hdr()})
        await resp.prepare(request)
        sent = bytearray()
        for i, w in enumerate(words):
            if self.token_interval_s:
                await asyncio.sleep(self.token_interval_s)
            if recompute_at is not None and i == recompute_at:
                data = self._chunk(chat, " " + w, "stop", "recomputed")
                sent += data
                await resp.write(data)
                break
            last = i == len(words) - 1
            data = self._chunk(chat, " " + w, "length" if last else None, None)
            sent += data
            await resp.write(data)
        sent += b"data: [DONE]\n\n"
        await resp.write(b"data: [DONE]\n\n")
        self.sent.append(bytes(sent))
        await resp.write_eof()
        return resp


    async def _raw_decode_answer(self, request: web.Request, stream: bool) -> web.StreamResponse:
        assert self.decode_raw is not None
        self.sent.append(self.decode_raw)
        if not stream:
            return web.Response(body=self.decode_raw, content_type="application/json", headers=self._hdr())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", **self._hdr()})
        await resp.prepare(request)
        await resp.write(self.decode_raw)
        await resp.write_eof()
        return resp


@dataclass
class StubHandle:
    engine: StubEngine
    runner: web.AppRunner
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        await self.runner.cleanup()


async def start_stub(role: str, name: str, port: int = 0, **kwargs: Any) -> StubHandle:
    """Start a stub engine in this event loop on 127.0.0.1 (port 0 = free port)."""
    engine = StubEngine(role=role, name=name, **kwargs)
    runner = web.AppRunner(engine.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    return StubHandle(engine, runner, site._server.sockets[0].getsockname()[1])  # noqa: SLF001


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--token-interval-s", type=float, default=0.0)
    args = ap.parse_args()
    engine = StubEngine(role=args.role, name=args.name, token_interval_s=args.token_interval_s)
    web.run_app(engine.app(), host="127.0.0.1", port=args.port, print=None, access_log=None,
                handler_cancellation=True)


if __name__ == "__main__":
    main()
