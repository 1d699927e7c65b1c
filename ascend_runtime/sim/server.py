"""The simulator's aiohttp application and its lifecycle.

``start_simulator(config)`` starts the HTTP server, the KV TCP server and the
engine on the running loop and returns a :class:`SimHandle` (``.url``,
``.port``, ``.kv_port``, ``.engine_id``, ``await .stop()``);
``run_simulator(config)`` does the same in a fresh loop until SIGINT/SIGTERM.
Routes are listed in docs/simulator.md. Every response carries ``x-instance``;
errors use vLLM 0.23.0's ``{"error": {...}}`` shape, and a path with no route
answers 404 ``{"detail": "Not Found"}`` (405 ``{"detail": "Method Not
Allowed"}``), as vLLM's FastAPI app does.
With ``SimConfig.rank_endpoints`` (rank serving) the instance listens on each DP
rank's own address instead: rank r's server admits requests to DP rank r only,
its ``/metrics`` has rank r's ``vllm:*`` series only (``engine="r"``), and it
answers ``x-dp-rank: r``; ``/health``, ``/v1/models`` and the admin routes are
the instance's on every one.
Every ``/admin/`` path needs ``Authorization: Bearer <SimConfig.admin_token>``
(401 without it); a simulator started without a token refuses them all (403).
The ids of recent completion requests are kept in ``SimState.request_ids``
(:class:`RequestIds`, in-process only) for tests and debugging.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from ascend_runtime import eventloop
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.sim import api, output, prefix_cache
from ascend_runtime.sim.engine import Engine, EngineFull, RequestGroup, Sequence
from ascend_runtime.sim.experts import ExpertMap, ExpertMapError, balancedness
from ascend_runtime.sim.faults import Faults
from ascend_runtime.sim.kv import KVPullError, KVStore, pull
from ascend_runtime.sim.metrics import SimMetrics
from ascend_runtime.sim.utility_routes import UtilityRoutes

log = logging.getLogger("ascend_runtime.sim")
#: Wall seconds a decode waits on a KV pull before failing the request (Handlers._kv_load_failed).
KV_PULL_TIMEOUT_S = 60.0
#: Seconds an idle kept-alive connection stays open (vLLM 0.23.0's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` default).
KEEP_ALIVE_S = 5.0
#: What vLLM 0.23.0's /metrics declares (prometheus_client's text format 1.0.0, the 0.0.4 text with UTF-8 names).
METRICS_CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
#: Completion requests whose ids are kept in ``SimState.request_ids``.
REQUEST_IDS_KEPT = 1024


@dataclass
class RequestIds:
    """The ids of one completion request as this instance saw them (recorded on arrival).

    ``header``: its X-Request-Id (None if absent); ``response_id``: the answer's ``id``;
    ``internal_id``: the engine-side id of its first sequence (unique, vLLM-style random
    suffix; also the ``remote_request_id`` a prefill announces); ``internal_ids``: those of
    all its sequences (prompts x n); ``remote_request_id``: on a decode, the prefill's id
    from ``kv_transfer_params``. Fields stay None when the request was refused before they
    were known.
    """

    header: str | None
    response_id: str | None = None
    internal_id: str | None = None
    remote_request_id: str | None = None
    internal_ids: tuple[str, ...] = ()


@dataclass
class SimState:
    """Everything the handlers share."""

    cfg: SimConfig
    engine: Engine
    kv: KVStore
    faults: Faults
    metrics: SimMetrics
    ready_at: float
    kv_port: int = 0
    #: The answers' ``system_fingerprint`` (vLLM's default "full" mode).
    fingerprint: str | None = None
    #: decode requests failed because their KV pull failed (answered as vLLM does, see Handlers._kv_load_failed)
    kv_load_failures: int = 0
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    request_ids: collections.deque[RequestIds] = field(
        default_factory=lambda: collections.deque(maxlen=REQUEST_IDS_KEPT))


def load_expert_map_file(path: str, cfg: SimConfig) -> ExpertMap:
    """Read and validate a vLLM-Ascend expert map file for a resolved config."""
    shape = cfg.model_shape()
    doc = json.loads(Path(path).read_text())
    return ExpertMap.from_vllm_json(doc, shape.num_moe_layers, shape.num_routed_experts, int(cfg.ep or 1),
                                    cfg.slots_per_rank)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=output.dumps(data), status=status, content_type="application/json", headers=headers)


def _error(message: str, status: int, err_type: str = "BadRequestError") -> web.Response:
    return _json(api.error_body(message, status, err_type), status)


def _api_error(exc: api.ApiError) -> web.Response:
    return _json(exc.body(), exc.status)


def _error_event(body: dict[str, Any]) -> bytes:
    """An error as a stream's event: ``json.dumps`` with its default separators, as
    ``create_streaming_error_response`` writes it (vllm/entrypoints/openai/engine/serving.py, v0.23.0)."""
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def system_fingerprint(cfg: SimConfig) -> str:
    """``vllm-<version>[-tpN][-dpN][-ep]-<hash8>`` (vllm/entrypoints/serve/utils/fingerprint.py, mode "full")."""
    parts = ["vllm-0.23.0"]
    if (cfg.tp or 1) > 1:
        parts.append(f"tp{cfg.tp}")
    if (cfg.dp or 1) > 1:
        parts.append(f"dp{cfg.dp}")
    if (cfg.ep or 1) > 1:
        parts.append("ep")
    key = f"{cfg.model}|{cfg.role}|{cfg.hardware}|{cfg.npus}|{cfg.dp}|{cfg.tp}|{cfg.ep}|{cfg.mtp}|{cfg.block_size}"
    parts.append(hashlib.sha256(key.encode()).hexdigest()[:8])
    return "-".join(parts)


class Handlers:
    """Route handlers over one SimState; ``rank``: the DP rank whose own API server they are (rank serving),
    None for the instance's server."""

    def __init__(self, st: SimState, rank: int | None = None) -> None:
        self.st = st
        self.rank = rank

    def ready(self) -> bool:
        return asyncio.get_running_loop().time() >= self.st.ready_at

    # ---- OpenAI ----------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        st = self.st
        ids = RequestIds(request.headers.get("X-Request-Id"))
        st.request_ids.append(ids)
        if not self.ready():
            return _error("engine is starting", 503, "ServiceUnavailableError")
        await st.faults.before_request()
        if st.faults.should_fail():
            st.metrics.failures += 1
            return _error("injected fault", 500, "InternalServerError")
        shape = st.cfg.model_shape()
        try:
            body = api.decode_body(await request.read(), request.headers.get("Content-Type", ""),
                                   "chat" if chat else "completions")
            req = api.parse(body, chat, st.cfg.model, shape.max_model_len, shape.vocab_size, ids.header,
                            spec_decode=st.cfg.mtp)
        except api.ApiError as exc:
            return _api_error(exc)
        loop = asyncio.get_running_loop()
        arrival = loop.time()
        # vLLM 0.23.0 accepts a request id that is already live: the engine-side id gets a random suffix
        # (vllm/v1/engine/input_processor.py assign_request_id), so there is no duplicate check here.
        seq_ids = api.engine_request_ids(req)
        ids.response_id, ids.internal_id, ids.internal_ids = req.response_id, seq_ids[0], tuple(seq_ids)
        if req.engine_error is not None:  # raised when vLLM's generate() is first iterated
            if req.stream:
                return await self._stream_error(request, req.engine_error)
            return _api_error(req.engine_error)
        try:
            for plan in req.choices:
                st.engine.check_fits(req.prompts[plan.prompt].tokens, plan.tokens)
        except EngineFull as exc:
            return _error(str(exc), 400)
        kvp = req.kv_transfer_params or {}
        headers: dict[str, str] = {}
        prefilled = False
        if kvp.get("do_remote_prefill"):
            rrid = kvp.get("remote_request_id")
            ids.remote_request_id = None if rrid is None else str(rrid)
            st.engine.deferred += 1  # waiting for remote KV (counted as waiting, reason "deferred")
            if self.rank is not None:
                st.engine.deferred_pinned[self.rank] += 1
            try:
                res = await self._pull(kvp)
            except KVPullError as exc:
                st.metrics.failures += 1
                st.kv_load_failures += 1
                log.warning("%s: failing request %s due to KV load failure: %s", st.cfg.instance, seq_ids[0], exc)
                return await self._kv_load_failed(request, req)
            finally:
                st.engine.deferred -= 1
                if self.rank is not None:
                    st.engine.deferred_pinned[self.rank] -= 1
            prefilled = True
            headers = {"x-kv-modelled-bytes": str(res.modelled_bytes), "x-kv-wire-bytes": str(res.wire_bytes),
                       "x-kv-transfer-ms": f"{res.wall_seconds * 1000:.3f}",
                       "x-kv-modelled-ms": f"{res.modelled_seconds * 1000:.3f}"}
            if res.tokens != req.prompt_tokens:
                headers["x-kv-token-mismatch"] = f"{res.tokens}!={req.prompt_tokens}"
        # one engine sequence per prompt and choice; the transferred KV is the first prompt's (vLLM answers a
        # prefill with the first prompt's kv_transfer_params), so the other prompts prefill here
        event = asyncio.Event()
        groups = [RequestGroup(req.n) for _ in req.prompts] if req.n > 1 else None
        hashes = (prefix_cache.request_block_hashes(body, chat, [p.tokens for p in req.prompts], st.cfg.block_size)
                  if st.cfg.enable_prefix_caching else [None] * len(req.prompts))
        seqs = [st.engine.submit(req.prompts[plan.prompt].tokens, plan.tokens,
                                 prefilled=prefilled and plan.prompt == 0, stream=req.stream, req_id=sid,
                                 arrival=arrival, end_reason=plan.finish_reason, event=event,
                                 group=groups[plan.prompt] if groups else None,
                                 max_tokens_param=req.max_tokens_param[plan.prompt],
                                 block_hashes=hashes[plan.prompt], dp_rank=self.rank)
                for plan, sid in zip(req.choices, seq_ids)]
        answer = output.Answer(req, st.fingerprint)
        if req.stream:
            return await self._stream(request, seqs, event, answer, req, headers)
        try:
            while not all(q.finished for q in seqs):
                event.clear()
                if all(q.finished for q in seqs):
                    break
                await event.wait()
        except asyncio.CancelledError:
            for q in seqs:
                st.engine.abort(q)
            raise
        kv_params = None
        if kvp.get("do_remote_decode"):
            entry = st.kv.hold(req.prompt_tokens)
            # remote_request_id: the prefill's engine-side id, as vllm-ascend's Mooncake connector announces it
            # (MooncakeConnectorScheduler.request_finished, kv_p2p/mooncake_connector.py, v0.23.0)
            kv_params = {
                "do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": st.kv.engine_id,
                "remote_request_id": seqs[0].req_id,
                "remote_block_ids": entry.block_ids, "remote_host": st.cfg.kv_host, "remote_port": st.kv_port,
                "tp_size": st.cfg.tp,
            }
        return _json(answer.full([q.generated for q in seqs], kv_params), headers=headers)

    async def _pull(self, kvp: dict[str, Any]):  # type: ignore[no-untyped-def]
        st = self.st
        try:
            host = str(kvp["remote_host"])
            port = int(kvp["remote_port"])
            ids = [int(b) for b in kvp["remote_block_ids"]]
            engine_id = str(kvp["remote_engine_id"])
        except (KeyError, TypeError, ValueError) as exc:
            raise KVPullError(f"kv_transfer_params lack remote_host/remote_port/remote_block_ids/"
                              f"remote_engine_id: {exc!r}") from exc
        res = await pull(host, port, engine_id, ids, KV_PULL_TIMEOUT_S)
        st.kv.stats.received_modelled += res.modelled_bytes
        st.kv.stats.received_wire += res.wire_bytes
        st.kv.stats.transfers_in += 1
        log.info("%s pulled %d modelled KV bytes (%d on the wire) for %d tokens from %s:%d in %.1f ms",
                 st.cfg.instance, res.modelled_bytes, res.wire_bytes, res.tokens, host, port, res.wall_seconds * 1e3)
        return res

    @staticmethod
    def _sse_response(headers: dict[str, str] | None = None) -> web.StreamResponse:
        return web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", **(headers or {})})

    async def _stream_error(self, request: web.Request, exc: api.ApiError) -> web.StreamResponse:
        """A stream whose request the engine refused: 200, one error event, ``[DONE]`` (vLLM's stream
        generators catch the exception and send ``create_streaming_error_response``)."""
        out = self._sse_response()
        await out.prepare(request)
        await out.write(_error_event(exc.body()) + b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def _kv_load_failed(self, request: web.Request, req: api.ParsedRequest) -> web.StreamResponse:
        """The answer to a decode request whose KV pull failed, as vLLM 0.23.0 gives it.

        The scheduler fails the request (``kv_load_failure_policy`` "fail", the default,
        vllm/config/kv_transfer.py; vllm/v1/core/sched/scheduler.py ``_handle_invalid_blocks``): an output
        with no token and ``finish_reason`` "error". Not streaming: 500 ``InternalServerError``
        "Internal server error" (``GenerationError``, vllm/entrypoints/openai/engine/protocol.py). Streaming:
        200, and the stream generators skip an output with no text and no token before they check its finish
        reason, so the stream holds only what precedes it: the chat role chunks (and echo), the usage chunk
        with ``include_usage``, ``[DONE]``; completions with ``echo`` do reach the check and send the 500 error
        event (completion/serving.py, chat_completion/serving.py, v0.23.0).
        """
        if not req.stream:
            return _error("Internal server error", 500, "InternalServerError")
        answer = output.Answer(req, self.st.fingerprint)
        buf = [output.sse(c) for c in answer.first_chunks()]
        if not req.chat and req.echo:
            buf.append(_error_event(api.error_body("Internal server error", 500, "InternalServerError")))
        elif req.include_usage:
            buf.append(output.sse(answer.usage_chunk([0] * len(req.choices))))
        out = self._sse_response()
        await out.prepare(request)
        await out.write(b"".join(buf) + b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def _stream(self, request: web.Request, seqs: list[Sequence], event: asyncio.Event, answer: output.Answer,
                      req: api.ParsedRequest, headers: dict[str, str]) -> web.StreamResponse:
        out = self._sse_response(headers)
        sent = [0] * len(seqs)
        done = [False] * len(seqs)
        try:
            await out.prepare(request)
            while True:
                event.clear()
                if not any(q.generated > sent[i] or (q.finished and not done[i]) for i, q in enumerate(seqs)):
                    await event.wait()
                    continue
                buf = []
                if not answer.started:
                    buf.extend(output.sse(c) for c in answer.first_chunks())
                for i, q in enumerate(seqs):
                    upto, fin = q.generated, q.finished
                    if upto > sent[i] or (fin and not done[i]):
                        chunk = answer.step_chunk(i, upto, fin)
                        sent[i], done[i] = upto, fin
                        if chunk is not None:
                            buf.append(output.sse(chunk))
                if buf:
                    await out.write(b"".join(buf))
                if all(done):
                    break
            if req.include_usage:
                await out.write(output.sse(answer.usage_chunk([q.generated for q in seqs])))
            await out.write(b"data: [DONE]\n\n")
            await out.write_eof()
        except ConnectionResetError:  # the client went away (vLLM aborts the request on disconnect)
            for q in seqs:
                self.st.engine.abort(q)
            log.info("%s: stream client disconnected, %d sequence(s) aborted", self.st.cfg.instance, len(seqs))
        except asyncio.CancelledError:
            for q in seqs:
                self.st.engine.abort(q)
            raise
        return out

    async def models(self, request: web.Request) -> web.Response:
        m, now = self.st.cfg.model, int(time.time())
        # ModelList / ModelCard / ModelPermission (vllm/entrypoints/openai/engine/protocol.py)
        permission = {"id": f"modelperm-{api.random_uuid()}", "object": "model_permission", "created": now,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        return _json({"object": "list", "data": [{
            "id": m, "object": "model", "created": now, "owned_by": "vllm", "root": m, "parent": None,
            "max_model_len": self.st.cfg.model_shape().max_model_len, "permission": [permission]}]})

    async def health(self, request: web.Request) -> web.Response:
        if not self.ready():
            return _error("engine is starting", 503, "ServiceUnavailableError")
        await self.st.faults.wait_not_hung()
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.st.metrics.exposition(self.rank),
                            headers={"Content-Type": METRICS_CONTENT_TYPE})

    # ---- admin -----------------------------------------------------------------
    async def expert_load(self, request: web.Request) -> web.Response:
        try:
            since = int(request.query.get("since", "0"))
            seq, experts, ranks = self.st.engine.load_since(since)
        except (ValueError, KeyError):
            return _error(f"unknown since={request.query.get('since')!r}: use 0 or a seq this endpoint returned", 400)
        e = self.st.engine
        return _json({"seq": seq, "layers": e.layers, "experts": e.experts, "ranks": e.ranks,
                      "expert_load": experts.tolist(), "rank_load": ranks.tolist()})

    async def get_expert_map(self, request: web.Request) -> web.Response:
        return _json(self.st.engine.expert_map.to_vllm_json())

    async def post_expert_map(self, request: web.Request) -> web.Response:
        e, cfg = self.st.engine, self.st.cfg
        try:
            doc = await request.json()
            m = ExpertMap.from_vllm_json(doc, e.layers, e.experts, e.ranks, cfg.slots_per_rank)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error("expert map is not JSON", 400)
        except ExpertMapError as exc:
            return _error(f"invalid expert map: {exc}", 400)
        b = e.apply_map(m)
        log.info("%s applied an expert map (expected balancedness %.3f)", cfg.instance, b)
        return _json({"applied": True, "balancedness": b})

    async def faults(self, request: web.Request) -> web.Response:
        st = self.st
        if request.method == "GET":
            return _json(st.faults.as_dict())
        try:
            exit_now = st.faults.update(await request.json())
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError, TypeError) as exc:
            return _error(f"invalid faults: {exc}", 400)
        if exit_now:
            loop = asyncio.get_running_loop()
            if st.cfg.exit_on_fault:
                log.warning("%s exiting on request (fault injection)", st.cfg.instance)
                loop.call_later(0.1, os._exit, 3)
            else:
                loop.call_later(0.05, st.stop_requested.set)
        return _json({**st.faults.as_dict(), "exit": exit_now})

    async def stats(self, request: web.Request) -> web.Response:
        st = self.st
        e, k = st.engine, st.kv.stats
        busy = max(e.busy_steps, 1)
        npus = int(st.cfg.npus or 1)
        return _json({
            "instance": st.cfg.instance, "role": st.cfg.role, "hardware": st.cfg.hardware,
            "engine_id": st.kv.engine_id, "speedup": st.cfg.speedup,
            "shape": {"npus": st.cfg.npus, "dp": st.cfg.dp, "tp": st.cfg.tp, "ep": st.cfg.ep, "nodes": st.cfg.nodes,
                      "max_num_seqs": st.cfg.max_num_seqs, "max_num_batched_tokens": st.cfg.max_num_batched_tokens,
                      "redundant_experts": st.cfg.redundant_experts, "mtp": st.cfg.mtp},
            "steps": e.busy_steps, "mean_step_ms": e.modelled_time / busy * 1000.0,
            "modelled_seconds": e.modelled_time,
            "mean_step_wall_ms": e.modelled_time / busy * 1000.0 / st.cfg.speedup,
            "balancedness": e.recent_balancedness(),
            "expected_balancedness": balancedness(e.expert_map.expected_rank_loads(e.router.probabilities())),
            "running": e.num_running, "waiting": len(e.waiting), "kv_cache_usage": e.kv_usage,
            "kv_capacity_tokens_per_dp_rank": e.kv_capacity,
            "prompt_tokens": e.tokens_prefilled, "generation_tokens": e.tokens_generated,
            "generation_tokens_per_s_per_npu": e.tokens_generated / e.modelled_time / npus if e.modelled_time else 0.0,
            "prompt_tokens_per_s_per_npu": e.tokens_prefilled / e.modelled_time / npus if e.modelled_time else 0.0,
            "kv_bytes_moved": k.sent_modelled + k.received_modelled,
            "kv_bytes_sent": k.sent_modelled, "kv_bytes_received": k.received_modelled,
            "kv_wire_bytes": k.sent_wire + k.received_wire, "kv_wire_scale": st.cfg.kv_wire_scale,
            "kv_transfers_out": k.transfers_out, "kv_transfers_in": k.transfers_in,
            "kv_blocks_expired": k.expired_blocks, "kv_load_failures": st.kv_load_failures,
            "kv_retained_tokens": st.kv.retained_tokens,
            "faults": st.faults.as_dict(),
            "decode_steps_by_batch": {
                str(t): {"steps": int(n), "mean_step_ms": total / n * 1000.0, "mean_moe_ms": moe / n * 1000.0}
                for t, (n, total, moe) in sorted(e.decode_by_batch.items())
            },
        })


#: Paths under this prefix are the admin API (token-guarded).
ADMIN_PREFIX = "/admin"


def _is_admin(request: web.Request) -> bool:
    route = request.match_info.route.resource
    canonical = route.canonical if route is not None else ""
    return any(p == ADMIN_PREFIX or p.startswith(ADMIN_PREFIX + "/") for p in (request.path, canonical))


def admin_guard(token: str | None) -> Any:
    """Middleware: ``/admin`` paths only with ``Authorization: Bearer <token>``; none at all without a token.

    The same rule as the proxy's admin API (ascend_runtime.proxy.admin): 401 for a missing or
    wrong token, 403 when the simulator was started without one.
    """

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if not _is_admin(request):
            return await handler(request)
        if not token:
            return _error("admin API disabled: start the simulator with --admin-token-env VAR", 403, "ForbiddenError")
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            resp = _error("missing or invalid bearer token", 401, "UnauthorizedError")
            resp.headers["WWW-Authenticate"] = "Bearer"
            return resp
        return await handler(request)

    return guard


@web.middleware
async def json_not_found(request: web.Request, handler: Any) -> web.StreamResponse:
    """No route: FastAPI's answers (``{"detail": "Not Found"}`` 404, ``{"detail": "Method Not Allowed"}`` 405),
    which is what vLLM's API server gives, instead of aiohttp's plain text."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as exc:
        return _json({"detail": "Method Not Allowed"}, 405, headers={"Allow": ", ".join(sorted(exc.allowed_methods))})
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, 404)


def build_app(st: SimState, rank: int | None = None) -> web.Application:
    """The aiohttp application over ``st`` (``rank``: DP rank ``rank``'s own server, rank serving); the admin
    routes are behind :func:`admin_guard`."""
    h = Handlers(st, rank)
    app = web.Application(client_max_size=64 * 1024 * 1024,
                          middlewares=[json_not_found, admin_guard(st.cfg.admin_token)])

    async def tag(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-instance"] = st.cfg.instance
        if rank is not None:
            response.headers["x-dp-rank"] = str(rank)

    app.on_response_prepare.append(tag)
    app.add_routes([
        web.post("/v1/completions", h.completions),
        web.post("/v1/chat/completions", h.chat),
        web.get("/v1/models", h.models),
        web.get("/health", h.health),
        web.get("/metrics", h.metrics),
        web.get("/admin/expert_load", h.expert_load),
        web.get("/admin/expert_map", h.get_expert_map),
        web.post("/admin/expert_map", h.post_expert_map),
        web.get("/admin/faults", h.faults),
        web.post("/admin/faults", h.faults),
        web.get("/admin/stats", h.stats),
        *UtilityRoutes(st.cfg.model, st.cfg.model_shape().max_model_len, h.health).routes(),
    ])
    return app


class SimHandle:
    """A running simulator: ``url``, ``port``, ``kv_port``, ``engine_id``; ``await stop()``.

    Rank serving: ``rank_urls`` holds each DP rank's server URL in rank order (``url`` is rank 0's);
    empty otherwise."""

    def __init__(self, st: SimState, runners: list[web.AppRunner], kv_server: asyncio.AbstractServer,
                 urls: list[str], ranked: bool) -> None:
        self.state, self._runners, self._kv_server = st, runners, kv_server
        self.url = urls[0]
        self.port, self.kv_port = int(urls[0].rsplit(":", 1)[1]), st.kv_port
        self.rank_urls = list(urls) if ranked else []
        self.config = st.cfg
        self.engine_id = st.kv.engine_id
        self._stopped = False

    async def stop(self) -> None:
        """Stop serving and the engine (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        await self.state.engine.stop()
        self._kv_server.close()
        for runner in self._runners:
            await runner.cleanup()

    async def wait_stopped(self) -> None:
        """Wait until an exit fault (in-process mode) asks to stop, then stop."""
        await self.state.stop_requested.wait()
        await self.stop()


async def start_simulator(config: SimConfig) -> SimHandle:
    """Start a simulator on the running loop. Raises ValueError for an invalid shape or expert map."""
    cfg = config.resolved()
    shape = cfg.model_shape()
    emap = load_expert_map_file(cfg.expert_map, cfg) if cfg.expert_map else None
    loop = asyncio.get_running_loop()
    faults = Faults(cfg.seed)
    kv = KVStore(
        engine_id=f"{cfg.instance}-{secrets.token_hex(4)}", bytes_per_token=shape.kv_bytes_per_token(with_mtp=cfg.mtp),
        block_size=cfg.block_size, timeout_s=cfg.kv_timeout_s, link_bytes_per_s=float(cfg.link_gbps or 400) * 1e9 / 8,
        speedup=cfg.speedup, wire_scale=cfg.kv_wire_scale,
    )
    holder: dict[str, Engine] = {}

    def gauges() -> dict[str, Any]:
        e = holder["engine"]
        return {"running": e.running_by_rank(), "waiting_capacity": e.waiting_by_rank(),
                "waiting_deferred": e.deferred_by_rank(), "kv_usage": e.kv_usage_by_rank(),
                "ascend_sim:balancedness": e.recent_balancedness(),
                "ascend_sim:speedup": cfg.speedup,
                "ascend_sim:mean_step_modelled_seconds": e.modelled_time / max(e.busy_steps, 1),
                "kv_bytes_moved": kv.stats.sent_modelled + kv.stats.received_modelled,
                "kv_wire_bytes": kv.stats.sent_wire + kv.stats.received_wire}

    metrics = SimMetrics(cfg.model, cfg.instance, gauges)
    engine = Engine(cfg, faults, metrics, emap, retained_tokens=lambda: kv.retained_tokens)
    holder["engine"] = engine
    # vllm:cache_config_info labels: every field of CacheConfig.metrics_info() (vllm/config/cache.py), the ones
    # the simulator models with its values, the others with vLLM's defaults for an attention model
    metrics.cache_info = {
        "_block_size_resolved": "True", "block_size": str(cfg.block_size), "cache_dtype": "auto",
        "calculate_kv_scales": "False", "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "gpu_memory_utilization": str(cfg.gpu_memory_utilization), "hash_block_size": "None",
        "is_attention_free": "False", "kv_cache_dtype_skip_layers": "[]", "kv_cache_memory_bytes": "None",
        "kv_offloading_backend": "native", "kv_offloading_size": "None", "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None", "mamba_cache_dtype": "auto", "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None", "mamba_ssm_cache_dtype": "auto", "num_cpu_blocks": "None",
        "num_gpu_blocks": str(engine.kv_capacity // cfg.block_size), "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256", "sliding_window": "None", "user_specified_block_size": "False",
        "user_specified_mamba_block_size": "False"}
    st = SimState(cfg, engine, kv, faults, metrics, ready_at=loop.time() + cfg.startup_delay,
                  fingerprint=system_fingerprint(cfg))
    kv_server = await asyncio.start_server(kv.handle, cfg.host, cfg.kv_port)
    st.kv_port = kv_server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    # keepalive_timeout: uvicorn's timeout_keep_alive in vLLM 0.23.0 (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s, vllm/envs.py;
    # vllm/entrypoints/openai/api_server.py): an idle kept-alive connection is closed after 5 s
    # rank serving: one server per DP rank on its own address (vLLM's external load-balancer mode)
    listeners: list[tuple[str, int, int | None]] = (
        [(host, port, r) for r, (host, port) in enumerate(cfg.rank_addresses)] if cfg.rank_endpoints
        else [(cfg.host, cfg.port, None)])
    runners: list[web.AppRunner] = []
    urls: list[str] = []
    try:
        for host, port, rank in listeners:
            runner = web.AppRunner(build_app(st, rank), access_log=None, handle_signals=False,
                                   keepalive_timeout=KEEP_ALIVE_S)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, host, port, backlog=2048).start()
            urls.append(f"http://{host}:{runner.addresses[0][1]}")
    except BaseException:
        kv_server.close()
        for runner in runners:
            await runner.cleanup()
        raise
    engine.start()
    log.info("sim %s (%s, %s, %d NPUs DP%d TP%d EP%d, speedup %g) on %s, KV %s:%d, engine %s",
             cfg.instance, cfg.role, cfg.hardware, cfg.npus, cfg.dp, cfg.tp, cfg.ep, cfg.speedup,
             urls[0] if len(urls) == 1 else f"{len(urls)} DP rank servers {urls[0]} .. {urls[-1]}",
             cfg.kv_host, st.kv_port, kv.engine_id)
    return SimHandle(st, runners, kv_server, urls, bool(cfg.rank_endpoints))


def run_simulator(config: SimConfig) -> None:
    """Run a simulator in a new event loop until SIGINT/SIGTERM (or an exit fault)."""

    async def main() -> None:
        handle = await start_simulator(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, handle.state.stop_requested.set)
        print(f"sim {handle.config.instance} ready on {handle.url} kv_port={handle.kv_port} "
              f"engine_id={handle.engine_id} speedup={handle.config.speedup}", flush=True)
        await handle.wait_stopped()

    eventloop.run(main())
