"""Pieces the fake Kubernetes API servers of the tests share (test doubles, never used by the kit).

``kube_status``: the API server's ``Status`` error body; ``serve_on_loopback``: run an aiohttp app on
127.0.0.1 on a free port.
"""

from __future__ import annotations

from aiohttp import web


def kube_status(code: int, reason: str, message: str) -> web.Response:
    """A ``Status`` failure as the API server answers it (``kind: Status``, ``reason``, ``code``)."""
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                              "reason": reason, "code": code}, status=code)


async def serve_on_loopback(app: web.Application) -> tuple[web.AppRunner, str]:
    """Start ``app`` on 127.0.0.1 on a free port; (runner, base URL)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"
