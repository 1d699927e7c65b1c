"""Recovery onto spares: an instance whose node fault takes the node or an NPU out moves to a spare node.

The decision lives in the fault watcher's process, in this module, beside the drains: the watcher already
holds the one fact the move needs (a fault seen and the instance drained on every proxy replica), and the
undrain after ``/health`` and a PD round trip. A separate controller would have to learn the same faults
again and share drain state with the watcher (two writers of one drain); the P:D planner only runs with
``pd_ratio: auto`` and decides capacity, not health. Placement is the planner's (``planner.plan_without``:
the faulted nodes taken out, each one's ranks handed to a spare by the placement's own rules), and the
recreation is the rollout's (``rollout/local.py`` and ``rollout/kube.py`` drivers, through an
:class:`Actuator`: ``spares_local.py``, ``spares_kube.py``).

Per faulted instance, once the watcher has drained it on every proxy replica (not one an operator had
drained before the fault: that stays the operator's), and its node shows a signal in :data:`MOVE_KINDS`:

1. **decide**: the Plan with the faulted nodes (and every node taken out before, in that order) out of
   service; the instances whose placement changed move. If an instance not on a faulted node would move, or
   no spare fits (``NoSpare``), nothing moves: the instance stays drained and waits for its node as before,
   and the Event ``AscendNoSpareNode`` says why;
2. **evacuate**: a decode instance is drained with ``migrate`` on every replica (its streams continue on the
   other decode instances, docs/proxy.md) before its group is touched;
3. **recreate** it on the spare (the actuator; bounded by ``ready_timeout_s``), and when its leader moved, tell
   every proxy replica the new URL (``POST /admin/instances/add``, then drain it again);
4. **take the node out**: cordon it (Kubernetes) and record it (a node annotation, or the local state
   directory) so a restarted watcher plans the same way, and post ``AscendInstanceMovedToSpare``;
5. the watcher's topology becomes the new Plan's, and the instance's recovery checks start at once (no
   ``--settle``: its new nodes are not the ones that flapped); when ``/health`` and the PD round trip pass the
   watcher undrains it. The time from the fault signal to that undrain is ``fault_to_serving``.

Signals that do not move an instance: ``link`` (RoCE/UBoE links flap and come back) and ``npu-resetting``
(MindCluster is resetting the chip): the drain waits for them as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from prometheus_client import Counter, Gauge, Histogram

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.config.stack import Stack
from ascend_runtime.faults.proxies import ProxyError
from ascend_runtime.faults.topology import Topology
from ascend_runtime.faults.watcher import CycleReport, FaultWatcher
from ascend_runtime.pdplanner.actuate import PlannerProxyAdmin
from ascend_runtime.planner import plan_without
from ascend_runtime.planner.plan import Plan
from ascend_runtime.planner.spares import NoSpare

log = logging.getLogger(__name__)

#: Signal kinds (faults/signals.py) that take a node or an NPU out and move its instances to spares.
MOVE_KINDS = frozenset({"npu", "npu-separated", "switch", "node-hardware", "node-not-ready", "node-gone"})
REASON_MOVED = "AscendInstanceMovedToSpare"
REASON_NO_SPARE = "AscendNoSpareNode"
REASON_MOVE_FAILED = "AscendSpareRecoveryFailed"


class RecreateError(Exception):
    """The actuator changed nothing (the message says why); the instance stays where it was, drained."""


class NotReady(Exception):
    """The instance was recreated on the spare but is not ready within the bound (the message says why)."""


@dataclass(frozen=True)
class Move:
    """One recovery: ``nodes`` taken out (after ``before``, the nodes taken out earlier), the Plans before and
    after, and the instances that move (their placement differs between the two)."""

    nodes: tuple[str, ...]
    before: tuple[str, ...]
    old: Plan
    new: Plan
    instances: tuple[str, ...]

    def spares_of(self, instance: str) -> list[str]:
        """The nodes ``instance`` gains (its spares), in rank order."""
        old = set(self.old.instance(instance).nodes)
        return [n for n in self.new.instance(instance).nodes if n not in old]

    def url_changed(self, instance: str) -> bool:
        """True when the instance's leader (its API URL) moved."""
        return self.old.instance(instance).api_url != self.new.instance(instance).api_url


class Actuator(Protocol):
    """What recreates an instance elsewhere and keeps the record of nodes taken out."""

    kind: str

    async def taken_out(self, plan: Plan) -> list[str]:
        """Nodes taken out by an earlier watcher, oldest first (to plan as it did)."""

    async def recreate(self, move: Move, instance: str) -> str:
        """Recreate ``instance`` on ``move.new``'s nodes and wait until it is ready; a one-line summary.
        Raises :class:`RecreateError` when nothing was changed, :class:`NotReady` when the change is applied but
        the instance does not serve in time."""

    async def take_out(self, move: Move, note: dict[str, Any]) -> None:
        """Cordon and record ``move.nodes`` (``note``: what moved where, for the record)."""

    async def serving(self, plan: Plan) -> None:
        """The moved instances serve again (after the undrain): make the Plan the one the stack restarts with."""


def decide(stack: Stack, plan: Plan, taken_out: Sequence[str], faulted: Sequence[str]) -> Move:
    """The move that takes ``faulted`` out of ``plan`` (which has ``taken_out`` out already).

    Raises NoSpare when a node finds no spare, ConfigError when the Plan would move an instance that has no
    rank on a faulted node (the recovery moves only the faulted instances).
    """
    new = plan_without(stack, [*taken_out, *faulted])
    moving = tuple(i.name for i in plan.all_instances if new.instance(i.name) != i)
    hit = {i.name for i in plan.all_instances if set(i.nodes) & set(faulted)}
    if set(moving) - hit:
        raise ConfigError.single("spares", f"taking {', '.join(faulted)} out would move {', '.join(sorted(set(moving) - hit))} "
                                 "too, which have no rank there", hint="add a spare node in the faulted node's super pod")
    return Move(tuple(faulted), tuple(taken_out), plan, new, moving)


class SpareMetrics:
    """The recovery's series, on the watcher's registry."""

    def __init__(self, registry: Any) -> None:
        r = registry
        self.moves = Counter("ascend_faults_spare_moves_total", "Instances moved to spare nodes, by outcome "
                             "(moved, no_spare, failed)", ["outcome"], registry=r)
        self.fault_to_serving = Histogram(
            "ascend_faults_fault_to_serving_seconds", "From the cycle that saw the fault to the moved instance "
            "undrained (serving again on spares)", buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600),
            registry=r)
        self.last_fault_to_serving = Gauge("ascend_faults_last_fault_to_serving_seconds",
                                           "The last move's fault-to-serving time", ["instance"], registry=r)
        self.migrated = Counter("ascend_faults_streams_migrated_total", "Streams the proxies moved off an instance "
                                "before it was recreated on a spare", registry=r)
        self.taken_out = Gauge("ascend_faults_nodes_taken_out", "Nodes the watcher took out of service (cordoned)",
                               registry=r)


@dataclass
class Pending:
    """A moved instance waiting for its undrain: when the fault was seen (watcher clock), what moved."""

    signal_at: float
    move: Move
    recreated_s: float
    migrated: int


@dataclass
class SpareRecovery:
    """The decision and the sequence (module docstring) for ``watcher``, whose proxies must be a
    :class:`PlannerProxyAdmin` (``add`` of a moved leader's URL)."""

    stack: Stack
    plan: Plan
    actuator: Actuator
    taken_out: list[str] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    _active: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _pending: dict[str, Pending] = field(default_factory=dict)
    _refused: dict[str, str] = field(default_factory=dict)
    metrics: SpareMetrics | None = None

    def attach(self, watcher: FaultWatcher) -> None:
        """Register the metrics on the watcher's registry."""
        self.metrics = SpareMetrics(watcher.metrics.registry)
        self.metrics.taken_out.set(len(self.taken_out))

    def candidates(self, watcher: FaultWatcher) -> dict[str, list[str]]:
        """Instance -> its faulted nodes with a moving signal, for instances drained by the watcher and idle here."""
        out: dict[str, list[str]] = {}
        for inst, d in watcher.drains.items():
            if d.drained_at is None or d.preexisting or d.recovered or inst in self._active or inst in self._pending:
                continue
            nodes = sorted(n for n in d.nodes if n not in self.taken_out
                           and any(s.kind in MOVE_KINDS for s in watcher.nodes[n].signals))
            if nodes and self._refused.get(inst) != ",".join(nodes):
                out[inst] = nodes
        return out

    async def after_cycle(self, watcher: FaultWatcher, report: CycleReport) -> None:
        """Start the moves this cycle calls for; account the moved instances the cycle undrained."""
        for inst in report.undrained:
            self._served(inst, watcher)
        for inst, nodes in self.candidates(watcher).items():
            if any(inst in m.move.instances for m in self._pending.values()):
                continue
            task = asyncio.create_task(self._recover(watcher, inst, nodes), name=f"spare-move-{inst}")
            self._active[inst] = task
            task.add_done_callback(lambda _t, i=inst: self._active.pop(i, None))

    def _served(self, inst: str, watcher: FaultWatcher) -> None:
        pending = self._pending.pop(inst, None)
        if pending is None:
            return
        took = watcher.clock() - pending.signal_at
        if self.metrics is not None:
            self.metrics.fault_to_serving.observe(took)
            self.metrics.last_fault_to_serving.labels(inst).set(took)
        self.history.append({"instance": inst, "nodes": list(pending.move.nodes), "spares": pending.move.spares_of(inst),
                             "fault_to_serving_s": round(took, 3), "recreate_s": round(pending.recreated_s, 3),
                             "migrated": pending.migrated})
        log.warning("%s serves again on spare node(s) %s, %.1f s after the fault on %s (recreated in %.1f s, %d "
                    "stream(s) migrated)", inst, ", ".join(pending.move.spares_of(inst)), took,
                    ", ".join(pending.move.nodes), pending.recreated_s, pending.migrated)
        if not self._pending:
            watcher._spawn(self.actuator.serving(self.plan))  # noqa: SLF001 - the watcher's background tasks

    async def _recover(self, watcher: FaultWatcher, inst: str, faulted: list[str]) -> None:
        d = watcher.drains[inst]
        signal_at = d.signal_at
        try:
            move = decide(self.stack, self.plan, self.taken_out, faulted)
        except (NoSpare, ConfigError) as exc:
            why = exc.problem.message if isinstance(exc, NoSpare) else str(exc)
            self._refused[inst] = ",".join(faulted)
            self._count("no_spare")
            log.error("%s cannot move off %s: %s; it stays drained until its node is clear", inst, ", ".join(faulted), why)
            for node in faulted:
                await watcher._event(node, REASON_NO_SPARE, "Warning",  # noqa: SLF001 - the watcher's Event writer
                                     f"{inst} stays drained on {node}: no spare node takes its place ({why})")
            return
        log.warning("moving %s off %s: %s", ", ".join(move.instances), ", ".join(faulted),
                    "; ".join(f"{i} -> {', '.join(move.spares_of(i))}" for i in move.instances))
        migrated = await self._evacuate(watcher, move)
        start = time.monotonic()
        summaries = []
        try:
            for name in move.instances:
                summaries.append(await self.actuator.recreate(move, name))
        except RecreateError as exc:
            self._count("failed")
            log.error("recreating %s on spares changed nothing: %s; it stays drained", inst, exc)
            for node in faulted:
                await watcher._event(node, REASON_MOVE_FAILED, "Warning",  # noqa: SLF001
                                     f"{inst} not moved off {node}: {exc}")
            self._refused[inst] = ",".join(faulted)
            return
        except NotReady as exc:  # applied: the recovery checks judge it from here
            summaries.append(f"not ready yet ({exc})")
            log.error("%s recreated on spares but not ready: %s; the recovery checks go on", inst, exc)
        took = time.monotonic() - start
        await self._tell_proxies(watcher, move)
        self._adopt(watcher, move)
        for name in move.instances:
            if name in watcher.drains:  # a flexible group's standby shape is placed, never drained or served
                self._pending[name] = Pending(signal_at, move, took, migrated)
        self._count("moved", len(move.instances))
        note = {"at": round(time.time(), 3), "instances": {i: move.spares_of(i) for i in move.instances}}
        try:
            await self.actuator.take_out(move, note)
        except Exception as exc:  # noqa: BLE001 - the move stands; the record is retried by hand (docs/faults.md)
            log.error("recording %s as taken out failed: %s", ", ".join(move.nodes), exc)
        text = "; ".join(f"{i} moved to {', '.join(move.spares_of(i))}" for i in move.instances)
        for node in move.nodes:
            await watcher._event(node, REASON_MOVED, "Warning",  # noqa: SLF001
                                 f"{node} taken out of service ({self.actuator.kind}: cordoned and recorded): {text}; "
                                 f"recreated in {took:.1f} s ({'; '.join(summaries)}); {migrated} stream(s) migrated; "
                                 "undrained after /health and a PD round trip")

    async def _evacuate(self, watcher: FaultWatcher, move: Move) -> int:
        """Drain the moving decode instances with ``migrate`` on every replica; streams moved."""
        proxies = watcher.proxies
        if not isinstance(proxies, PlannerProxyAdmin):
            return 0
        moved = 0
        for name in move.instances:
            if move.old.instance(name).role != "decode":
                continue
            for url in await proxies.replicas():
                try:
                    moved += await proxies.evacuate(url, name)
                except (ProxyError, aiohttp.ClientError) as exc:
                    log.warning("migrating the streams of %s on %s: %s", name, url, exc)
        if self.metrics is not None and moved:
            self.metrics.migrated.inc(moved)
        return moved

    async def _tell_proxies(self, watcher: FaultWatcher, move: Move) -> None:
        """Every replica that routes to a moved instance learns its leader's new URL (``add`` undrains, so it is
        drained again at once); a replica that does not know it (a flexible group's standby shape) is left alone."""
        proxies = watcher.proxies
        moved = [n for n in move.instances if move.url_changed(n)]
        if not moved or not isinstance(proxies, PlannerProxyAdmin):
            return
        for url in await proxies.replicas():
            try:
                known = await proxies.listing(url)
                for name in (n for n in moved if n in known):
                    inst = move.new.instance(name)
                    await proxies.add(url, [{"name": name, "role": inst.role, "url": inst.api_url}])
                    await proxies.drain(url, name, True)
            except (ProxyError, aiohttp.ClientError) as exc:
                log.warning("telling %s the new URLs of %s: %s", url, ", ".join(moved), exc)

    def _adopt(self, watcher: FaultWatcher, move: Move) -> None:
        """The watcher works from the new Plan; the moved instances' checks start now (no await in here)."""
        self.plan = move.new
        self.taken_out = [*self.taken_out, *(n for n in move.nodes if n not in self.taken_out)]
        watcher.topology = Topology.from_plan(move.new)
        for name, st in watcher.nodes.items():
            st.role = watcher.topology.node_role(name)
        now = watcher.clock()
        for name in move.instances:
            d = watcher.drains.get(name)
            inst = move.new.instance(name)
            watcher._instance_urls[name] = inst.api_url  # noqa: SLF001 - until the next listing says the same
            if d is not None:
                d.nodes = set(inst.nodes)
                d.clear_since = now - watcher.config.settle_s
                d.next_check_at = 0.0
        if self.metrics is not None:
            self.metrics.taken_out.set(len(self.taken_out))

    def _count(self, outcome: str, n: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.moves.labels(outcome).inc(n)

    def status(self) -> dict[str, Any]:
        """JSON view: nodes taken out, moves under way and waiting for their undrain, done."""
        return {"taken_out": list(self.taken_out), "moving": sorted(self._active), "waiting_undrain": sorted(self._pending),
                "refused": dict(self._refused), "done": list(self.history[-20:])}

    async def close(self) -> None:
        """Cancel moves under way (their instances stay drained)."""
        for task in list(self._active.values()):
            task.cancel()
        if self._active:
            await asyncio.wait(list(self._active.values()), timeout=2.0)


class RecoveringWatcher(FaultWatcher):
    """:class:`FaultWatcher` whose every cycle ends with the recovery onto spares (``spares``)."""

    def __init__(self, *args: Any, spares: SpareRecovery, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spares = spares
        spares.attach(self)

    async def run_cycle(self) -> CycleReport:
        report = await super().run_cycle()
        await self.spares.after_cycle(self, report)
        return report

    def status(self) -> dict[str, Any]:
        return {**super().status(), "spare_recovery": self.spares.status()}

    async def close(self) -> None:
        await self.spares.close()
        await super().close()
