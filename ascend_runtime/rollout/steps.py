"""The steps of a rollout, instance by instance, and the rule that the first failure stops it.

Per instance (``[k/n] name``):

1. **drain** it in every proxy replica (``POST /admin/instances/drain``): no new requests;
2. **wait** until the replicas count no request in flight on it (``GET /admin/instances``,
   field ``inflight``), at most ``drain_timeout_s`` (a replica that misses a poll, busy or
   restarting, is asked again until then); on timeout the rollout stops and the
   instance, not yet touched, is undrained (``on_drain_timeout="stop"``), or it is replaced
   anyway and its remaining requests end with an error (``"replace"``);
3. **replace** it (the driver: a local process restart, or a Kubernetes workload patch and
   the wait for its group to be ready);
4. **post-check** it, still drained: ``/health`` and a PD round trip straight to the engines
   with a serving instance of the other role (:mod:`ascend_runtime.rollout.postcheck`);
5. **undrain** it and wait until every replica routes to it again (a proxy that ejected it
   while it restarted re-admits it after a passing health check), so the next drain never
   leaves a role without a routable instance.

Under rank serving (``serving: rank``) the proxies route to each DP rank of an instance as its own
endpoint (``<instance>-dp<rank>``, listed with ``instance`` set): the drain and undrain name the
instance, which the proxies apply to all its endpoints; the wait sums ``inflight`` over all of them;
the post-check runs ``/health`` and a PD round trip through every rank endpoint (at its listed URL,
with a routable endpoint of the other role as partner); the undrain waits until every one is
routable. :func:`endpoints_of` is the one place that maps an instance to its endpoints.

A failure in steps 3-5 leaves the instance drained (it may be broken) and stops the
rollout; the instances after it stay on the old version, untouched. Before the first
step, a preflight asks every replica for its instances: each target must be known to
every replica and not drained already (an operator's or the fault watcher's drain is
theirs to lift), unless ``include_drained``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ascend_runtime.faults.proxies import ProxyAdmin, ProxyError
from ascend_runtime.rollout.order import Target
from ascend_runtime.rollout.postcheck import PostCheck, PostCheckFailed

ON_DRAIN_TIMEOUT = ("stop", "replace")


Listing = dict[str, dict[str, Any]]  # one replica's ``GET /admin/instances``: endpoint name -> its snapshot


def endpoints_of(listing: Listing, name: str) -> list[dict[str, Any]]:
    """The snapshots of instance ``name`` in one replica's listing: every endpoint whose ``instance`` is
    ``name`` (its DP ranks, rank serving), and the endpoint called ``name`` (the whole instance, instance
    serving); ``[]`` when the replica does not route to it."""
    return [snap for key, snap in listing.items() if key == name or snap.get("instance") == name]


def ranks_of(listing: Listing, name: str) -> list[dict[str, Any]]:
    """The DP-rank endpoints of instance ``name`` in ``listing`` (rank serving); ``[]`` under instance serving."""
    return [snap for snap in endpoints_of(listing, name) if snap.get("instance") == name]


def inflight_of(listing: Listing, name: str) -> int:
    """Requests one replica counts in flight on instance ``name``, summed over its endpoints."""
    return sum(int(snap.get("inflight") or 0) for snap in endpoints_of(listing, name))


class ReplaceError(Exception):
    """The driver could not replace the instance, or the new one did not become ready."""


class Driver(Protocol):
    """Replaces one instance by its new version."""

    #: ``local`` or ``kubernetes`` (for messages).
    kind: str

    def describe(self, target: Target) -> str:
        """What :meth:`replace` will do to ``target`` (for ``--dry-run`` and progress)."""
        ...

    async def replace(self, target: Target) -> str:
        """Replace ``target`` and wait until the new one is ready; a one-line summary. Raises ReplaceError."""
        ...


@dataclass(frozen=True)
class RolloutOptions:
    """Bounds in seconds; ``poll_s`` between admin listings."""

    drain_timeout_s: float = 120.0
    routable_timeout_s: float = 60.0
    poll_s: float = 0.2
    on_drain_timeout: str = "stop"
    include_drained: bool = False
    #: drain decode instances with ``migrate: true``: their streams continue on other decode instances
    migrate: bool = False


@dataclass
class Outcome:
    """How a rollout ended.

    ``done``: replaced, checked and serving again; ``failed``/``step``/``reason``: where it stopped;
    ``left_drained``: the failed instance is still drained in the proxies; ``untouched``: not replaced.
    """

    done: list[str] = field(default_factory=list)
    failed: str | None = None
    step: str | None = None
    reason: str = ""
    left_drained: bool = False
    untouched: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed is None and self.step is None


class StepFailed(Exception):
    """One step failed; ``drained``: whether the instance stays drained."""

    def __init__(self, step: str, reason: str, drained: bool) -> None:
        super().__init__(reason)
        self.step, self.reason, self.drained = step, reason, drained


Say = Callable[[str], None]


class Rollout:
    """Rolls ``targets`` one at a time; ``serving`` is every instance the proxies route to (partners)."""

    def __init__(self, targets: Sequence[Target], serving: Sequence[Target], admin: ProxyAdmin, driver: Driver,
                 check: PostCheck, options: RolloutOptions, say: Say,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.targets, self.serving = list(targets), list(serving)
        self.admin, self.driver, self.check, self.options, self.say = admin, driver, check, options, say
        self.clock = clock
        self.replicas: list[str] = []
        #: The instance being rolled (for a message when the rollout is interrupted), None between instances.
        self.current: Target | None = None

    # ---- proxy admin over every replica ------------------------------------------------------
    async def _listings(self) -> dict[str, Listing]:
        return {url: await self.admin.listing(url) for url in self.replicas}

    async def _drain_all(self, name: str, drain: bool) -> None:
        for url in self.replicas:
            await self.admin.drain(url, name, drain)

    async def preflight(self) -> None:
        """Every replica answers and knows every target; no target is drained (unless include_drained)."""
        self.replicas = await self.admin.replicas()
        if not self.replicas:
            raise StepFailed("preflight", "no proxy replica to drain on", drained=False)
        listings = await self._listings()
        for url, listing in listings.items():
            unknown = [t.name for t in self.targets if not endpoints_of(listing, t.name)]
            if unknown:
                raise StepFailed("preflight", f"the proxy at {url} does not route to {', '.join(unknown)}", drained=False)
            drained = [t.name for t in self.targets if any(e.get("draining") for e in endpoints_of(listing, t.name))]
            if drained and not self.options.include_drained:
                raise StepFailed("preflight", f"{', '.join(drained)} already drained on the proxy at {url} (by an "
                                 "operator or the fault watcher); undrain first, leave it out with --instance, or "
                                 "pass --include-drained to roll it too", drained=False)

    # ---- the steps of one instance -----------------------------------------------------------
    async def drain(self, target: Target) -> None:
        try:
            if self.options.migrate and target.role == "decode":  # docs/proxy.md, admin API: drain with migrate
                for url in self.replicas:
                    await self.admin._call("POST", url, "/admin/instances/drain",  # noqa: SLF001 - the admin client's call
                                           {"name": target.name, "drain": True, "migrate": True})
            else:
                await self._drain_all(target.name, True)
        except ProxyError as exc:
            await self._restore(target)
            raise StepFailed("drain", str(exc), drained=False) from None

    async def _restore(self, target: Target) -> None:
        """Undrain an instance that was not touched (best effort: a replica that fails stays drained)."""
        try:
            await self._drain_all(target.name, False)
        except ProxyError as exc:
            self.say(f"    warning: could not undrain {target.name} again: {exc}")

    async def wait_idle(self, target: Target, prefix: str) -> None:
        opts = self.options
        start = self.clock()
        last_said: tuple[int, float] | None = None
        while True:
            try:
                listings = await self._listings()
            except ProxyError as exc:  # a busy replica may miss one poll; one that stays silent ends the wait
                if self.clock() - start < opts.drain_timeout_s:
                    self.say(f"{prefix} a proxy replica did not answer ({exc}); asking again")
                    await asyncio.sleep(opts.poll_s)
                    continue
                await self._restore(target)
                raise StepFailed("wait", f"{exc} (no answer for {opts.drain_timeout_s:g} s, --drain-timeout-s)",
                                 drained=False) from None
            inflight = sum(inflight_of(listing, target.name) for listing in listings.values())
            waited = self.clock() - start
            if inflight == 0:
                self.say(f"{prefix} no request in flight after {waited:.1f} s")
                return
            if waited >= opts.drain_timeout_s:
                if opts.on_drain_timeout == "replace":
                    self.say(f"{prefix} {inflight} request(s) still in flight after {opts.drain_timeout_s:g} s; "
                             "replacing anyway (--on-drain-timeout replace): they end with an error")
                    return
                await self._restore(target)
                raise StepFailed("wait", f"{inflight} request(s) still in flight after {opts.drain_timeout_s:g} s "
                                 "(--drain-timeout-s); the instance was not touched and serves again", drained=False)
            if last_said is None or (inflight != last_said[0] and self.clock() - last_said[1] >= 1.0):
                self.say(f"{prefix} waiting for {inflight} request(s) in flight (at most {opts.drain_timeout_s:g} s)")
                last_said = (inflight, self.clock())
            await asyncio.sleep(opts.poll_s)

    def partner_of(self, target: Target, listings: dict[str, Listing]) -> Target:
        """A serving instance of the other role that every replica routes to; under rank serving one of its
        rank endpoints that every replica routes to (name and URL as the proxies list them)."""
        other = "decode" if target.role == "prefill" else "prefill"
        for cand in self.serving:
            if cand.role != other or cand.name == target.name:
                continue
            if all(listing.get(cand.name, {}).get("routable") for listing in listings.values()):
                return cand
            rank = self._routable_rank(cand, listings)
            if rank is not None:
                return rank
        raise StepFailed("post-check", f"no routable {other} instance to run a PD round trip with", drained=True)

    @staticmethod
    def _routable_rank(cand: Target, listings: dict[str, Listing]) -> Target | None:
        """The first rank endpoint of ``cand`` every replica routes to, as a Target (None: none is)."""
        first = next(iter(listings.values()), {})
        for snap in ranks_of(first, cand.name):
            name = snap.get("name")
            if all(listing.get(name, {}).get("routable") for listing in listings.values()):
                return Target(str(name), cand.role, str(snap.get("url") or cand.url))
        return None

    def checked_endpoints(self, target: Target, listings: dict[str, Listing]) -> list[Target]:
        """What the post-check runs on: ``target`` itself, or under rank serving each of its rank endpoints
        (name and URL as the first replica lists them)."""
        first = next(iter(listings.values()), {})
        ranks = ranks_of(first, target.name)
        if not ranks:
            return [target]
        return [Target(str(snap.get("name")), target.role, str(snap.get("url") or target.url)) for snap in ranks]

    async def post_check(self, target: Target) -> str:
        try:
            listings = await self._listings()
            partner = self.partner_of(target, listings)
            endpoints = self.checked_endpoints(target, listings)
            if endpoints == [target]:
                return await self.check(target, partner)
            return "; ".join([f"{ep.name}: {await self.check(ep, partner)}" for ep in endpoints])
        except ProxyError as exc:
            raise StepFailed("post-check", str(exc), drained=True) from None
        except PostCheckFailed as exc:
            raise StepFailed("post-check", str(exc), drained=True) from None

    async def undrain(self, target: Target) -> float:
        """Undrain on every replica and wait until each routes to it; seconds waited."""
        try:
            await self._drain_all(target.name, False)
        except ProxyError as exc:
            raise StepFailed("undrain", f"{exc} (it may stay drained on some replicas)", drained=True) from None
        start = self.clock()
        while True:
            try:
                listings = await self._listings()
            except ProxyError as exc:
                raise StepFailed("undrain", str(exc), drained=False) from None
            not_yet = self._not_routable(target, listings)
            if not not_yet:
                return self.clock() - start
            if self.clock() - start >= self.options.routable_timeout_s:
                detail = "; ".join(f"{u}: {s}" for u, s in not_yet.items())
                raise StepFailed("undrain", f"undrained, but not routable after {self.options.routable_timeout_s:g} s "
                                 f"({detail})", drained=False)
            await asyncio.sleep(self.options.poll_s)

    @staticmethod
    def _not_routable(target: Target, listings: dict[str, Listing]) -> dict[str, str]:
        """Where ``target`` is not routable yet -> the proxy's status: ``url`` -> status, or under rank
        serving ``url endpoint`` -> status for each rank endpoint that is not."""
        out: dict[str, str] = {}
        for url, listing in listings.items():
            ranks = ranks_of(listing, target.name)
            if not ranks:
                view = listing.get(target.name, {})
                if not view.get("routable"):
                    out[url] = view.get("status", "unknown")
                continue
            out.update({f"{url} {snap.get('name')}": snap.get("status", "unknown") for snap in ranks
                        if not snap.get("routable")})
        return out

    # ---- the whole rollout -------------------------------------------------------------------
    async def run(self) -> Outcome:
        """Preflight, then every target in order; stops at the first failed step."""
        out = Outcome()
        n = len(self.targets)
        try:
            await self.preflight()
        except (StepFailed, ProxyError) as exc:
            out.step = "preflight"
            out.reason = exc.reason if isinstance(exc, StepFailed) else str(exc)
            out.untouched = [t.name for t in self.targets]
            return out
        self.say(f"proxy replicas: {', '.join(self.replicas)}")
        for k, target in enumerate(self.targets, 1):
            prefix = f"[{k}/{n}] {target.name}:"
            self.current = target
            try:
                self.say(f"{prefix} drain on {len(self.replicas)} proxy replica(s)")
                await self.drain(target)
                await self.wait_idle(target, prefix)
                self.say(f"{prefix} replace: {self.driver.describe(target)}")
                try:
                    detail = await self.driver.replace(target)
                except ReplaceError as exc:
                    raise StepFailed("replace", str(exc), drained=True) from None
                self.say(f"{prefix} replaced: {detail}")
                self.say(f"{prefix} post-check: {await self.post_check(target)}")
                waited = await self.undrain(target)
                self.say(f"{prefix} undrained; every replica routes to it ({waited:.1f} s)")
            except StepFailed as exc:
                out.failed, out.step, out.reason, out.left_drained = target.name, exc.step, exc.reason, exc.drained
                touched = exc.step in ("replace", "post-check", "undrain")
                out.untouched = [t.name for t in self.targets[k if touched else k - 1:]]
                self.say(f"{prefix} {exc.step} FAILED: {exc.reason}")
                return out
            out.done.append(target.name)
            self.current = None
        return out
