"""The fault watcher: MindCluster fault signals of the Plan's nodes -> drains in every proxy replica.

Every ``interval_s`` (default 1 s) one cycle:

1. reads, for every node of the topology and concurrently, the device plugin's
   ``mindx-dl-deviceinfo-<node>`` and NodeD's ``mindx-dl-nodeinfo-<node>``
   ConfigMaps, and every ``node_interval_s`` the Node object
   (:mod:`ascend_runtime.faults.signals`). A failed read keeps that source's
   last known state; it never clears a fault;
   For every fault source the topology expects (``Topology.expected_sources``),
   it also checks that the source is alive on each node: its DaemonSet pod
   running and ready (listed every ``node_interval_s``), and the device
   plugin's ConfigMap present and fresh (:mod:`ascend_runtime.faults.sources`).
   A failed source is no fault: the node's instances stay routable, flagged in
   the metrics, ``/healthz`` and an Event;
2. maps each faulted node to the instances with a rank on it (a spare node
   maps to none) and reconciles every proxy replica: ``GET /admin/instances``,
   then ``POST /admin/instances/drain`` wherever an instance the watcher keeps
   drained is not draining. A new fault is drained in the cycle that first
   sees it; a replica that restarted, or another actor's undrain, is corrected
   in the next cycle;
3. posts a Kubernetes Event on the node (after the drain, off the critical
   path) with the signals, what was drained where, and how fast;
4. for a drained instance whose nodes have been clear for ``settle_s``, runs
   the recovery checks in the background (leader ``/health`` and a direct PD
   round trip, :mod:`ascend_runtime.faults.recovery`), every ``recheck_s``
   until they pass; then the instance is undrained on every replica.

Only drains the watcher made are undone: an instance that was already drained
on every replica when its fault arrived (an operator's maintenance) stays
drained after recovery. A drained instance keeps serving the requests it has;
the proxy only stops sending it new ones (``InstancePool.drain``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp import web

from ascend_runtime.eventloop import run_every
from ascend_runtime.faults import signals as sig
from ascend_runtime.faults import sources as src
from ascend_runtime.faults.kube import KubeClient, KubeError
from ascend_runtime.faults.metrics import FaultMetrics
from ascend_runtime.faults.proxies import ProxyAdmin, ProxyError
from ascend_runtime.faults.recovery import (
    Endpoint,
    RecoveryCheckFailed,
    check_health,
    pd_round_trip,
)
from ascend_runtime.faults.topology import OUT_OF_SERVICE, Topology
from ascend_runtime.metrics_server import start_metrics_server

log = logging.getLogger(__name__)

COMPONENT = "ascend-fault-watcher"
#: Event reasons (the watcher's own; ``type`` Warning except FaultRecovered).
REASON_DRAINED = "AscendFaultDrained"
REASON_DRAIN_FAILED = "AscendFaultDrainFailed"
REASON_SPARE = "AscendSpareNodeFaulted"
REASON_RECOVERED = "AscendFaultRecovered"
REASON_RECOVERY_FAILED = "AscendRecoveryCheckFailed"
REASON_SOURCE_FAILED = "AscendFaultSourceFailed"
REASON_SOURCE_BACK = "AscendFaultSourceRecovered"
SOURCES = ("device-plugin", "noded", "node")


@dataclass
class WatcherConfig:
    """Times are seconds. ``event_namespace`` None: no Events; ``noded_namespace`` None: NodeD not read."""

    interval_s: float = 1.0
    node_interval_s: float = 5.0
    settle_s: float = 10.0
    recheck_s: float = 5.0
    check_timeout_s: float = 30.0
    event_namespace: str | None = None
    device_plugin_namespace: str = sig.DEVICE_INFO_NAMESPACE
    noded_namespace: str | None = sig.NODE_INFO_NAMESPACE
    read_nodes: bool = True
    #: A device plugin ConfigMap whose UpdateTime is older (seconds) is a failed source (sources.py).
    stale_after_s: float = src.STALE_AFTER_S
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    reporting_instance: str = field(default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname())


@dataclass
class NodeState:
    """What the last reads said about one node, per source."""

    name: str
    role: str
    sources: dict[str, list[sig.Signal]] = field(default_factory=dict)
    faulted_since: float | None = None
    noded_status: str = "Healthy"
    uid: str | None = None
    errors: dict[str, str] = field(default_factory=dict)  # source -> last read error (logged once)
    #: (source, reason) -> why an expected fault source is not alive here (pods and ConfigMaps, sources.py)
    failures: dict[tuple[str, str], src.SourceFailure] = field(default_factory=dict)

    @property
    def signals(self) -> list[sig.Signal]:
        return [s for name in SOURCES for s in self.sources.get(name, [])]

    def set_failures(self, reasons: tuple[str, ...], found: list[src.SourceFailure], source: str) -> None:
        """Replace the failures of ``source`` with one of ``reasons`` by ``found``."""
        for key in [k for k in self.failures if k[0] == source and k[1] in reasons]:
            del self.failures[key]
        self.failures.update({(f.source, f.reason): f for f in found})

    @property
    def faulted(self) -> bool:
        return bool(self.signals)


@dataclass
class Drain:
    """An instance the watcher keeps drained."""

    instance: str
    role: str
    nodes: set[str]
    signal_at: float
    preexisting: bool | None = None  # None: not yet known (no replica listing seen)
    drained_at: float | None = None
    clear_since: float | None = None
    recovered: bool = False
    recovery: asyncio.Task[str] | None = None
    next_check_at: float = 0.0
    last_failure: str = ""
    recovery_summary: str = ""


@dataclass
class CycleReport:
    """What one cycle saw and did (for logs, tests and ``/healthz``)."""

    cycle: int
    faulted: list[str]
    newly_faulted: list[str]
    cleared: list[str]
    drained: list[str]
    undrained: list[str]
    replicas: list[str]


class FaultWatcher:
    """Watches ``topology``'s nodes through ``kube`` and drains through ``proxies``."""

    def __init__(self, topology: Topology, kube: KubeClient, proxies: ProxyAdmin, config: WatcherConfig,
                 session: aiohttp.ClientSession, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.topology, self.kube, self.proxies, self.config = topology, kube, proxies, config
        self.session, self.clock, self.wall_clock = session, clock, wall_clock
        self.metrics = FaultMetrics()
        self.nodes = {n: NodeState(n, topology.node_role(n)) for n in topology.nodes}
        self.drains: dict[str, Drain] = {}
        self.cycles = 0
        self.last_cycle_at: float | None = None
        self.history: list[CycleReport] = []
        self._last_node_read: float | None = None
        self._instance_urls: dict[str, str] = {}
        self._routable: dict[str, bool] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._failed: set[tuple[str, str, str]] = set()  # (node, source, reason) seen failed in the last cycle
        self.expected = self.expected_sources()
        spares = topology.spares
        log.info("watching %d nodes of stack %s (%d instances); spare nodes (unused by the Plan): %s",
                 len(self.nodes), topology.stack, len(topology.instances), ", ".join(spares) or "none")

    # ---- reading ---------------------------------------------------------------------------
    def expected_sources(self) -> dict[str, src.DaemonSetSource]:
        """The fault sources checked for liveness: the topology's, in the namespaces this watcher reads them in
        (a source it does not read, ``--no-noded``, is not checked)."""
        namespaces = {src.DEVICE_PLUGIN: self.config.device_plugin_namespace, src.NODED: self.config.noded_namespace}
        return {name: dataclasses.replace(src.DAEMONSETS[name], namespace=namespaces[name])
                for name in self.topology.expected_sources if namespaces.get(name)}

    def _judge_device_info(self, state: NodeState, cm: dict[str, Any] | None) -> None:
        """Freshness of the device plugin's ConfigMap, where the plugin is expected (sources.py)."""
        if cm is not None and (written := src.device_info_update_time(cm)) is not None:
            self.metrics.device_info_age.labels(state.name).set(max(0.0, self.wall_clock() - written))
        if src.DEVICE_PLUGIN not in self.expected:
            return
        failure = src.configmap_failure(cm, state.name, self.wall_clock(), self.config.stale_after_s)
        state.set_failures(src.CONFIGMAP_REASONS, [failure] if failure else [], src.DEVICE_PLUGIN)

    async def read_pods(self) -> None:
        """List each expected source's DaemonSet pods; judge every node by them. A failed list keeps the last state."""
        for name, ds in self.expected.items():
            try:
                pods = src.pods_by_node(await self.kube.list_pods(ds.namespace, ds.selector))
            except KubeError as exc:
                self.metrics.read_errors.labels(f"{name}-pods").inc()
                log.warning("listing the %s pods (%s, %s): %s (keeping the last known state)",
                            name, ds.namespace, ds.selector, exc)
                continue
            for st in self.nodes.values():
                failure = src.pod_failure(ds, pods.get(st.name, []), st.name)
                st.set_failures(src.POD_REASONS, [failure] if failure else [], name)

    async def _read_source(self, state: NodeState, source: str) -> None:
        cfg, name = self.config, state.name
        try:
            if source == "device-plugin":
                cm = await self.kube.get_configmap(cfg.device_plugin_namespace, sig.device_info_name(name))
                state.sources[source] = sig.device_plugin_signals(cm, self.topology.npu_resource)
                self._judge_device_info(state, cm)
            elif source == "noded":
                assert cfg.noded_namespace is not None
                cm = await self.kube.get_configmap(cfg.noded_namespace, sig.node_info_name(name))
                state.sources[source], state.noded_status = sig.noded_signals(cm)
            else:
                node = await self.kube.get_node(name)
                if node is not None:
                    state.uid = (node.get("metadata") or {}).get("uid") or state.uid
                state.sources[source] = sig.node_signals(node, name)
        except (KubeError, sig.SignalFormatError) as exc:
            self.metrics.read_errors.labels(source).inc()
            if state.errors.get(source) != str(exc):
                log.warning("reading %s of node %s: %s (keeping the last known state)", source, name, exc)
            state.errors[source] = str(exc)
            return
        if state.errors.pop(source, None) is not None:
            log.info("reading %s of node %s works again", source, name)

    async def read_all(self, now: float) -> None:
        """One read of every source of every node, concurrently; Node objects and the sources' pods every
        ``node_interval_s``."""
        due = self._last_node_read is None or now - self._last_node_read >= self.config.node_interval_s
        with_nodes = self.config.read_nodes and due
        sources = ["device-plugin"] + (["noded"] if self.config.noded_namespace else []) + (["node"] if with_nodes else [])
        pods = [self.read_pods()] if due and self.expected else []
        await asyncio.gather(*(self._read_source(st, name) for st in self.nodes.values() for name in sources), *pods)
        if due:
            self._last_node_read = now

    # ---- one cycle ---------------------------------------------------------------------------
    async def run_cycle(self) -> CycleReport:
        now = self.clock()
        self.cycles += 1
        await self.read_all(now)
        newly, cleared = [], []
        for st in self.nodes.values():
            if st.faulted and st.faulted_since is None:
                st.faulted_since = now
                newly.append(st.name)
                log.warning("fault on node %s (%s): %s", st.name, st.role,
                            "; ".join(s.describe() for s in st.signals))
            elif not st.faulted and st.faulted_since is not None:
                st.faulted_since = None
                cleared.append(st.name)
                log.info("node %s: fault signals cleared", st.name)
        wanted: dict[str, set[str]] = {}
        for st in self.nodes.values():
            if st.faulted:
                for inst in self.topology.instances_on(st.name):
                    wanted.setdefault(inst, set()).add(st.name)
        for inst, nodes in wanted.items():
            d = self.drains.get(inst)
            since = min(self.nodes[n].faulted_since or now for n in nodes)
            if d is None:
                self.drains[inst] = Drain(inst, self.topology.role(inst), set(nodes), since)
            else:
                d.nodes, d.clear_since, d.recovered, d.next_check_at = set(nodes), None, False, 0.0
                if d.recovery is not None:
                    d.recovery.cancel()
                    d.recovery = None
        for inst, d in self.drains.items():
            if inst not in wanted and d.clear_since is None:
                d.clear_since = now
        self._collect_recoveries(wanted)
        self._report_source_changes()
        replicas = await self.proxies.replicas()
        self.metrics.proxy_replicas.set(len(replicas))
        drained, undrained = await self.reconcile(replicas)
        for node in newly:
            self._spawn(self._node_event(node, len(replicas)))
        self._start_recoveries()
        self._update_metrics()
        self.last_cycle_at = time.time()
        self.metrics.cycles.inc()
        self.metrics.last_cycle.set(self.last_cycle_at)
        report = CycleReport(self.cycles, sorted(n for n, s in self.nodes.items() if s.faulted), newly, cleared,
                             drained, undrained, replicas)
        self.history.append(report)
        del self.history[:-100]
        return report

    async def reconcile(self, replicas: list[str]) -> tuple[list[str], list[str]]:
        """Make every replica's drain state match :attr:`drains`; returns (newly drained, undrained) instances."""
        listings = await asyncio.gather(*(self._listing(url) for url in replicas))
        answered = [(url, lst) for url, lst in zip(replicas, listings) if lst is not None]
        for _, lst in answered:
            for name, snap in lst.items():
                self._instance_urls[name] = str(snap.get("url") or self._instance_urls.get(name, ""))
                self._routable[name] = bool(snap.get("routable"))
        calls: list[tuple[str, str, bool]] = []
        pending: dict[str, list[str]] = {}
        for inst, d in self.drains.items():
            knowing = [(url, lst[inst]) for url, lst in answered if inst in lst]
            if d.preexisting is None and knowing:
                d.preexisting = all(bool(s.get("draining")) for _, s in knowing)
                if d.preexisting:
                    log.info("%s was already drained on every replica; it stays drained after recovery", inst)
            want = not d.recovered or bool(d.preexisting)
            for url, snap in knowing:
                if bool(snap.get("draining")) != want:
                    calls.append((url, inst, want))
                    pending.setdefault(inst, []).append(url)
            if not knowing and answered:
                log.warning("instance %s is unknown to every proxy replica that answered (%d)", inst, len(answered))
        results = await asyncio.gather(*(self._drain(url, inst, want) for url, inst, want in calls))
        failed = {(url, inst) for (url, inst, _), ok in zip(calls, results) if not ok}
        drained, undrained = [], []
        done = self.clock()
        for inst, d in list(self.drains.items()):
            knows = any(inst in lst for _, lst in answered)
            ok = knows and not any((url, inst) in failed for url in pending.get(inst, []))
            if not ok:
                continue
            if not d.recovered:
                if d.drained_at is None:
                    d.drained_at = done
                    took = done - d.signal_at
                    if d.preexisting:
                        continue  # drained by someone else before the fault: not a drain of the watcher's
                    self.metrics.signal_to_drain.observe(took)
                    self.metrics.last_signal_to_drain.labels(inst).set(took)
                    self.metrics.drains.labels(inst).inc()
                    drained.append(inst)
                    log.warning("drained %s on %d proxy replicas, %.3f s after the fault signal (nodes %s); "
                                "healthy spare nodes for its group: %s", inst, len(answered), took,
                                ", ".join(sorted(d.nodes)), ", ".join(self.healthy_spares()) or "none")
            else:
                del self.drains[inst]
                if d.preexisting:
                    log.info("%s recovered (%s); left drained as it was before the fault", inst, d.recovery_summary)
                else:
                    undrained.append(inst)
                    self.metrics.undrains.labels(inst).inc()
                    log.info("%s back in rotation on %d proxy replicas (%s)", inst, len(answered), d.recovery_summary)
                self._spawn(self._recovered_event(d, len(answered)))
        return drained, undrained

    async def _listing(self, url: str) -> dict[str, dict[str, Any]] | None:
        try:
            return await self.proxies.listing(url)
        except ProxyError as exc:
            self.metrics.proxy_errors.labels(url).inc()
            log.warning("proxy replica %s: %s", url, exc)
            return None

    async def _drain(self, url: str, inst: str, drain: bool) -> bool:
        try:
            await self.proxies.drain(url, inst, drain)
            return True
        except ProxyError as exc:
            self.metrics.proxy_errors.labels(url).inc()
            log.warning("%s %s on %s: %s", "drain" if drain else "undrain", inst, url, exc)
            return False

    # ---- fault sources ------------------------------------------------------------------------
    def _report_source_changes(self) -> None:
        """Log and post an Event for every source that failed or came back on a node since the last cycle."""
        now = {(st.name, f.source, f.reason): f for st in self.nodes.values() for f in st.failures.values()}
        for key in sorted(now.keys() - self._failed):
            node, failure = key[0], now[key]
            insts = self.topology.instances_on(node)
            kept = (f"{', '.join(insts)} stay{'s' if len(insts) == 1 else ''} routable, unwatched by this source"
                    if insts else "no instance runs there")
            log.warning("fault source failed on node %s: %s; %s", node, failure.describe(), kept)
            self._spawn(self._event(node, REASON_SOURCE_FAILED, "Warning",
                                    f"fault source {failure.source} is not alive on {node}: {failure.reason} "
                                    f"({failure.detail}); its faults cannot be seen here, nothing is drained for this: "
                                    f"{kept}. See docs/faults.md, Fault sources"))
        for node, source, reason in sorted(self._failed - now.keys()):
            log.info("fault source %s on node %s is alive again (was %s)", source, node, reason)
            self._spawn(self._event(node, REASON_SOURCE_BACK, "Normal",
                                    f"fault source {source} is alive on {node} again (was {reason})"))
        self._failed = set(now)

    def unwatched(self) -> dict[str, list[str]]:
        """Instances with a rank on a node where an expected source failed -> those nodes' failures."""
        out: dict[str, list[str]] = {}
        for st in self.nodes.values():
            for inst in self.topology.instances_on(st.name) if st.failures else ():
                out.setdefault(inst, []).extend(f"{st.name}: {f.describe()}" for f in st.failures.values())
        return out

    # ---- recovery -----------------------------------------------------------------------------
    def _collect_recoveries(self, wanted: dict[str, set[str]]) -> None:
        now = self.clock()
        for inst, d in self.drains.items():
            task = d.recovery
            if task is None or not task.done():
                continue
            d.recovery = None
            if inst in wanted or task.cancelled():
                continue
            exc = task.exception()
            if exc is None:
                d.recovered, d.recovery_summary = True, task.result()
                self.metrics.recovery_checks.labels(inst, "passed").inc()
                log.info("%s passed the recovery checks: %s", inst, d.recovery_summary)
                continue
            reason = str(exc) if isinstance(exc, RecoveryCheckFailed) else f"{type(exc).__name__}: {exc}"
            self.metrics.recovery_checks.labels(inst, "failed").inc()
            d.next_check_at = now + self.config.recheck_s
            log.warning("%s stays drained: %s (next check in %g s)", inst, reason, self.config.recheck_s)
            if reason != d.last_failure:
                d.last_failure = reason
                for node in sorted(d.nodes):
                    self._spawn(self._event(node, REASON_RECOVERY_FAILED, "Warning",
                                            f"{inst} stays drained: fault signals on {node} cleared but {reason}"))

    def _start_recoveries(self) -> None:
        now = self.clock()
        for d in self.drains.values():
            if (d.clear_since is None or d.recovered or d.recovery is not None
                    or now - d.clear_since < self.config.settle_s or now < d.next_check_at):
                continue
            d.recovery = asyncio.create_task(self.recovery_checks(d.instance))

    async def recovery_checks(self, inst: str) -> str:
        """The leader's /health, then a PD round trip with a routable partner of the other role."""
        url = self._instance_urls.get(inst)
        if not url:
            raise RecoveryCheckFailed(f"{inst}: no proxy replica lists its URL")
        me = Endpoint(inst, url)
        await check_health(self.session, me, self.config.check_timeout_s)
        role = self.topology.role(inst)
        other = "decode" if role == "prefill" else "prefill"
        partners = sorted(n for n, (r, _) in self.topology.instances.items()
                          if r == other and n not in self.drains and self._routable.get(n) and self._instance_urls.get(n))
        if not partners:
            raise RecoveryCheckFailed(f"{inst}: no routable {other} instance to run a PD round trip with")
        partner = Endpoint(partners[0], self._instance_urls[partners[0]])
        prefill, decode = (me, partner) if role == "prefill" else (partner, me)
        return await pd_round_trip(self.session, prefill, decode, self.config.check_timeout_s)

    # ---- events -----------------------------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _node_event(self, node: str, replicas: int) -> None:
        st = self.nodes[node]
        what = "; ".join(s.describe() for s in st.signals)
        insts = self.topology.instances_on(node)
        if not insts:
            await self._event(node, REASON_SPARE, "Warning",
                              f"fault on spare node {node} (no instance of the Plan runs there): {what}; nothing drained")
            return
        parts, failed = [], []
        for inst in insts:
            d = self.drains.get(inst)
            if d is not None and d.drained_at is not None and d.preexisting:
                parts.append(f"{inst} was already drained on every proxy replica")
            elif d is not None and d.drained_at is not None:
                parts.append(f"{inst} drained on {replicas} proxy replicas in {d.drained_at - d.signal_at:.2f} s")
            else:
                failed.append(inst)
        health = []
        for inst in insts:
            url = self._instance_urls.get(inst)
            if url:
                try:
                    await check_health(self.session, Endpoint(inst, url), 2.0)
                    health.append(f"{inst} leader /health ok")
                except RecoveryCheckFailed as exc:
                    health.append(str(exc))
        spares = ", ".join(self.healthy_spares()) or "none"
        text = f"fault on node {node}: {what}. " + "; ".join(parts)
        if failed:
            text += ("; " if parts else "") + f"NOT drained (no proxy replica confirmed): {', '.join(failed)}"
        text += f". {'; '.join(health)}. Healthy spare nodes: {spares}"
        await self._event(node, REASON_DRAIN_FAILED if failed else REASON_DRAINED, "Warning", text)

    async def _recovered_event(self, d: Drain, replicas: int) -> None:
        kept = " (it was drained before the fault and stays drained)" if d.preexisting else f" on {replicas} proxy replicas"
        for node in sorted(d.nodes):
            await self._event(node, REASON_RECOVERED, "Normal",
                              f"fault signals on {node} cleared; {d.instance} passed recovery checks "
                              f"({d.recovery_summary}) and is undrained{kept}")

    def event_body(self, node: str, reason: str, etype: str, message: str) -> dict[str, Any]:
        """A core/v1 Event about ``node`` (involved object: the Node)."""
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ref: dict[str, Any] = {"apiVersion": "v1", "kind": "Node", "name": node}
        uid = self.nodes[node].uid if node in self.nodes else None
        if uid:
            ref["uid"] = uid
        return {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{node}.{time.time_ns():x}", "namespace": self.config.event_namespace},
            "involvedObject": ref, "reason": reason, "message": message[:1024], "type": etype,
            "source": {"component": COMPONENT}, "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "reportingComponent": COMPONENT, "reportingInstance": self.config.reporting_instance[:128],
        }

    async def _event(self, node: str, reason: str, etype: str, message: str) -> None:
        if not self.config.event_namespace:
            return
        try:
            await self.kube.create_event(self.config.event_namespace, self.event_body(node, reason, etype, message))
            self.metrics.events.labels(reason, "posted").inc()
        except KubeError as exc:
            self.metrics.events.labels(reason, "failed").inc()
            log.warning("event %s on node %s not posted: %s", reason, node, exc)

    # ---- state ------------------------------------------------------------------------------
    def healthy_spares(self) -> list[str]:
        return [n for n in self.topology.spares if not self.nodes[n].faulted]

    def _update_metrics(self) -> None:
        m = self.metrics
        for role in ("prefill", "decode", "spare", OUT_OF_SERVICE):
            m.faulted_nodes.labels(role).set(sum(1 for s in self.nodes.values() if s.role == role and s.faulted))
        m.node_faulted.clear()
        for st in self.nodes.values():
            for kind in sorted({s.kind for s in st.signals}):
                m.node_faulted.labels(st.name, st.role, kind).set(1)
        m.source_failed.clear()
        for st in self.nodes.values():
            for f in st.failures.values():
                m.source_failed.labels(st.name, st.role, f.source, f.reason).set(1)
        m.instance_unwatched.clear()
        for inst in self.unwatched():
            m.instance_unwatched.labels(inst, self.topology.role(inst)).set(1)
        m.drained_instances.set(len(self.drains))
        m.instance_drained.clear()
        for inst, d in self.drains.items():
            m.instance_drained.labels(inst, d.role).set(1)
        spares = self.topology.spares
        healthy = len(self.healthy_spares())
        m.spare_nodes.labels("healthy").set(healthy)
        m.spare_nodes.labels("faulted").set(len(spares) - healthy)

    def status(self) -> dict[str, Any]:
        """JSON view for ``/healthz`` and logs."""
        now = self.clock()
        return {
            "cycles": self.cycles,
            "faulted_nodes": {n: [s.describe() for s in st.signals] for n, st in self.nodes.items() if st.faulted},
            "drained": {i: {"nodes": sorted(d.nodes), "recovered": d.recovered,
                            "drained_s_after_signal": None if d.drained_at is None else round(d.drained_at - d.signal_at, 3),
                            "clear_for_s": None if d.clear_since is None else round(now - d.clear_since, 1),
                            "last_failure": d.last_failure} for i, d in self.drains.items()},
            "spares": {n: not self.nodes[n].faulted for n in self.topology.spares},
            "failed_sources": {n: [f.describe() for f in st.failures.values()]
                               for n, st in self.nodes.items() if st.failures},
            "unwatched_instances": self.unwatched(),
        }

    # ---- running ----------------------------------------------------------------------------
    async def _serve_metrics(self) -> web.AppRunner | None:
        if self.config.metrics_port is None:
            return None
        stale_after = max(3 * self.config.interval_s, 10.0) + 2 * self.kube.timeout.total  # type: ignore[operator]

        async def healthz(_: web.Request) -> web.Response:
            fresh = self.last_cycle_at is not None and time.time() - self.last_cycle_at < stale_after
            return web.json_response({"ok": fresh, **self.status()}, status=200 if fresh else 503)

        return await start_metrics_server(self.metrics.registry, self.config.metrics_host, self.config.metrics_port,
                                          healthz)

    async def run(self, stop: asyncio.Event | None = None, max_cycles: int | None = None) -> None:
        """Cycle every ``interval_s`` until ``stop`` is set (or ``max_cycles`` ran)."""
        stop = stop or asyncio.Event()
        runner = await self._serve_metrics()
        try:
            await run_every(self.config.interval_s, self.run_cycle, stop, max_cycles,
                            lambda _: log.exception("fault watch cycle failed"))
        finally:
            await self.close()
            if runner is not None:
                await runner.cleanup()

    async def close(self) -> None:
        """Cancel recovery checks; give pending Events a moment to be posted."""
        for d in self.drains.values():
            if d.recovery is not None:
                d.recovery.cancel()
        if self._background:
            await asyncio.wait(list(self._background), timeout=2.0)
