"""A fixed-response engine that writes vLLM 0.23.0's exact bytes, for proxy tests of the real wire behaviour.

Not a model of an engine: each answer is given as bytes by the test (a ``script`` function of the request),
framed as uvicorn frames what vLLM's FastAPI app returns (vLLM 0.23.0 runs uvicorn,
vllm/entrypoints/launcher.py):

- ``JSONResponse`` (vllm/entrypoints/openai/completion/api_router.py): ``content-length`` and
  ``content-type: application/json``, the body compact JSON (starlette's ``JSONResponse.render``);
- ``StreamingResponse(media_type="text/event-stream")``: ``content-type: text/event-stream; charset=utf-8``,
  ``transfer-encoding: chunked``, one chunk per ``yield`` of the stream generator (``data: ...\\n\\n``).

``keepalive_s`` models uvicorn's idle close (``timeout_keep_alive`` = ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s by
default, vllm/envs.py) in the case that matters to a client: a request sent on a connection that has been idle
that long meets a server that is closing it, so it is dropped unanswered (the connection is aborted). The close
itself is not sent earlier, so the client cannot notice it in time: this is the race, made deterministic.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def json_answer(obj: Any, status: int = 200) -> bytes:
    """A ``JSONResponse`` as uvicorn sends it."""
    body = json.dumps(obj, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}[status]
    return (b"HTTP/1.1 %d %b\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: %d\r\n"
            b"content-type: application/json\r\n\r\n%b" % (status, reason.encode(), len(body), body))


def sse_answer(events: list[bytes]) -> bytes:
    """A ``StreamingResponse`` of ``events`` (each a whole ``data: ...\\n\\n``), one chunk per event."""
    head = (b"HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
            b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n")
    return head + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


def event(obj: Any) -> bytes:
    """One SSE event of a chunk object (pydantic's ``model_dump_json``: compact)."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class WireEngine:
    """``script(request, index)`` returns the answer bytes for the ``index``-th request this engine got."""

    script: Callable[[Request, int], bytes]
    keepalive_s: float | None = None
    requests: list[Request] = field(default_factory=list)
    #: requests dropped unanswered on a connection idle for ``keepalive_s`` (the keep-alive race)
    dropped: int = 0
    connections: int = 0
    server: asyncio.AbstractServer | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self.server is not None
        return "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def start(self) -> WireEngine:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.connections += 1
        idle_since = time.monotonic()
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
                    return
                if self.keepalive_s is not None and time.monotonic() - idle_since >= self.keepalive_s:
                    self.dropped += 1
                    writer.transport.abort()
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                req = Request(method, path, headers, json.loads(raw) if raw else None)
                self.requests.append(req)
                writer.write(self.script(req, len(self.requests) - 1))
                await writer.drain()
                idle_since = time.monotonic()
        finally:
            writer.close()
