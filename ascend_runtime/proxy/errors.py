"""The proxy's error answers, in the shape of the engine release it fronts (vLLM 0.23.0).

vLLM 0.23.0 answers every error with ``ErrorResponse``
(``vllm/entrypoints/openai/engine/protocol.py``)::

    {"error": {"message": "...", "type": "...", "param": null, "code": 400}}

and, once a stream has started, with that object as one SSE ``data:`` event
before ``data: [DONE]`` (``create_streaming_error_response`` in
``vllm/entrypoints/openai/engine/serving.py``). The proxy's own errors use the
same shape; their ``type`` is the HTTP status phrase ("Bad Request",
"Bad Gateway", "Service Unavailable"), as vLLM's handlers type errors raised at
the HTTP layer (``http_exception_handler`` and ``validation_exception_handler``
in ``vllm/entrypoints/serve/utils/server_utils.py``). Engine errors are relayed
unchanged. A path with no route answers ``{"detail": "Not Found"}`` (404), as
vLLM's FastAPI app and the reference proxy (a FastAPI app too) do.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from aiohttp import web

from ascend_runtime.proxy.boundedjson import JsonError, load_json


def _dumps(obj: Any) -> bytes:
    """Compact JSON, UTF-8; escaped to ASCII when a string holds a lone surrogate (a ``"\\ud800"`` escape
    of a client's or an engine's JSON), which UTF-8 cannot encode."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


def error_body(message: str, code: int, err_type: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An ``ErrorResponse``; ``err_type`` defaults to the status phrase."""
    return {"error": {"message": message, "type": err_type or HTTPStatus(code).phrase, "param": param, "code": code}}


def error_response(status: int, message: str, err_type: str | None = None,
                   headers: dict[str, str] | None = None, param: str | None = None) -> web.Response:
    """A JSON error answer."""
    return web.Response(body=_dumps(error_body(message, status, err_type, param)), status=status,
                        content_type="application/json", headers=headers)


def sse_error_event(message: str, code: int = 502, err_type: str | None = None) -> bytes:
    """A final SSE error event followed by ``[DONE]``."""
    return b"data: " + _dumps(error_body(message, code, err_type)) + b"\n\ndata: [DONE]\n\n"


def relayed_error_event(status: int, body: bytes) -> bytes:
    """An engine's error answer as the final SSE event of a stream already under way: its ``ErrorResponse``
    unchanged, or, if the body is not one, wrapped in one with the engine's status."""
    try:
        parsed = load_json(body)
    except JsonError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return b"data: " + _dumps(parsed) + b"\n\ndata: [DONE]\n\n"
    return sse_error_event(body.decode(errors="replace"), status)


def json_detail(status: int, detail: str, headers: dict[str, str] | None = None) -> web.Response:
    """FastAPI's answer for a path or method with no route: ``{"detail": "Not Found"}`` (404) or
    ``{"detail": "Method Not Allowed"}`` (405, with ``Allow``)."""
    return web.Response(body=_dumps({"detail": detail}), status=status, content_type="application/json",
                        headers=headers)
