"""vLLM 0.23.0's utility routes on the simulator: ``/version``, ``/ping``, ``/load``, ``/tokenize``, ``/detokenize``.

As vLLM's API server answers them (``vllm/entrypoints/serve/``): ``/version`` ``{"version": "0.23.0"}``;
``/ping`` (GET and POST) as ``/health``, 200 with no body; ``/load`` ``{"server_load": 0}`` (vLLM counts
only with ``--enable-server-load-tracking``, off by default); ``/tokenize`` ``{"count", "max_model_len",
"tokens", "token_strs"}`` of a completion ``prompt`` or chat ``messages`` with the simulator's token
accounting (one token per word; 4 template tokens per message), ``token_strs`` only with
``return_token_strs``; ``/detokenize`` ``{"prompt"}`` of ``tokens``. An unknown ``model`` is 404
``NotFoundError``; a body that is not JSON or lacks its field is 400 ``Bad Request``, as FastAPI answers.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ascend_runtime.sim import api, output

VERSION = "0.23.0"


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=output.dumps(data), status=status, content_type="application/json")


def _missing(field: str, body: Any) -> api.ApiError:
    err = {"type": "missing", "loc": ("body", field), "msg": "Field required", "input": body}
    return api.ApiError(400, api.validation_message([err], "tokenize"), "Bad Request")


def _check_model(body: dict[str, Any], served: str) -> None:
    model = body.get("model")
    if model and model != served:
        raise api.ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")


def tokenize_body(body: Any, served: str, max_model_len: int) -> dict[str, Any]:
    """The ``/tokenize`` answer to a decoded body; raises :class:`api.ApiError`."""
    if not isinstance(body, dict):
        raise api.ApiError(500, f"'{type(body).__name__}' object has no attribute 'get'", "InternalServerError")
    if "messages" in body and isinstance(body["messages"], list):
        _check_model(body, served)
        pieces = output.chat_pieces([(str(m.get("role", "user")), str(m.get("content") or ""))
                                     for m in body["messages"] if isinstance(m, dict)])
    elif isinstance(body.get("prompt"), str):
        _check_model(body, served)
        pieces = [f" {w}" for w in body["prompt"].split()] or [body["prompt"]]
    else:
        raise _missing("prompt" if "messages" not in body else "messages", body)
    return {"count": len(pieces), "max_model_len": max_model_len, "tokens": [output.piece_id(p) for p in pieces],
            "token_strs": pieces if body.get("return_token_strs") else None}


class UtilityRoutes:
    """Handlers over a served model name, its max_model_len and the health check (``ready``)."""

    def __init__(self, served: str, max_model_len: int, health: Any) -> None:
        self.served, self.max_model_len, self.health = served, max_model_len, health

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VERSION})

    async def ping(self, request: web.Request) -> web.Response:
        return await self.health(request)

    async def load(self, request: web.Request) -> web.Response:
        return _json({"server_load": 0})

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = api.decode_body(await request.read(), request.headers.get("Content-Type", ""), "tokenize")
            return _json(tokenize_body(body, self.served, self.max_model_len))
        except api.ApiError as exc:
            return _json(exc.body(), exc.status)

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = api.decode_body(await request.read(), request.headers.get("Content-Type", ""), "tokenize")
            if not isinstance(body, dict) or not isinstance(body.get("tokens"), list):
                raise _missing("tokens", body)
            _check_model(body, self.served)
            return _json({"prompt": "".join(output.decode_token(int(t)) for t in body["tokens"])})
        except api.ApiError as exc:
            return _json(exc.body(), exc.status)

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/version", self.version), web.get("/ping", self.ping), web.post("/ping", self.ping),
                web.get("/load", self.load), web.post("/tokenize", self.tokenize),
                web.post("/detokenize", self.detokenize)]
