"""The PD proxy's admin API, on every replica.

Drain state lives in each proxy process (``InstancePool.draining``), so a drain
must reach every replica, not the Service (which would pick one). Replicas are
the static URLs given, plus, with a Service, the addresses of its
EndpointSlices (refreshed every ``refresh_s``; a terminating endpoint is left
out, a not-yet-ready one is kept so it starts with the drains in force).
Routes used (``ascend_runtime/proxy/admin.py``): ``GET /admin/instances`` and
``POST /admin/instances/drain {"name", "drain"}`` with ``Authorization: Bearer``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from ascend_runtime.config.errors import is_dns_label
from ascend_runtime.faults.kube import KubeClient, KubeError

log = logging.getLogger(__name__)


class ProxyError(Exception):
    """An admin call to one replica failed."""


@dataclass(frozen=True)
class ProxyService:
    """``namespace/name:port`` of the proxy Service."""

    namespace: str
    name: str
    port: int

    @classmethod
    def parse(cls, text: str) -> ProxyService:
        ref, _, port = text.rpartition(":")
        ns, _, name = ref.partition("/")
        if not ns or not name or not port.isdigit():
            raise ValueError(f"{text!r}: expected NAMESPACE/NAME:PORT")
        if not (is_dns_label(ns) and is_dns_label(name)):
            raise ValueError(f"{text!r}: NAMESPACE and NAME must be DNS-1123 labels (lowercase letters, digits, '-'); "
                             "expected NAMESPACE/NAME:PORT, e.g. deepseek/pd-proxy:8000")
        if not 1 <= int(port) <= 65535:
            raise ValueError(f"{text!r}: the port must be 1..65535; expected NAMESPACE/NAME:PORT")
        return cls(ns, name, int(port))


class ProxyAdmin:
    """Admin calls to every replica; ``replicas()`` is the current list of base URLs."""

    def __init__(self, session: aiohttp.ClientSession, token: str, static: list[str] | None = None,
                 service: ProxyService | None = None, kube: KubeClient | None = None,
                 timeout_s: float = 2.0, refresh_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if service is not None and kube is None:
            raise ValueError("a proxy Service needs a Kubernetes client")
        self.session, self.static, self.service, self.kube = session, [u.rstrip("/") for u in static or []], service, kube
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.refresh_s, self.clock = refresh_s, clock
        self._discovered: list[str] = []
        self._refreshed_at: float | None = None

    async def replicas(self) -> list[str]:
        """Static URLs plus the Service's endpoints (the last good list when the API call fails)."""
        if self.service is not None and (self._refreshed_at is None
                                         or self.clock() - self._refreshed_at >= self.refresh_s):
            try:
                self._discovered = await self._discover()
                self._refreshed_at = self.clock()
            except KubeError as exc:
                log.warning("proxy replicas of %s/%s: %s (keeping %d known)", self.service.namespace,
                            self.service.name, exc, len(self._discovered))
        return sorted(set(self.static) | set(self._discovered))

    async def _discover(self) -> list[str]:
        assert self.service is not None and self.kube is not None
        urls = []
        for sl in await self.kube.list_endpointslices(self.service.namespace, self.service.name):
            for ep in sl.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("terminating"):
                    continue
                for addr in ep.get("addresses") or []:
                    host = f"[{addr}]" if ":" in addr else addr
                    urls.append(f"http://{host}:{self.service.port}")
        return urls

    async def listing(self, url: str) -> dict[str, dict[str, Any]]:
        """``GET /admin/instances`` of one replica: instance name -> its snapshot."""
        data = await self._call("GET", url, "/admin/instances")
        return {i["name"]: i for i in data.get("instances") or [] if isinstance(i, dict) and "name" in i}

    async def drain(self, url: str, name: str, drain: bool = True) -> None:
        await self._call("POST", url, "/admin/instances/drain", {"name": name, "drain": drain})

    async def _call(self, method: str, url: str, path: str, body: Any = None) -> dict[str, Any]:
        try:
            async with self.session.request(method, url + path, json=body, headers=self.headers,
                                            timeout=self.timeout) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise ProxyError(f"{method} {url}{path}: HTTP {resp.status}: {text[:200]}")
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ProxyError(f"{method} {url}{path}: {type(exc).__name__}: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError:
            raise ProxyError(f"{method} {url}{path}: answer is not JSON") from None
        return data if isinstance(data, dict) else {}
