"""One client request through the PD flow: prefill, decode, relay.

The decode body is relayed byte for byte (only regrouped on SSE event
boundaries so a ``recomputed`` event can be held back). Streams, and all
prefill requests, go over the transport-level HTTP/1.1 client of relay.py
(kept-alive connections, no per-event coroutine or JSON parse); non-streaming
decode answers over aiohttp's client. Failure policy:

- prefill fails (connect error, 5xx, timeout, an answer without the KV
  handover decode needs, answers.py): retried on another prefill instance, up
  to ``max_attempts`` instances; when every one tried failed, 502;
- decode fails before the client got any byte: a new prefill + decode pair is
  tried (never the failed decode), up to ``max_attempts`` decodes; a stream that
  ends with no output (chat role chunks, usage, ``[DONE]``) is such a failure: it
  is vLLM 0.23.0's answer to a decode that failed before its first token, e.g. a
  failed KV load (pd.stream_output_state), so a stream's first events are held
  until one carries output;
- decode fails (a broken connection, a stall) after bytes were relayed: the
  stream continues on another decode instance the way an evacuated stream does
  (below), since the client has only whole events; a stream that cannot be
  continued (migrate.py: ``n`` > 1, ``echo``, a prompt that is not one string),
  or with no other decode routable, gets one SSE error event and ``[DONE]``; one
  whose end (finish reason, usage) was relayed gets the ``[DONE]`` it was owed;
- the client disconnects: the handler is cancelled, which closes the upstream
  connections (the engine aborts the request);
- a 4xx answer from an instance is relayed to the client unchanged (during a
  recomputed continuation, whose stream has started, as its final SSE event);
- the decode instance is evacuated (drain with ``migrate``, admin.py): the
  stream stops at an event boundary, its upstream connection is closed and the
  answer continues on another decode instance through a fresh prefill
  (migrate.py); a continuation that fails before its first byte is tried on
  another decode, like a first attempt.

The proxy's own errors are in vLLM 0.23.0's ``{"error": {...}}`` shape
(errors.py): invalid JSON 400 "Bad Request", no instance 503 "Service
Unavailable", decode failures 502 "Bad Gateway".

Request ids: each request sent to an engine (every prefill try, every decode
try, every recomputed continuation) gets a fresh ``X-Request-Id``; the client's
``X-Request-Id`` (or one minted for it) goes to the engines as
``X-Client-Request-Id``, is logged with every attempt id, and is returned to
the client as ``X-Request-Id`` on every answer. See pd.py for why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from aiohttp.http import HttpVersion11

from ascend_runtime.proxy.answers import BadAnswer, prefill_answer, usable_event
from ascend_runtime.proxy.boundedjson import JsonError, load_json
from ascend_runtime.proxy.batch import BatchServer, batch_prompts
from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.errors import (
    error_response,
    relayed_error_event,
    sse_error_event,
)
from ascend_runtime.proxy.metrics import ITL_BUCKETS, ProxyMetrics
from ascend_runtime.proxy.migrate import (
    continuation_rewrite,
    MigrationTracker,
    StreamHandle,
    account,
    continuation_request,
    drop_role_events,
    relayed_events,
)
from ascend_runtime.proxy.pd import (
    CLIENT_REQUEST_ID_HEADER,
    client_view_of_prefill_refusal,
    RECOMPUTED,
    NotContinuable,
    REQUEST_ID_HEADER,
    build_prefill_request,
    decode_body,
    estimate_prompt_tokens,
    new_request_id,
    sse_events,
    stream_output_state,
)
from ascend_runtime.proxy.pool import InstancePool, InstanceState, NoInstanceError
from ascend_runtime.proxy.prompt_logprobs import needs_prompt_logprobs, serve_on_prefill
from ascend_runtime.proxy.relay import (
    ConnectionPool,
    DecodeConnection,
    Head,
    RelayError,
    StreamStats,
    serialize_request,
)
from ascend_runtime.proxy.validate import output_limit_refusal, parse_request, wire_header

log = logging.getLogger(__name__)

HARD_ERRORS = (aiohttp.ClientConnectorError,)
MID_STREAM_ERRORS = (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionResetError,
                     aiohttp.ClientOSError)


class UpstreamFailure(Exception):
    """An instance failed a request. ``hard``: it looks unreachable."""

    def __init__(self, state: InstanceState, reason: str, hard: bool = False):
        super().__init__(f"{state.name}: {reason}")
        self.state, self.reason, self.hard = state, reason, hard


class PrefillsFailed(Exception):
    """Every prefill instance tried for a request failed and none is left to try: ``str()`` names them and
    the last failure (answered 502; 503 is for a request no prefill instance could be tried for)."""


@dataclass
class ClientAnswer(Exception):
    """An instance's 4xx answer, to be relayed to the client as is."""

    status: int
    body: bytes
    content_type: str


def _failure_from(state: InstanceState, exc: BaseException, what: str) -> UpstreamFailure:
    if isinstance(exc, HARD_ERRORS):
        return UpstreamFailure(state, f"{what}: unreachable ({exc.__class__.__name__})", hard=True)
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamFailure(state, f"{what}: timed out")
    return UpstreamFailure(state, f"{what}: {exc.__class__.__name__}: {exc}")


def _json_response(status: int, message: str, err_type: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return error_response(status, message, err_type, headers)


class Forwarder:
    """Runs the PD flow for ``/v1/completions`` and ``/v1/chat/completions``."""

    def __init__(self, config: ProxyConfig, pool: InstancePool, metrics: ProxyMetrics,
                 session: aiohttp.ClientSession):
        self.cfg = config
        self.pool = pool
        self.metrics = metrics
        self.session = session
        self.decode_timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout_s, sock_read=config.stream_idle_timeout_s)
        #: keep-alive connections of the prefill requests and streamed decodes (relay.py); closed on stop
        self.relay_pool = ConnectionPool(config.connect_timeout_s, idle_ttl_s=config.engine_keepalive_s)
        self._targets: dict[str, tuple[str, int, str, bool]] = {}
        #: the proxy's own base URL once it listens (server.py): where a batch's prompts are sent (batch.py)
        self.self_url: str | None = None

    # ---------------------------------------------------------------- entry point
    async def handle(self, request: web.Request, path: str) -> web.StreamResponse:
        """Serve one completion request arriving at ``path`` (``/v1/completions`` ...).

        Every outcome is counted in ``requests_total{endpoint,outcome,status}``
        (status of the answer; 200 for a stream that ended with an error event,
        499 when the client went away).
        """
        t0 = time.perf_counter()
        outcome, status = "upstream_error", 502
        client_id = request.headers.get(REQUEST_ID_HEADER) or new_request_id()
        try:
            body, resp = await self._read_body(request)
            if resp is None:
                resp, outcome = self._parse(body, path, request.headers)
            if resp is not None:
                outcome = "client_error"
                resp.headers[REQUEST_ID_HEADER] = client_id
                status = resp.status
                return resp
            req, fields = outcome  # type: ignore[misc]
            refusal = output_limit_refusal(fields, path.endswith("/chat/completions"), self.pool.max_model_len("decode"))
            if refusal is not None:  # before any prefill work
                e = refusal["error"]
                resp = error_response(e["code"], e["message"], e["type"], param=e["param"])
                resp.headers[REQUEST_ID_HEADER] = client_id
                outcome, status = "client_error", resp.status
                return resp
            prompts = None if path.endswith("/chat/completions") else batch_prompts(req)
            try:
                if prompts is not None:  # one PD request per prompt, joined into one answer (batch.py)
                    resp, outcome = await self._batch(request, req, prompts, fields, client_id)
                elif needs_prompt_logprobs(req, path.endswith("/chat/completions")):  # decode cannot give them
                    resp, outcome = await serve_on_prefill(
                        request, path, body, self._headers(request, new_request_id(), client_id), self.pool,
                        self.session, self.cfg.max_attempts, client_id)
                else:
                    resp, outcome = await self._run(request, path, req, body, fields, t0, client_id)
            except Exception:  # a proxy bug: still one answer in the engine's shape, and counted
                log.exception("request %s: proxy error", client_id)
                resp, outcome = _json_response(500, "internal proxy error"), "proxy_error"
            if not resp.prepared:  # a streamed answer got the header when it was prepared
                resp.headers[REQUEST_ID_HEADER] = client_id
            status = resp.status
            return resp
        except asyncio.CancelledError:
            outcome, status = "client_disconnect", 499
            raise
        finally:
            self.metrics.requested(path, outcome, str(status))
            self.metrics.e2e.observe(time.perf_counter() - t0)

    async def _batch(self, request: web.Request, req: dict[str, Any], prompts: list[Any], fields: Any,
                     client_id: str) -> tuple[web.StreamResponse, str]:
        if self.self_url is None:
            return _json_response(503, "the proxy does not know its own address to split a batch of prompts"), \
                "no_instance"
        return await BatchServer(self.session, self.self_url).serve(
            request, req, prompts, int(req.get("n") or 1), bool(fields.stream), client_id)

    async def _read_body(self, request: web.Request) -> tuple[bytes, web.Response | None]:
        """The request body within the limits: (body, None) or (b"", error answer).

        A Content-Length above the limit is refused before any byte of the body
        is read; a chunked body is cut off once it passes the limit. Each read
        must make progress within ``body_timeout_s`` and the whole body arrive
        within ``body_total_timeout_s`` (408). Refused bodies close the
        connection (the rest is never read).
        """
        lim = self.cfg.limits
        length = request.content_length
        if length is not None and length > lim.max_body_bytes:
            return b"", self._close(_json_response(
                413, f"request body of {length} bytes is larger than the limit of {lim.max_body_bytes} bytes"))
        content = request.content
        if content.is_eof():  # the whole body came with the head (the usual case): no wait, no timer
            try:
                body = content.read_nowait()
            except (aiohttp.ClientPayloadError, web.RequestPayloadError) as exc:  # the server side raises the latter
                return b"", self._close(_json_response(400, f"invalid request body: {exc}"))
            if len(body) > lim.max_body_bytes:
                return b"", self._close(_json_response(
                    413, f"request body is larger than the limit of {lim.max_body_bytes} bytes"))
            if content.at_eof():
                return body, None
            parts, size = [body], len(body)  # more than one read_nowait serves: read on below
        else:
            parts, size = [], 0
        if request.version == aiohttp.HttpVersion11 and request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # the client waits for it to send
            request.writer.output_size = 0  # as aiohttp's own expect handler (not part of the answer)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + lim.body_total_timeout_s
        while True:
            wait = min(lim.body_timeout_s, deadline - loop.time())
            try:
                if wait <= 0:
                    raise asyncio.TimeoutError
                async with asyncio.timeout(wait):  # no task per read, unlike wait_for
                    chunk = await request.content.readany()
            except asyncio.TimeoutError:
                return b"", self._close(_json_response(
                    408, f"request body not received in time (read timeout {lim.body_timeout_s:g}s, "
                         f"total {lim.body_total_timeout_s:g}s)"))
            except (aiohttp.ClientPayloadError, web.RequestPayloadError) as exc:  # e.g. malformed chunked encoding
                return b"", self._close(_json_response(400, f"invalid request body: {exc}"))
            if not chunk:
                return b"".join(parts), None
            size += len(chunk)
            if size > lim.max_body_bytes:
                return b"", self._close(_json_response(
                    413, f"request body is larger than the limit of {lim.max_body_bytes} bytes"))
            parts.append(chunk)

    @staticmethod
    def _close(resp: web.Response) -> web.Response:
        resp.force_close()
        return resp

    @staticmethod
    def _parse(body: bytes, path: str, headers: Any) -> tuple[web.Response | None, Any]:
        """(None, (request, checked fields)) or (400 answer, None): input hygiene, validate.py."""
        req, fields, err = parse_request(body, path.endswith("/chat/completions"), headers.get("Content-Type"),
                                         headers.get("Content-Encoding"))
        if err is not None:
            e = err["error"]
            return error_response(e["code"], e["message"], e["type"], param=e["param"]), None
        return None, (req, fields)

    @staticmethod
    def _headers(request: web.Request, attempt_id: str, client_id: str) -> dict[str, str]:
        """Headers of one engine request: its own fresh ``X-Request-Id``, the client's id apart."""
        h = {"Content-Type": "application/json", REQUEST_ID_HEADER: attempt_id,
             CLIENT_REQUEST_ID_HEADER: wire_header(client_id), "Accept-Encoding": "identity"}
        auth = request.headers.get("Authorization")
        if auth:
            h["Authorization"] = wire_header(auth)
        return h

    async def _run(self, request: web.Request, path: str, req: dict[str, Any], raw: bytes, fields: Any,
                   t0: float, client_id: str) -> tuple[web.StreamResponse, str]:
        """The PD flow of one parsed request (``req``, parsed from the body bytes ``raw``): prefill, decode,
        retries, continuations. Returns (answer, outcome label of ``requests_total``)."""
        stream = bool(fields.stream)
        tracker = MigrationTracker.for_request(req, max_tokens=fields.max_tokens)
        tracker.fields = fields
        failed_decodes: dict[str, str] = {}
        client_resp: web.StreamResponse | None = None
        current = req
        pool = self.pool
        while True:
            try:
                pool.check_available("decode", failed_decodes)  # no prefill work when no decode is left
                p_state, p_tokens, kv_answer = await self._prefill(request, path, current, client_id)
                tracker.note_prompt_tokens(kv_answer)  # the first prefill's: the client's own prompt
            except NoInstanceError as exc:
                if exc.role == "decode":
                    exc = NoInstanceError("decode", {**exc.reasons, **failed_decodes})
                return await self._fail(client_resp, 503, str(exc)), "no_instance"
            except PrefillsFailed as exc:
                return (await self._fail(client_resp, 502, str(exc)),
                        "upstream_error" if client_resp is None else "stream_error")
            except ClientAnswer as ans:
                if client_resp is not None:
                    return await self._relay_error(client_resp, ans.status, ans.body), "stream_error"
                return web.Response(status=ans.status, body=ans.body, content_type=ans.content_type), "client_error"
            try:
                # chosen after the prefill, on the load of that moment, as the reference proxy does
                d_state = pool.pick("decode", failed_decodes)
            except NoInstanceError as exc:
                pool.end(p_state, p_tokens)
                exc = NoInstanceError("decode", {**exc.reasons, **failed_decodes})
                return await self._fail(client_resp, 503, str(exc)), "no_instance"
            self.metrics.decided("decode", d_state.name)
            pool.begin(d_state)
            try:
                result = await self._decode(request, path, self._decode_body(current, req, raw, kv_answer),
                                            client_id, p_state, p_tokens, d_state, stream, tracker, client_resp, t0)
            finally:
                pool.end(d_state)
            kind = result[0]
            if kind == "done":
                return result[1], "success"
            if kind == "client_error":
                return result[1], "client_error"
            if kind == "retry":  # failed before the client saw a byte of this attempt
                failed_decodes[d_state.name] = f"failed for this request ({result[2]})"
                if (client_resp is None or tracker.resume) and len(failed_decodes) < self.cfg.max_attempts:
                    self.metrics.retries.labels("decode", "failed_before_first_byte").inc()
                    continue
                msg = f"decode failed on {', '.join(sorted(failed_decodes))}: {result[2]}"
                if client_resp is not None:
                    return await self._fail(client_resp, 502, msg), "stream_error"
                return _json_response(502, msg), "upstream_error"
            if kind == "stream_error":
                return result[1], "stream_error"
            if kind == "client_gone":
                return result[1], "client_disconnect"
            if kind == "recompute":
                client_resp = result[1]
                self.metrics.recomputes.inc()
                try:
                    current = tracker.continue_request()
                except NotContinuable as exc:
                    return await self._fail(client_resp, 502, str(exc)), "stream_error"
                tracker.resume = False
                continue
            if kind == "migrate":
                client_resp = result[1]
                self.metrics.migrations.inc()
                current = continuation_request(tracker)
                continue
            raise AssertionError(kind)

    @staticmethod
    def _decode_body(current: dict[str, Any], req: dict[str, Any], raw: bytes, kv_answer: dict[str, Any]) -> bytes:
        """The decode body of ``current`` (the client's request ``req``, whose body bytes are ``raw``, or a
        continuation built from it) with the prefill answer's ``kv_transfer_params`` (pd.py)."""
        return decode_body(current, kv_answer, raw if current is req else None)

    async def _fail(self, client_resp: web.StreamResponse | None, status: int, message: str,
                    err_type: str | None = None) -> web.StreamResponse:
        """The proxy's error answer: JSON if nothing was sent yet, else a final SSE error event."""
        if client_resp is None:
            return _json_response(status, message, err_type)
        return await self._end_stream(client_resp, sse_error_event(message, status, err_type))

    async def _relay_error(self, client_resp: web.StreamResponse, status: int, body: bytes) -> web.StreamResponse:
        """An engine's error answer on a stream already under way: its error object as the final event."""
        return await self._end_stream(client_resp, relayed_error_event(status, body))

    @staticmethod
    async def _end_stream(client_resp: web.StreamResponse, event: bytes) -> web.StreamResponse:
        try:
            await client_resp.write(event)
            await client_resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            pass
        return client_resp

    # ---------------------------------------------------------------- prefill
    async def _prefill(self, request: web.Request, path: str, req: dict[str, Any],
                       client_id: str) -> tuple[InstanceState, int, dict[str, Any]]:
        """Run the prefill on the least-loaded prefill instance, retrying elsewhere.

        Every try is a new engine request with a fresh request id. Returns
        (instance, prompt tokens charged to it, prefill JSON answer). The
        caller must ``pool.end(instance, tokens)`` once decode starts or fails.
        """
        payload = json.dumps(build_prefill_request(req)).encode()
        prompt_tokens = estimate_prompt_tokens(req)
        tried: list[str] = []
        last = ""
        while len(tried) < self.cfg.max_attempts:
            try:
                # charged the prompt minus its expected cached tokens (proxy/affinity.py)
                state, tokens = self.pool.pick_prefill(set(tried), req, prompt_tokens)
            except NoInstanceError as exc:
                if tried:
                    raise PrefillsFailed(self._prefills_failed(tried, last, exc.reasons)) from None
                raise
            tried.append(state.name)
            self.metrics.decided("prefill", state.name)
            attempt_id = new_request_id()
            log.debug("request %s: prefill %s on %s", client_id, attempt_id, state.name)
            self.pool.begin(state, tokens)
            ok = False
            conn: DecodeConnection | None = None
            try:
                host, port, prefix, tls = self._target(state.spec.url)
                data = serialize_request("POST", host, port, prefix + path,
                                         self._headers(request, attempt_id, client_id), payload)
                async with asyncio.timeout(self.cfg.prefill_timeout_s):
                    conn, head = await self._open_decode(host, port, tls, data, "prefill")
                    body = await conn.read_body()
                if head.status >= 500:
                    raise UpstreamFailure(state, f"prefill returned {head.status}")
                if head.status != 200:  # the engine's verdict on the client's request, as that request reads
                    raise ClientAnswer(head.status, client_view_of_prefill_refusal(body, req),
                                       head.content_type.split(";", 1)[0].strip())
                answer = prefill_answer(body)  # the KV handover decode needs, or BadAnswer (answers.py)
                ok = True
                self.pool.record_success(state)
                return state, tokens, answer
            except ClientAnswer:
                raise
            except BadAnswer as exc:  # an unusable answer: this instance failed, as with a 5xx
                last, retry_reason = str(exc), exc.kind
                self.pool.record_failure(state, last)
            except UpstreamFailure as exc:
                last, retry_reason = exc.reason, "prefill_failed"
                self.pool.record_failure(state, exc.reason)
            except RelayError as exc:
                last, retry_reason = exc.reason, "prefill_failed"
                self.pool.record_failure(state, exc.reason, exc.hard)
            except (TimeoutError, ValueError) as exc:
                retry_reason = "prefill_failed"
                failure = _failure_from(state, exc, "prefill")
                last = failure.reason
                self.pool.record_failure(state, failure.reason, failure.hard)
            finally:
                if conn is not None:
                    conn.release()  # kept only if its answer ended cleanly
                if not ok:
                    self.pool.end(state, tokens)
            log.warning("request %s: prefill %s on %s failed: %s", client_id, attempt_id, state.name, last)
            self.metrics.retries.labels("prefill", retry_reason).inc()
        raise PrefillsFailed(self._prefills_failed(tried, last, {}))

    @staticmethod
    def _prefills_failed(tried: list[str], last: str, others: dict[str, str]) -> str:
        """The 502 message when every prefill tried failed: the instances tried, the last failure, and why no
        other instance could be tried (``others``: instance -> reason, as :class:`NoInstanceError` has them)."""
        rest = "; ".join(f"{n}: {r}" for n, r in sorted(others.items()) if n not in tried)
        return (f"prefill failed on {', '.join(tried)} (last: {last})"
                + (f"; no other prefill instance to try ({rest})" if rest else ""))

    # ---------------------------------------------------------------- decode
    async def _decode(self, request: web.Request, path: str, decode_body: bytes, client_id: str,
                      p_state: InstanceState, p_tokens: int, d_state: InstanceState, stream: bool,
                      tracker: MigrationTracker, client_resp: web.StreamResponse | None,
                      t0: float) -> tuple[Any, ...]:
        """Send ``decode_body`` to ``d_state`` (a new engine request, fresh request id) and relay the answer.
        The caller counts the request on ``d_state`` (``pool.begin``/``end``).

        Streams go through :meth:`_decode_stream` (relay.py); JSON answers through aiohttp's client here.
        Returns ("done", resp) | ("client_error", resp) | ("retry", None, reason)
        | ("stream_error", resp) | ("recompute", resp) | ("migrate", resp) (streams only).
        """
        if stream:
            return await self._decode_stream(request, path, decode_body, client_id, p_state, p_tokens, d_state,
                                             tracker, client_resp, t0)
        pool = self.pool
        prefill_held = True
        attempt_id = new_request_id()
        log.debug("request %s: decode %s on %s (prefilled on %s)", client_id, attempt_id, d_state.name, p_state.name)
        headers = self._headers(request, attempt_id, client_id)
        upstream: aiohttp.ClientResponse | None = None
        clean = False
        try:
            try:
                async with asyncio.timeout(None):
                    upstream = await self.session.post(d_state.spec.url + path, data=decode_body,
                                                       headers=headers, timeout=self.decode_timeout)
                    if upstream.status != 200:
                        body = await upstream.read()
                        if upstream.status >= 500:
                            raise UpstreamFailure(d_state, f"decode returned {upstream.status}")
                        clean = True
                        if client_resp is None:
                            return ("client_error", web.Response(status=upstream.status, body=body,
                                                                 content_type=upstream.content_type))
                        return ("stream_error", await self._relay_error(client_resp, upstream.status, body))
                    first = await upstream.read()
            except (aiohttp.ClientError, asyncio.TimeoutError, UpstreamFailure) as exc:
                failure = exc if isinstance(exc, UpstreamFailure) else _failure_from(d_state, exc, "decode")
                return self._decode_retry(d_state, client_id, attempt_id, failure.reason, failure.hard)
            if not first:
                return self._decode_retry(d_state, client_id, attempt_id, "decode closed the stream before the first byte")
            pool.end(p_state, p_tokens)
            prefill_held = False
            clean = True
            return self._finish_json(upstream, first, p_state, d_state, tracker, t0, client_id, attempt_id)
        finally:
            if upstream is not None:
                upstream.release() if clean else upstream.close()
            if prefill_held:
                pool.end(p_state, p_tokens)

    # ---------------------------------------------------------------- streamed decode (relay.py)
    def _decode_retry(self, d_state: InstanceState, client_id: str, attempt_id: str, reason: str,
                      hard: bool = False) -> tuple[str, None, str]:
        """Count a decode attempt that failed before any answer byte and ask for another instance."""
        self.pool.record_failure(d_state, reason, hard)
        log.warning("request %s: decode %s on %s failed: %s", client_id, attempt_id, d_state.name, reason)
        return ("retry", None, reason)

    def _target(self, url: str) -> tuple[str, int, str, bool]:
        """(host, port, path prefix, tls) of an instance URL, cached."""
        t = self._targets.get(url)
        if t is None:
            u = urlsplit(url)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise RelayError(f"unsupported instance URL {url!r} (http:// or https://)")
            t = (u.hostname, u.port or (443 if u.scheme == "https" else 80), u.path.rstrip("/"), u.scheme == "https")
            self._targets[url] = t
        return t

    async def _open_decode(self, host: str, port: int, tls: bool, data: bytes,
                           role: str = "decode") -> tuple[DecodeConnection, Head]:
        """Send ``data`` on a kept-alive connection (a fresh one if that fails before any answer byte)."""
        conn = self.relay_pool.take_idle(host, port)
        if conn is not None:
            try:
                return conn, await conn.request(data, role)
            except RelayError as exc:
                conn.close()
                if not exc.before_head:
                    raise
            except BaseException:
                conn.close()
                raise
        conn = await self.relay_pool.connect(host, port, tls, role)
        try:
            return conn, await conn.request(data, role)
        except BaseException:
            conn.close()
            raise

    async def _decode_stream(self, request: web.Request, path: str, decode_body: bytes, client_id: str,
                             p_state: InstanceState, p_tokens: int, d_state: InstanceState,
                             tracker: MigrationTracker, client_resp: web.StreamResponse | None,
                             t0: float) -> tuple[Any, ...]:
        """The streamed decode: same outcomes as :meth:`_decode`, relayed at the transport level (relay.py)."""
        pool = self.pool
        prefill_held = True
        attempt_id = new_request_id()
        log.debug("request %s: decode %s on %s (prefilled on %s)", client_id, attempt_id, d_state.name, p_state.name)
        conn: DecodeConnection | None = None
        clean = False
        try:
            try:
                host, port, prefix, tls = self._target(d_state.spec.url)
                data = serialize_request("POST", host, port, prefix + path,
                                         self._headers(request, attempt_id, client_id),
                                         decode_body)
                async with asyncio.timeout(self.cfg.first_token_timeout_s):
                    conn, head = await self._open_decode(host, port, tls, data)
                    if head.status != 200:
                        body = await conn.read_body()
                        if head.status >= 500:
                            raise RelayError(f"decode returned {head.status}")
                        clean = True
                        if client_resp is None:
                            return ("client_error", web.Response(status=head.status, body=body, headers={
                                "Content-Type": head.headers.get("content-type", "application/json")}))
                        return ("stream_error", await self._relay_error(client_resp, head.status, body))
                    first = await conn.first_payload()
                    # held until an event with output: an empty stream is a failure before the first byte
                    has_output = stream_output_state(first) if first else None
                    while first and has_output is None and not conn.body_done:
                        more = await conn.first_payload()
                        if not more:
                            break
                        first += more
                        has_output = stream_output_state(first)
            except (RelayError, TimeoutError) as exc:
                reason, hard = (exc.reason, exc.hard) if isinstance(exc, RelayError) else ("decode: timed out", False)
                return self._decode_retry(d_state, client_id, attempt_id, reason, hard)
            if not first:
                return self._decode_retry(d_state, client_id, attempt_id, "decode closed the stream before the first byte")
            if not has_output:
                # vLLM 0.23.0 streams no output and no error for a request that failed before its first token
                # (a failed KV load, an abort): pd.stream_output_state
                return self._decode_retry(d_state, client_id, attempt_id,
                                          "decode ended the stream without any output (failed before its first "
                                          "token, e.g. its KV load)")
            pool.end(p_state, p_tokens)
            prefill_held = False
            if tracker.resume and tracker.chat:  # the client already has the role chunk
                first = drop_role_events(first)
            result = await self._relay(request, conn, head, first, p_state, d_state, tracker, client_resp, t0,
                                       client_id, attempt_id)
            clean = result[0] == "done"
            return result
        finally:
            if conn is not None:
                conn.release() if clean else conn.close()
            if prefill_held:
                pool.end(p_state, p_tokens)

    async def _relay(self, request: web.Request, conn: DecodeConnection, head: Head, first: bytes,
                     p_state: InstanceState, d_state: InstanceState, tracker: MigrationTracker,
                     client_resp: web.StreamResponse | None, t0: float, client_id: str,
                     attempt_id: str) -> tuple[Any, ...]:
        """Relay the decode's SSE body to the client until its end, an error or a recompute."""
        m = self.metrics
        if client_resp is None:
            headers = {"Content-Type": head.headers.get("content-type", "text/event-stream"),
                       "x-prefill-instance": p_state.name, "x-decode-instance": d_state.name,
                       REQUEST_ID_HEADER: client_id}
            client_resp = web.StreamResponse(status=200, headers=headers)
            if request.version >= HttpVersion11:
                client_resp.enable_chunked_encoding()
            await client_resp.prepare(request)
            m.ttft.observe(time.perf_counter() - t0)
        transport = request.transport
        if transport is None or transport.is_closing():
            return ("client_gone", client_resp)
        stats = StreamStats(ITL_BUCKETS)
        history: list[bytes] = []
        chunked = bool(client_resp.chunked)
        handle = StreamHandle(conn, tracker, history, chunked)
        self.pool.track(d_state, handle)  # an evacuation of d_state stops this relay (migrate.py)
        try:
            continuing = tracker.migrations > 0 or tracker.retries > 0
            outcome = await conn.relay(first, transport, chunked, history,
                                       lambda blob, hist: self._split_recompute(blob, hist, tracker), stats,
                                       self.cfg.stream_idle_timeout_s,
                                       continuation_rewrite(tracker) if continuing else None)
        except RelayError as exc:
            if handle.finished():  # the answer's end was relayed before the break: only [DONE] is missing
                return await self._end_broken(client_resp, d_state, exc, client_id, attempt_id)
            if handle.continuable(min_left=1) and self.pool.others_routable(d_state):  # the rest from another decode
                return self._resume_broken(client_resp, d_state, exc, tracker, relayed_events(history, chunked),
                                           client_id, attempt_id)
            return await self._stream_broke(client_resp, d_state, exc, client_id, attempt_id)
        finally:
            self.pool.untrack(d_state, handle)
            m.chunks.inc(stats.chunks)
            m.events.inc(stats.events)
            m.itl.add(stats.gap_counts, stats.gap_sum)
        if outcome == "client_gone":
            return ("client_gone", client_resp)
        if outcome in ("migrate", "recompute"):
            tracker.note_identity(relayed_events(history, chunked))
        if outcome == "migrate":
            tokens = account(tracker, relayed_events(history, chunked))
            log.info("request %s: migrating its stream off decode %s (attempt %s) after %d tokens here, %d in all; "
                     "continuing with a new prefill elsewhere", client_id, d_state.name, attempt_id, tokens,
                     tracker.tokens_relayed())
            return ("migrate", client_resp)
        self.pool.record_success(d_state)
        if outcome == "recompute":
            return ("recompute", client_resp)
        try:
            await client_resp.write_eof()
        except (ConnectionError, RuntimeError):
            return ("client_gone", client_resp)
        return ("done", client_resp)

    async def _end_broken(self, client_resp: web.StreamResponse, d_state: InstanceState, exc: RelayError,
                          client_id: str, attempt_id: str) -> tuple[Any, ...]:
        """Decode broke after relaying the answer's end (its finish reason or usage): the instance is marked
        failed and the client's stream is closed with the ``[DONE]`` it was owed; the answer is whole."""
        self.pool.record_failure(d_state, ("unreachable, " if exc.hard else "") + exc.reason, exc.hard)
        log.warning("request %s: decode %s on %s broke after the answer's end (%s); closing the stream with [DONE]",
                    client_id, attempt_id, d_state.name, exc.reason)
        return ("done", await self._end_stream(client_resp, b"data: [DONE]\n\n"))

    def _resume_broken(self, client_resp: web.StreamResponse, d_state: InstanceState, exc: RelayError,
                       tracker: MigrationTracker, events: list[dict[str, Any]], client_id: str,
                       attempt_id: str) -> tuple[Any, ...]:
        """Decode broke or stalled after bytes were relayed, the stream can be continued (``StreamHandle.
        continuable``) and another decode is routable: the instance is marked failed (a broken connection ejects
        it) and the answer goes on through a fresh prefill of the prompt and the text so far on another decode, as
        a migrated stream does."""
        self.pool.record_failure(d_state, ("unreachable, " if exc.hard else "") + exc.reason, exc.hard)
        tracker.note_identity(events)
        tokens = account(tracker, events)
        log.warning("request %s: decode %s on %s failed mid-stream (%s) after %d tokens here, %d in all; continuing "
                    "with a new prefill elsewhere", client_id, attempt_id, d_state.name, exc.reason, tokens,
                    tracker.tokens_relayed())
        return ("migrate", client_resp)

    async def _stream_broke(self, client_resp: web.StreamResponse, d_state: InstanceState, exc: RelayError,
                            client_id: str, attempt_id: str) -> tuple[Any, ...]:
        """Decode broke or stalled after bytes were relayed: end the client's stream with an error event."""
        self.pool.record_failure(d_state, ("unreachable, " if exc.hard else "") + exc.reason, exc.hard)
        log.warning("request %s: decode %s on %s failed mid-stream: %s", client_id, attempt_id, d_state.name,
                    exc.reason)
        return ("stream_error", await self._fail(
            client_resp, 502, f"decode instance {d_state.name} failed mid-stream ({exc.reason}); "
            "the answer is incomplete and was not retried"))

    def _response_headers(self, p_state: InstanceState, d_state: InstanceState,
                          upstream: aiohttp.ClientResponse) -> dict[str, str]:
        """Headers of the client's answer (``X-Request-Id`` is added by :meth:`handle` / the stream relay)."""
        return {
            "Content-Type": upstream.headers.get("Content-Type", "application/json"),
            "x-prefill-instance": p_state.name,
            "x-decode-instance": d_state.name,
        }

    def _finish_json(self, upstream: aiohttp.ClientResponse, body: bytes, p_state: InstanceState,
                     d_state: InstanceState, tracker: MigrationTracker, t0: float, client_id: str,
                     attempt_id: str) -> tuple[Any, ...]:
        """Non-streaming answer: relayed unchanged, unless it may ask for a recompute or ends a recomputed
        continuation; the proxy reads it then, and one of a shape it cannot read (answers.usable_event) is a
        failed decode (retried, nothing was sent to the client yet)."""
        if tracker.retries or RECOMPUTED.encode() in body:
            try:
                answer = load_json(body)
            except JsonError:
                answer = None
            if answer is None or not usable_event(answer):
                return self._decode_retry(d_state, client_id, attempt_id,
                                          f"decode answered 200 with a body that is not a completion: {body[:80]!r}")
            choices = answer.get("choices") or [{}]
            usage = answer.get("usage")
            tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
            self.pool.record_success(d_state)
            if tracker.add_choice(choices[0], tokens if type(tokens) is int else 0):
                return ("recompute", None)
            if tracker.retries:
                body = json.dumps(tracker.finalize_json(answer)).encode()
        else:
            self.pool.record_success(d_state)
        self.metrics.ttft.observe(time.perf_counter() - t0)
        return ("done", web.Response(body=body, headers=self._response_headers(p_state, d_state, upstream)))

    def _split_recompute(self, blob: bytes, history: list[bytes],
                         tracker: MigrationTracker) -> tuple[bytes, bool]:
        """Find a ``stop_reason == recomputed`` event in ``blob`` (complete events).

        Returns (bytes to relay, recompute?). On a recompute the events before it
        are relayed, and the tracker is fed every relayed event so far
        (``history``, the events already written) plus the recomputed one (as the
        reference proxy counts them). ``history`` is not changed.
        """
        parts = blob.split(b"\n\n")
        for i, raw in enumerate(parts):
            if b"recomputed" not in raw:
                continue
            events = sse_events(raw + b"\n\n")
            if not any(c.get("stop_reason") == RECOMPUTED for e in events for c in e.get("choices") or []):
                continue
            before = b"\n\n".join(parts[:i]) + (b"\n\n" if i else b"")
            for event in sse_events(b"".join(history) + before + raw + b"\n\n"):
                choices = event.get("choices") or []
                if choices:
                    tracker.add_choice(choices[0], None)
            return before, True
        return blob, False
