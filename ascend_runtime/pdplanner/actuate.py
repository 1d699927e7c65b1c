"""Moving a flexible node group between prefill and decode without dropping a request.

One move (:func:`move_group`), whatever runs the instances (a :class:`Backend`: local processes,
``actuate_local``; Kubernetes replica counts, ``actuate_k8s``):

1. drain the group's running instances in every proxy replica (``POST /admin/instances/drain``):
   no new requests go to them. A decode group is drained with ``migrate: true``: the proxies move
   its in-flight streams to the other decode instances (each continues through a fresh prefill of
   its prompt and the text so far, proxy/migrate.py), so the drain lasts a re-prefill, not the
   longest remaining output. A prefill group just drains (its requests last one prefill);
2. wait until every replica reports them idle: no request in flight, no prompt tokens held for a
   decode that has not started (a prefill keeps its KV blocks until then), no active stream (one
   that could not be moved finishes in place); bounded by ``drain_timeout_s``. Past it the move is
   abandoned: the instances are undrained and keep serving, nothing was stopped, so no request is
   dropped;
3. stop them, start the other shape's instances and wait until they pass their health checks
   (bounded by ``ready_timeout_s``; if they do not, they are stopped, the old shape is started
   again and undrained once healthy);
4. add the new instances to every proxy replica under their role (``POST /admin/instances/add``)
   and remove the old ones (``POST /admin/instances/remove``).

Under rank serving (``serving: rank``) the proxies route to each DP rank of an instance as its own
endpoint, listed with ``instance`` set: drains and removals name the instance (the proxies apply them
to all its endpoints), the idle wait and the in-flight counts sum its endpoints (:func:`instance_views`),
and the new instances are added as one endpoint per DP rank (``InstancePlan.api_endpoints``).

The groups one decision moves move concurrently (each leaves the stage that has them in surplus).

``layout`` (group name -> role running) is what the planner counts from; a move updates it only
when it completed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from ascend_runtime.faults.proxies import ProxyAdmin, ProxyError
from ascend_runtime.planner.plan import FlexGroup, Plan

log = logging.getLogger(__name__)

#: move results ``GroupMover.history`` keeps (the newest)
MOVE_HISTORY = 64


class ActuationError(Exception):
    """A move that could not complete; the group is left serving in the shape it had."""


class Backend(Protocol):
    """Starts and stops instances by name (the Plan's names, both shapes)."""

    async def stop(self, names: Sequence[str]) -> None:
        """Stop these instances (they are drained and idle)."""

    async def start(self, names: Sequence[str], timeout_s: float) -> None:
        """Start these instances and return once each answers its health check; ActuationError otherwise."""


class PlannerProxyAdmin(ProxyAdmin):
    """The fault watcher's admin client plus ``add`` and ``remove`` (docs/proxy.md, admin API)."""

    async def add(self, url: str, instances: list[dict[str, Any]]) -> None:
        await self._call("POST", url, "/admin/instances/add", {"instances": instances})

    async def remove(self, url: str, names: list[str]) -> None:
        await self._call("POST", url, "/admin/instances/remove", {"names": names})

    async def evacuate(self, url: str, name: str) -> int:
        """Drain ``name`` and move its in-flight streams elsewhere; returns how many that replica moved."""
        answer = await self._call("POST", url, "/admin/instances/drain", {"name": name, "drain": True, "migrate": True})
        return int(answer.get("migrating") or 0) if isinstance(answer, dict) else 0


def group_of(name: str, snapshot: dict[str, Any]) -> str:
    """The engine instance a listed endpoint serves: its ``instance`` (a DP rank, rank serving) or its name."""
    instance = snapshot.get("instance")
    return instance if isinstance(instance, str) and instance else name


def instance_views(listing: dict[str, dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The snapshots of instance ``name`` in one replica's listing: the endpoint ``name`` and every endpoint
    that is a DP rank of it; ``[]`` when the replica does not route to it."""
    return [snap for key, snap in listing.items() if isinstance(snap, dict) and (key == name or group_of(key, snap) == name)]


def idle(snapshot: dict[str, Any] | None) -> bool:
    """True when a proxy's view of an instance holds no request (absent: nothing to wait for)."""
    if snapshot is None:
        return True
    return not (snapshot.get("inflight") or snapshot.get("outstanding_prompt_tokens") or snapshot.get("active_seqs"))


@dataclass
class MoveResult:
    """What a move did; times in seconds."""

    group: str
    to_role: str
    ok: bool
    drain_s: float = 0.0
    restart_s: float = 0.0
    detail: str = ""
    #: streams the proxies moved off the drained instances (decode groups)
    migrated: int = 0


class GroupMover:
    """Runs moves of a Plan's flexible groups through ``backend`` and every proxy replica of ``proxy``.

    ``endpoint(name)`` gives the URL the proxy reaches an instance at. ``migrate``: decode groups
    are drained with stream migration (False: every drain waits for its streams to finish).
    """

    def __init__(self, plan: Plan, backend: Backend, proxy: PlannerProxyAdmin, layout: dict[str, str],
                 endpoint: Callable[[str], str], drain_timeout_s: float = 900.0, ready_timeout_s: float = 3600.0,
                 poll_s: float = 0.5, migrate: bool = True) -> None:
        self.plan, self.backend, self.proxy, self.endpoint = plan, backend, proxy, endpoint
        self.migrate = migrate
        self.layout = dict(layout)
        self.drain_timeout_s, self.ready_timeout_s, self.poll_s = drain_timeout_s, ready_timeout_s, poll_s
        self.groups = {g.name: g for g in plan.flex_groups}
        #: the last MOVE_HISTORY move results (inspection only; nothing decides on them)
        self.history: deque[MoveResult] = deque(maxlen=MOVE_HISTORY)

    def prefill_groups(self) -> int:
        """Groups running the prefill shape now."""
        return sum(1 for r in self.layout.values() if r == "prefill")

    def plan_moves(self, prefill_groups: int, busy: dict[str, float] | None = None) -> list[tuple[FlexGroup, str]]:
        """The fewest group moves reaching ``prefill_groups`` prefill groups.

        ``busy`` (instance name -> in-flight requests, summed over the proxy replicas): the groups with
        the least in-flight work on their running instances move (a decode group's streams are each
        re-prefilled elsewhere or waited for; fewer of them, a shorter and cheaper drain). Ties, and
        no ``busy``: the Plan's order (first groups first to prefill, last groups first to decode).
        """
        have = self.prefill_groups()
        if prefill_groups == have:
            return []
        src, to = ("decode", "prefill") if prefill_groups > have else ("prefill", "decode")
        order = list(self.groups.values())
        if to == "decode":
            order.reverse()
        load = lambda g: sum((busy or {}).get(n, 0.0) for n in g.shape(src))  # noqa: E731
        candidates = sorted((g for g in order if self.layout[g.name] == src), key=load)  # stable: ties keep the order
        return [(g, to) for g in candidates[: abs(prefill_groups - have)]]

    async def busy(self) -> dict[str, float]:
        """In-flight requests per engine instance (its rank endpoints summed, rank serving) over every proxy
        replica ({} when no listing answers)."""
        out: dict[str, float] = {}
        try:
            for url in await self.proxy.replicas():
                for name, snap in (await self.proxy.listing(url)).items():
                    if isinstance(snap, dict):
                        group = group_of(name, snap)
                        out[group] = out.get(group, 0.0) + float(snap.get("inflight") or 0)
        except (ProxyError, aiohttp.ClientError) as exc:
            log.warning("reading the proxies' in-flight counts failed (%s); moving groups in Plan order", exc)
            return {}
        return out

    async def apply(self, prefill_groups: int) -> list[MoveResult]:
        """Move groups until ``prefill_groups`` serve prefill; the groups of one decision move at once
        (each is surplus in the stage it leaves, and each drains on its own), least busy first."""
        moves = self.plan_moves(prefill_groups, await self.busy())
        return list(await asyncio.gather(*(self.move(g, r) for g, r in moves)))

    async def _all_replicas(self, call: Callable[[str], Any]) -> None:
        urls = await self.proxy.replicas()
        if not urls:
            raise ActuationError("no proxy replica to drain through")
        await asyncio.gather(*(call(u) for u in urls))

    async def _wait_idle(self, names: Sequence[str]) -> bool:
        deadline = time.monotonic() + self.drain_timeout_s
        while True:
            busy = []
            for url in await self.proxy.replicas():
                listing = await self.proxy.listing(url)
                busy += [f"{n}@{url}" for n in names if not all(idle(v) for v in instance_views(listing, n))]
            if not busy:
                return True
            if time.monotonic() > deadline:
                log.warning("drain of %s timed out after %.0f s; still busy: %s", ", ".join(names),
                            self.drain_timeout_s, ", ".join(busy))
                return False
            await asyncio.sleep(self.poll_s)

    def _specs(self, names: Sequence[str]) -> list[dict[str, Any]]:
        """The proxy's instance entries of ``names``: ``{name, role, url}`` of each instance (at
        ``endpoint(name)``), or under rank serving ``{name, role, url, instance}`` of each DP rank."""
        out: list[dict[str, Any]] = []
        for n in names:
            inst = self.plan.instance(n)
            if getattr(inst, "serving", "instance") != "rank":
                out.append({"name": n, "role": inst.role, "url": self.endpoint(n)})
                continue
            out += [{"name": ep.name, "role": ep.role, "url": ep.url, "instance": ep.instance}
                    for ep in inst.api_endpoints]
        return out

    async def move(self, group: FlexGroup, to_role: str) -> MoveResult:
        """Drain, stop, start in the other shape, health-check, re-register; never drops a request."""
        from_role = self.layout[group.name]
        if from_role == to_role:
            return MoveResult(group.name, to_role, True, detail="already there")
        old, new = group.shape(from_role), group.shape(to_role)
        migrate = self.migrate and from_role == "decode"
        log.info("moving %s from %s to %s: draining %s%s", group.name, from_role, to_role, ", ".join(old),
                 " and migrating their streams" if migrate else "")
        t0 = time.monotonic()
        moved: list[int] = []
        try:
            if migrate:

                async def evacuate(u: str) -> None:
                    moved.extend(await asyncio.gather(*(self.proxy.evacuate(u, n) for n in old)))

                await self._all_replicas(evacuate)
                log.info("%s: %d stream(s) migrated off %s", group.name, sum(moved), ", ".join(old))
            else:
                await self._all_replicas(lambda u: asyncio.gather(*(self.proxy.drain(u, n, True) for n in old)))
            drained = await self._wait_idle(old)
        except (ProxyError, aiohttp.ClientError) as exc:
            drained, why = False, f"proxy admin call failed: {exc}"
        else:
            why = f"in-flight requests did not finish within {self.drain_timeout_s:g} s"
        drain_s = time.monotonic() - t0
        if not drained:
            await self._undrain(old)
            result = MoveResult(group.name, to_role, False, drain_s, 0.0, f"abandoned, {why}; {group.name} keeps serving")
            log.warning("move of %s %s", group.name, result.detail)
            result.migrated = sum(moved)
            self.history.append(result)
            return result
        t1 = time.monotonic()
        await self.backend.stop(old)
        try:
            await self.backend.start(new, self.ready_timeout_s)
        except ActuationError as exc:
            log.error("%s did not come up as %s (%s); restoring %s", group.name, to_role, exc, from_role)
            await self.backend.stop(new)
            await self.backend.start(old, self.ready_timeout_s)
            await self._undrain(old)
            result = MoveResult(group.name, to_role, False, drain_s, time.monotonic() - t1, f"rolled back: {exc}")
            result.migrated = sum(moved)
            self.history.append(result)
            return result
        await self._all_replicas(lambda u: self.proxy.add(u, self._specs(new)))
        await self._all_replicas(lambda u: self.proxy.remove(u, list(old)))
        self.layout[group.name] = to_role
        result = MoveResult(group.name, to_role, True, drain_s, time.monotonic() - t1,
                            f"{', '.join(old)} -> {', '.join(new)}")
        log.info("moved %s to %s in %.1f s (drain %.1f s, restart %.1f s)", group.name, to_role,
                 time.monotonic() - t0, drain_s, result.restart_s)
        result.migrated = sum(moved)
        self.history.append(result)
        return result

    async def _undrain(self, names: Sequence[str]) -> None:
        try:
            await self._all_replicas(lambda u: asyncio.gather(*(self.proxy.drain(u, n, False) for n in names)))
        except (ProxyError, ActuationError) as exc:
            log.error("undraining %s failed: %s (undrain by hand: POST /admin/instances/drain)", names, exc)
