"""Appliers: make one instance serve a published map. The daemon calls them one at a time.

- :class:`SimulatorApplier`: ``POST {url}/admin/expert_map`` with the map;
  200 ``{"applied": true, "balancedness": x}`` is success, anything else fails.
- :class:`DrainRestartApplier`: for vLLM-Ascend static maps (read at start-up
  from ``expert_map_path``): drain the instance through the proxy
  (``POST {proxy}/admin/instances/drain {"name"}`` with a Bearer token), wait
  for in-flight requests, delete the instance's pods (the Deployment/StatefulSet
  recreates them, reading the new ConfigMap), wait until they are Ready again,
  then re-admit it (``POST {proxy}/admin/instances/drain {"name", "drain": false}``,
  the proxy's undrain). The instance must be listed by ``GET /admin/instances``
  first; the wait for in-flight requests polls that listing.
- :class:`NoopApplier`: publish only (engines pick the map up themselves).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

log = logging.getLogger(__name__)


@dataclass
class ApplyResult:
    instance: str
    ok: bool
    detail: str = ""
    balancedness: float | None = None


class Applier(Protocol):
    async def apply(self, session: aiohttp.ClientSession, doc: dict[str, Any]) -> ApplyResult: ...


class NoopApplier:
    def __init__(self, name: str) -> None:
        self.name = name

    async def apply(self, session: aiohttp.ClientSession, doc: dict[str, Any]) -> ApplyResult:
        return ApplyResult(self.name, True, "published only")


class SimulatorApplier:
    """Hot-applies a map to a simulator (or any engine with the same admin endpoint)."""

    def __init__(self, name: str, url: str, timeout_s: float = 10.0) -> None:
        self.name, self.url, self.timeout_s = name, url.rstrip("/"), timeout_s

    async def apply(self, session: aiohttp.ClientSession, doc: dict[str, Any]) -> ApplyResult:
        async with session.post(
            f"{self.url}/admin/expert_map", json=doc, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
        ) as resp:
            text = await resp.text()
            if resp.status != 200:
                return ApplyResult(self.name, False, f"HTTP {resp.status}: {text[:200]}")
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                return ApplyResult(self.name, False, f"non-JSON answer: {text[:200]}")
        if not body.get("applied"):
            return ApplyResult(self.name, False, f"not applied: {text[:200]}")
        b = body.get("balancedness")
        return ApplyResult(self.name, True, "applied", float(b) if b is not None else None)


class DrainRestartApplier:
    """Drain via the proxy, restart the pods (kubernetes client), wait Ready, undrain via the proxy."""

    def __init__(
        self,
        name: str,
        proxy_url: str,
        token: str,
        core_api: Any,
        namespace: str,
        label_selector: str,
        drain_wait_s: float = 60.0,
        ready_timeout_s: float = 900.0,
        poll_s: float = 2.0,
    ) -> None:
        self.name, self.proxy_url, self.token = name, proxy_url.rstrip("/"), token
        self.api, self.namespace, self.label_selector = core_api, namespace, label_selector
        self.drain_wait_s, self.ready_timeout_s, self.poll_s = drain_wait_s, ready_timeout_s, poll_s

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def _drain(self, session: aiohttp.ClientSession, drain: bool) -> int:
        async with session.post(f"{self.proxy_url}/admin/instances/drain", json={"name": self.name, "drain": drain},
                                headers=self._headers()) as resp:
            return resp.status

    async def _listed(self, session: aiohttp.ClientSession) -> dict[str, Any] | None:
        """This instance's entry in the proxy's ``GET /admin/instances``; None if absent; raises on HTTP errors."""
        async with session.get(f"{self.proxy_url}/admin/instances", headers=self._headers()) as resp:
            if resp.status != 200:
                raise RuntimeError(f"proxy listing refused: HTTP {resp.status}")
            body = await resp.json(content_type=None)
        return next((i for i in body.get("instances", []) if i.get("name") == self.name), None)

    def _pods(self) -> list[Any]:
        return list(self.api.list_namespaced_pod(self.namespace, label_selector=self.label_selector).items)

    @staticmethod
    def _ready(pod: Any) -> bool:
        conds = getattr(pod.status, "conditions", None) or []
        return any(c.type == "Ready" and c.status == "True" for c in conds)

    async def apply(self, session: aiohttp.ClientSession, doc: dict[str, Any]) -> ApplyResult:
        try:
            entry = await self._listed(session)
        except (RuntimeError, aiohttp.ClientError, ValueError) as exc:
            return ApplyResult(self.name, False, str(exc))
        if entry is None:
            return ApplyResult(self.name, False, f"proxy does not list instance {self.name!r}")
        status = await self._drain(session, True)
        if status != 200:
            return ApplyResult(self.name, False, f"drain refused by proxy: HTTP {status}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.drain_wait_s
        while loop.time() < deadline:  # in-flight requests finish (the proxy sends no new ones)
            try:
                entry = await self._listed(session)
            except (RuntimeError, aiohttp.ClientError, ValueError):
                entry = None  # cannot see in-flight counts: proceed after what we waited
            if entry is None or not entry.get("inflight"):
                break
            await asyncio.sleep(min(self.poll_s, max(deadline - loop.time(), 0.0)))
        old = await asyncio.to_thread(self._pods)
        if not old:
            await self._drain(session, False)
            return ApplyResult(self.name, False, f"no pods match {self.label_selector!r} in {self.namespace}; undrained")
        old_uids = {p.metadata.uid for p in old}
        for pod in old:
            await asyncio.to_thread(self.api.delete_namespaced_pod, pod.metadata.name, self.namespace)
        deadline = loop.time() + self.ready_timeout_s
        while loop.time() < deadline:
            pods = await asyncio.to_thread(self._pods)
            fresh = [p for p in pods if p.metadata.uid not in old_uids]
            if len(fresh) >= len(old) and all(self._ready(p) for p in fresh):
                break
            await asyncio.sleep(self.poll_s)
        else:
            return ApplyResult(self.name, False, f"pods not Ready within {self.ready_timeout_s:.0f} s; left drained")
        status = await self._drain(session, False)
        if status != 200:
            return ApplyResult(self.name, False, f"undrain refused by proxy: HTTP {status}")
        return ApplyResult(self.name, True, "drained, restarted, undrained")
