"""The small HTTP server every periodic process of the kit exposes: ``/metrics`` and optional ``/healthz``.

Used by the expert balancer, the fault watcher and the P:D planner, so they serve
Prometheus text the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def start_metrics_server(
    registry: CollectorRegistry, host: str, port: int, healthz: Handler | None = None
) -> web.AppRunner:
    """Serve ``registry`` on ``http://host:port/metrics`` (and ``healthz`` on ``/healthz``); returns the runner
    to ``cleanup()`` on stop."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    if healthz is not None:
        app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
