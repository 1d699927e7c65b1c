"""The proxy HTTP server and its Python API.

``handle = await start_proxy(config)`` serves until ``await handle.stop()``.
Routes: POST /v1/completions, POST /v1/chat/completions; the engine's utility routes GET /v1/models,
GET /version, GET and POST /ping, POST /tokenize and /detokenize (answered by one instance);
GET /health and /healthcheck, GET /metrics, and the admin API (admin.py).
Errors are in vLLM 0.23.0's shape (errors.py); other paths answer 404
``{"detail": "Not Found"}``.

The routes are served by aiohttp's low-level ``web.Server`` with one dict
lookup per request (:class:`Routes`) instead of an ``Application`` with its
URL dispatcher and middleware chain, which cost CPU on every request
(docs/proxy.md, "Relay cost").
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from ascend_runtime.proxy.admin import AdminApi
from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.discovery import FileDiscovery, KubernetesDiscovery
from ascend_runtime.proxy.errors import error_response, json_detail
from ascend_runtime.proxy.forward import Forwarder
from ascend_runtime.proxy.health import HealthChecker
from ascend_runtime.proxy.instances import InstanceSpec, check_unique
from ascend_runtime.proxy.metrics import ProxyMetrics
from ascend_runtime.proxy.pool import InstancePool
from ascend_runtime.proxy.protolog import NO_ENDPOINT, ProtocolErrorLog
from ascend_runtime.proxy.workers import WorkerGroup, is_local

log = logging.getLogger(__name__)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Routes:
    """Exact-path routing: ``{path: {method: handler}}``, one dict lookup per request.

    GET routes answer HEAD too (as aiohttp's ``web.get``); an unknown path is 404
    ``{"detail": "Not Found"}``, a known path with another method 405
    ``{"detail": "Method Not Allowed"}`` with ``Allow`` (FastAPI's answers, errors.py).
    """

    def __init__(self) -> None:
        self.table: dict[str, dict[str, Handler]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        methods = self.table.setdefault(path, {})
        methods[method] = handler
        if method == "GET":
            methods.setdefault("HEAD", handler)

    def add_defs(self, defs: list[web.RouteDef]) -> None:
        """Add aiohttp route definitions (``web.get``/``web.post``, as admin.py lists them)."""
        for d in defs:
            self.add(d.method, d.path, d.handler)  # type: ignore[arg-type]

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        methods = self.table.get(request.path)
        if methods is None:
            return json_detail(404, "Not Found")
        handler = methods.get(request.method)
        if handler is None:
            return json_detail(405, "Method Not Allowed", {"Allow": ", ".join(sorted(methods))})
        return await handler(request)


@dataclass
class Proxy:
    """The proxy's parts, wired together; built by :func:`build_proxy`."""

    config: ProxyConfig
    pool: InstancePool
    metrics: ProxyMetrics
    session: aiohttp.ClientSession
    forwarder: Forwarder
    health: HealthChecker
    routes: Routes
    file_discovery: FileDiscovery | None = None
    k8s_discovery: KubernetesDiscovery | None = None
    extra_tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def apply_static(self, specs: list[InstanceSpec], source: str = "static") -> None:
        """Make the instances of ``source`` exactly ``specs`` (drains the ones that go away)."""
        check_unique(specs)
        added, removed = self.pool.sync(source, specs)
        if added or removed:
            log.info("instances from %s: added %s, removed %s", source, added, removed)


@dataclass
class ProxyHandle:
    """A running proxy: ``url`` to send requests to, ``stop()`` to shut it down."""

    proxy: Proxy
    runner: web.BaseRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pool(self) -> InstancePool:
        return self.proxy.pool

    def reload(self) -> bool:
        """Re-read the instances file (what SIGHUP does); False if there is none or it is invalid."""
        fd = self.proxy.file_discovery
        return fd.reload() if fd is not None else False

    async def stop(self) -> None:
        p = self.proxy
        if p.config.install_sighup:
            try:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        if p.k8s_discovery is not None:
            p.k8s_discovery.stop()
        if p.file_discovery is not None:
            await p.file_discovery.stop()
        await p.health.stop()
        await self.runner.cleanup()
        p.forwarder.relay_pool.close()
        await p.session.close()


def _health_payload(pool: InstancePool) -> tuple[int, dict[str, Any]]:
    summary = pool.summary()
    missing = [r for r in ("prefill", "decode") if summary[r]["routable"] == 0]
    if not missing:
        return 200, {"status": "ok", **summary}
    reasons = []
    for role in missing:
        detail = "; ".join(f"{n}: {r}" for n, r in summary[role]["unavailable"].items()) or "none configured"
        reasons.append(f"no available {role} instance ({detail})")
    return 503, {"status": "unavailable", "reason": " and ".join(reasons), **summary}


def build_proxy(config: ProxyConfig, k8s: KubernetesDiscovery | None = None,
                group: "WorkerGroup | None" = None) -> Proxy:
    """Wire pool, metrics, client session, forwarder, health checker and routes (needs a running loop).

    group: this process's sibling workers (``--workers N``, workers.py): /metrics and the admin API
    then answer for all workers, except on the worker's own Unix socket.
    """
    metrics = ProxyMetrics()
    pool = InstancePool(weights=config.weights, policy=config.outlier_policy(),
                        active_checks=config.health_interval_s > 0, on_event=metrics.on_pool_event)
    # keepalive_timeout below the engines' keep-alive (config.engine_keepalive_s): aiohttp does not resend a POST
    # whose reused connection the engine closed meanwhile (only idempotent methods are retried)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=60,
                                     keepalive_timeout=config.engine_keepalive_s)
    session = aiohttp.ClientSession(connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",))
    forwarder = Forwarder(config, pool, metrics, session)
    health = HealthChecker(pool, session, config.health_interval_s, config.health_timeout_s)
    routes = Routes()
    proxy = Proxy(config, pool, metrics, session, forwarder, health, routes, k8s_discovery=k8s)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await forwarder.handle(request, "/v1/completions")

    async def chat(request: web.Request) -> web.StreamResponse:
        return await forwarder.handle(request, "/v1/chat/completions")

    async def health_route(request: web.Request) -> web.Response:
        status, body = _health_payload(pool)
        return web.json_response(body, status=status)

    async def metrics_route(request: web.Request) -> web.Response:
        body = metrics.render(pool)
        if group is not None and not is_local(request):
            body = await group.merged_metrics(body)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    def engine_utility(path: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        """A route answered by one engine instance as vLLM answers it (the model list, the version, the
        liveness ping, the tokenizer): the client's request goes to the first instance that answers (routable
        ones first, decode before prefill), and its answer comes back as is, a 4xx included (the engine's
        verdict on the client's input); an unreachable instance or a 5xx moves on to the next."""

        async def route(request: web.Request) -> web.Response:
            body = await request.read() if request.method == "POST" else None
            headers = {"Content-Type": request.headers.get("Content-Type", "application/json")} if body else None
            now = pool.clock()
            candidates = sorted(pool.all(), key=lambda s: (not s.routable(now), s.role != "decode"))
            failures = []
            for state in candidates:
                try:
                    async with session.request(request.method, state.spec.url + path, data=body, headers=headers,
                                               timeout=aiohttp.ClientTimeout(total=config.health_timeout_s * 3)) as resp:
                        answer = await resp.read()
                        if resp.status < 500:
                            kind = resp.headers.get("Content-Type")
                            return web.Response(status=resp.status, body=answer,
                                                headers={"Content-Type": kind} if kind else None)
                        failures.append(f"{state.name}: HTTP {resp.status}")
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    failures.append(f"{state.name}: {exc.__class__.__name__}")
            msg = f"no instance answered {path}" + (f" ({'; '.join(failures)})" if failures else ": none configured")
            return error_response(503, msg)

        return route

    routes.add("POST", "/v1/completions", completions)
    routes.add("POST", "/v1/chat/completions", chat)
    # vLLM 0.23.0's utility routes (vllm/entrypoints/openai/api_server.py and serve/ routers of that release)
    for method, path in (("GET", "/v1/models"), ("GET", "/version"), ("GET", "/ping"), ("POST", "/ping"),
                         ("POST", "/tokenize"), ("POST", "/detokenize")):
        routes.add(method, path, engine_utility(path))
    routes.add("GET", "/health", health_route)
    routes.add("GET", "/healthcheck", health_route)
    routes.add("GET", "/metrics", metrics_route)
    routes.add_defs(AdminApi(pool, config.admin_token, group).routes())
    if config.instances:
        proxy.apply_static(list(config.instances), "static")
    if config.instances_file is not None:
        proxy.file_discovery = FileDiscovery(config.instances_file, lambda s: proxy.apply_static(s, "file"),
                                             config.file_poll_interval_s)
    return proxy


def own_url(host: str, port: int) -> str:
    """The base URL the proxy reaches itself on: a wildcard listen address is reached on loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def start_proxy(config: ProxyConfig, k8s: KubernetesDiscovery | None = None,
                      group: "WorkerGroup | None" = None, unix_path: str | None = None) -> ProxyHandle:
    """Start the proxy on ``config.host:config.port`` (port 0 = any free port) and return its handle.

    k8s: an optional :class:`KubernetesDiscovery` whose ``apply`` is replaced to
    feed this proxy's pool (source ``k8s``). group / unix_path: set by
    workers.py for each worker of ``--workers N`` (siblings; the worker's own
    Unix socket, created last, so its existence means the worker serves).
    """
    proxy = build_proxy(config, k8s, group)
    if proxy.file_discovery is not None:
        proxy.file_discovery.start()
    if k8s is not None:
        k8s.apply = lambda specs: proxy.apply_static(specs, "k8s")
        k8s.start(asyncio.get_running_loop())
    # handler_cancellation: a client disconnect cancels the handler, which closes upstream requests.
    # keepalive_timeout: aiohttp closes a connection that has not sent a complete request head this long
    # after it opened or after the previous answer (the header timeout; also the keep-alive idle timeout).
    # lingering_time=0: a refused body (413) is never read; the connection is closed after the answer.
    max_body = config.limits.max_body_bytes
    loop = asyncio.get_running_loop()

    def make_request(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        # request.read() (admin API) is limited as the completion bodies are (Limits.max_body_bytes)
        return web.BaseRequest(message, payload, protocol, writer, task, loop, client_max_size=max_body)

    # logger: a malformed request head is counted and logged in one line, not a traceback each (protolog.py)
    metrics = proxy.metrics
    server_log = ProtocolErrorLog(logging.getLogger("ascend_runtime.proxy.http"),
                                  lambda: metrics.requested(NO_ENDPOINT, "bad_request", "400"))
    server = web.Server(proxy.routes, request_factory=make_request, handler_cancellation=True, access_log=None,
                        keepalive_timeout=config.limits.header_timeout_s, lingering_time=0, logger=server_log)
    runner = web.ServerRunner(server)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port, backlog=4096, reuse_address=True,
                       reuse_port=config.reuse_port or None)
    await site.start()
    port = config.port
    sockets = getattr(site._server, "sockets", None) or []  # noqa: SLF001 - aiohttp has no public accessor
    if sockets:
        port = sockets[0].getsockname()[1]
    proxy.forwarder.self_url = own_url(config.host, port)
    proxy.health.start()
    if config.install_sighup and proxy.file_discovery is not None:
        fd = proxy.file_discovery
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, fd.reload)
    if unix_path is not None:
        await web.UnixSite(runner, unix_path).start()
    log.info("proxy listening on http://%s:%s", config.host, port)
    return ProxyHandle(proxy=proxy, runner=runner, host=config.host, port=port)
