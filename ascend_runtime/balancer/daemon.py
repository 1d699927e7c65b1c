"""The balancing daemon: collect -> forecast -> plan -> validate -> publish -> roll out.

Every ``interval_s``:

1. each instance's source returns the expert load routed since the last
   cycle; the windows are summed (one model, one map for all instances);
2. the sum is folded into a :class:`LoadForecaster` (exponential decay);
3. once ``min_windows`` windows were seen, :func:`plan_placement` plans against
   the map in service; it keeps that map unless the forecast balancedness
   gains at least ``min_gain``;
4. a new map is validated and published atomically (file or ConfigMap), then
   applied to one instance at a time; a failed apply stops the rollout (the
   rest keep the old, still valid map) and is retried next cycle.

``dry_run`` does 1-3 and reports, but never publishes or applies. Prometheus
metrics are served on ``metrics_port`` (``/metrics``), with ``/healthz``.

Python API for launchers: :func:`start_in_thread` (in-process, returns a
handle with ``stop()``) and :func:`start_process` (a child ``ascend-deploy
balance serve`` process).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
)

from ascend_runtime.balancer.apply import Applier
from ascend_runtime.balancer.expert_map import (
    map_to_placement,
    placement_to_map,
    validate_map,
)
from ascend_runtime.balancer.forecast import LoadForecaster
from ascend_runtime.balancer.measure import balancedness
from ascend_runtime.balancer.placement import PlacementConfig, plan_placement
from ascend_runtime.balancer.publish import Publisher
from ascend_runtime.balancer.sources import LoadSource
from ascend_runtime.eventloop import run_every
from ascend_runtime.metrics_server import start_metrics_server

log = logging.getLogger(__name__)

#: cycle records the daemon keeps (``Balancer.history``); older ones are dropped
HISTORY_CYCLES = 256


@dataclass
class Instance:
    """One engine instance: where its load comes from and how a map reaches it."""

    name: str
    source: LoadSource
    applier: Applier
    #: "prefill", "decode" or "" (unknown): the ``stage`` label of the heat metrics
    stage: str = ""

    def __post_init__(self) -> None:
        if not self.stage:
            self.stage = next((s for s in ("prefill", "decode") if s in self.name), "")


@dataclass
class BalancerConfig:
    """Daemon settings. ``ranks``/``slots`` are the EP shape every instance shares."""

    num_experts: int
    ranks: int
    slots: int
    groups: int | None = None
    nodes: int | None = None
    interval_s: float = 30.0
    decay: float | None = None  # weight of the newest window; None = adaptive
    min_windows: int = 2
    min_tokens: float = 1.0  # ignore a cycle with fewer routed tokens per layer
    dry_run: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics server (registry still updated)
    placement: PlacementConfig = field(default_factory=PlacementConfig)


class BalancerMetrics:
    """Prometheus metrics on a private registry (several daemons per process are fine)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.balancedness = Gauge(
            "ascend_balancer_balancedness", "Forecast balancedness (vLLM definition) of the map in service (before) and of the planned map (after)",
            ["phase"], registry=r,
        )
        self.observed = Gauge("ascend_balancer_observed_balancedness", "Balancedness of the last collected window under the map in service", registry=r)
        self.moves = Gauge("ascend_balancer_last_moved_slots", "Slots that changed expert in the last published map", registry=r)
        self.moves_total = Counter("ascend_balancer_moved_slots", "Slots changed by all published maps", registry=r)
        self.rebalances = Counter("ascend_balancer_rebalances", "Maps published", registry=r)
        self.last_rebalance = Gauge("ascend_balancer_last_rebalance_timestamp_seconds", "Unix time of the last published map", registry=r)
        self.cycles = Counter("ascend_balancer_cycles", "Balancing cycles run", ["outcome"], registry=r)
        self.source_errors = Counter("ascend_balancer_source_errors", "Failed load collections", ["instance"], registry=r)
        self.apply_failures = Counter("ascend_balancer_apply_failures", "Failed map applications", ["instance"], registry=r)
        self.dry_run = Gauge("ascend_balancer_dry_run", "1 when the daemon only plans and reports", registry=r)
        # fleet-wide expert heat, per instance (every instance of both stages the daemon collects from)
        heat = ["instance", "stage"]
        self.routed = Counter("ascend_balancer_routed_tokens", "Token-expert assignments collected (summed over MoE layers)",
                              heat, registry=r)
        self.hot_share = Gauge("ascend_balancer_hot_expert_share", "Largest share of a layer's tokens one logical expert "
                               "received in the last window (max over layers; uniform = 1/experts)", heat, registry=r)
        self.imbalance = Gauge("ascend_balancer_instance_imbalance", "Max over mean rank load of the last window under "
                               "the map in service (summed over layers; 1 = balanced)", heat, registry=r)
        self.layer_share = Gauge("ascend_balancer_layer_hot_expert_share", "Largest expert share per MoE layer, "
                                 "last window, all instances summed", ["layer"], registry=r)


def _digest(doc: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


class BalancerDaemon:
    """Runs balancing cycles over ``instances``, publishing through ``publisher``."""

    def __init__(self, config: BalancerConfig, instances: Sequence[Instance], publisher: Publisher | None) -> None:
        if publisher is None and not config.dry_run:
            raise ValueError("a publisher is required unless dry_run is set")
        self.config = config
        self.instances = list(instances)
        self.publisher = publisher
        self.forecaster = LoadForecaster(alpha=config.decay)
        self.metrics = BalancerMetrics()
        self.metrics.dry_run.set(1 if config.dry_run else 0)
        self.current: np.ndarray | None = None  # placement in service [L, R*S]
        self.current_doc: dict[str, Any] | None = None
        self.applied: dict[str, str] = {}  # instance -> digest of the map it serves
        #: the last HISTORY_CYCLES cycle records (for tests and status; nothing decides on them): a daemon that
        #: runs for months must not keep one record per cycle forever
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_CYCLES)
        self.cycles = 0  # cycles run since start
        self._load_current()

    def _load_current(self) -> None:
        doc = None
        if self.publisher is not None:
            try:
                doc = self.publisher.current()
            except Exception as exc:  # noqa: BLE001 - unreadable map in service: start from scratch
                log.warning("cannot read the published map: %s", exc)
        if doc is not None and not validate_map(doc, self.config.num_experts, self.config.ranks, self.config.slots, True):
            self.current, _, _ = map_to_placement(doc, self.config.num_experts, allow_duplicates=True)
            self.current_doc = doc

    def adopt(self, doc: dict[str, Any]) -> None:
        """Take ``doc`` (validated) as the map in service, e.g. read from an instance."""
        problems = validate_map(doc, self.config.num_experts, self.config.ranks, self.config.slots, allow_duplicates=True)
        if problems:
            raise ValueError(f"map in service does not match the configured shape: {problems[:3]}")
        self.current, _, _ = map_to_placement(doc, self.config.num_experts, allow_duplicates=True)
        self.current_doc = doc
        for inst in self.instances:
            self.applied[inst.name] = _digest(doc)

    async def collect(self, session: aiohttp.ClientSession) -> np.ndarray | None:
        """Sum of every instance's new load ``[L, E]``, or None if nothing arrived."""
        total: np.ndarray | None = None
        for inst in self.instances:
            try:
                window = await inst.source.collect(session)
            except Exception as exc:  # noqa: BLE001 - one bad instance must not stop the others
                log.warning("load from %s failed: %s", inst.name, exc)
                self.metrics.source_errors.labels(inst.name).inc()
                continue
            if window is None:
                continue
            if window.expert_load.shape[1] != self.config.num_experts:
                log.warning("%s reports %d experts, expected %d", inst.name, window.expert_load.shape[1], self.config.num_experts)
                self.metrics.source_errors.labels(inst.name).inc()
                continue
            self._record_heat(inst, window.expert_load)
            total = window.expert_load if total is None else total + window.expert_load
        if total is not None:
            sums = total.sum(axis=1)
            share = total.max(axis=1) / np.where(sums > 0, sums, 1.0)
            for layer, v in enumerate(share):
                self.metrics.layer_share.labels(str(layer)).set(float(v))
        return total

    def _record_heat(self, inst: Instance, load: np.ndarray) -> None:
        """Per-instance heat metrics of one window ``[L, E]`` (tokens)."""
        m, labels = self.metrics, (inst.name, inst.stage)
        sums = load.sum(axis=1)
        m.routed.labels(*labels).inc(float(sums.sum()))
        m.hot_share.labels(*labels).set(float((load.max(axis=1) / np.where(sums > 0, sums, 1.0)).max()))
        if self.current is not None and self.current.shape[0] == load.shape[0] and sums.min() > 0:
            b = balancedness(self.current, load, self.config.ranks)
            m.imbalance.labels(*labels).set(1.0 / b if b > 0 else float("inf"))

    async def rollout(self, session: aiohttp.ClientSession) -> bool:
        """Apply the map in service to every instance not yet serving it, one at a time."""
        if self.current_doc is None:
            return True
        digest = _digest(self.current_doc)
        for inst in self.instances:
            if self.applied.get(inst.name) == digest:
                continue
            try:
                result = await inst.applier.apply(session, self.current_doc)
            except Exception as exc:  # noqa: BLE001
                result = None
                detail = str(exc)
            if result is None or not result.ok:
                detail = result.detail if result is not None else detail
                log.error("applying map to %s failed (%s); rollout stopped", inst.name, detail)
                self.metrics.apply_failures.labels(inst.name).inc()
                return False
            log.info("%s now serves map %s (%s)", inst.name, digest, result.detail)
            self.applied[inst.name] = digest
        return True

    async def run_cycle(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """One collect/plan/publish/apply cycle; returns a record of what happened."""
        cfg = self.config
        record: dict[str, Any] = {"time": time.time(), "outcome": "idle"}
        window = await self.collect(session)
        if window is not None and window.shape[0] and window.sum(axis=1).min() >= cfg.min_tokens:
            if self.current is not None and self.current.shape[0] == window.shape[0]:
                obs = balancedness(self.current, window, cfg.ranks)
                self.metrics.observed.set(obs)
                record["observed_balancedness"] = obs
            self.forecaster.update(window)
        if self.forecaster.windows < cfg.min_windows:
            record["outcome"] = "warming_up"
        else:
            fc = self.forecaster.forecast()
            previous = self.current if self.current is not None and self.current.shape[0] == fc.mean.shape[0] else None
            result = plan_placement(fc.mean, cfg.ranks, cfg.slots, cfg.groups, cfg.nodes, previous, fc.std, cfg.placement,
                                    holdout=fc.holdout, last=fc.last, history=fc.history)
            before = result.previous_balancedness if result.previous_balancedness is not None else float("nan")
            self.metrics.balancedness.labels("before").set(before)
            self.metrics.balancedness.labels("after").set(result.balancedness)
            record.update(before=before, after=result.balancedness, moved_slots=result.moved_slots,
                          strategy=result.strategy, alpha=fc.alpha)
            if result.kept_previous:
                record["outcome"] = "kept"
            elif cfg.dry_run:
                record["outcome"] = "dry_run"
                log.info("dry run: would publish balancedness %.4f -> %.4f, %d slots moved", before, result.balancedness, result.moved_slots)
            else:
                doc = placement_to_map(result.placement, cfg.ranks)
                assert self.publisher is not None
                where = self.publisher.publish(doc)  # validates again; raises on a bad map
                self.current, self.current_doc = result.placement, doc
                self.metrics.moves.set(result.moved_slots)
                self.metrics.moves_total.inc(result.moved_slots)
                self.metrics.rebalances.inc()
                self.metrics.last_rebalance.set(time.time())
                record.update(outcome="published", location=where)
                log.info("published %s: balancedness %.4f -> %.4f, %d slots moved", where, before, result.balancedness, result.moved_slots)
        if not cfg.dry_run:
            record["rollout_ok"] = await self.rollout(session)
        self.metrics.cycles.labels(record["outcome"]).inc()
        self.history.append(record)
        self.cycles += 1
        return record

    async def _metrics_app(self) -> web.AppRunner | None:
        if self.config.metrics_port is None:
            return None

        async def healthz(_: web.Request) -> web.Response:
            return web.json_response({"ok": True, "cycles": self.cycles})

        return await start_metrics_server(self.metrics.registry, self.config.metrics_host, self.config.metrics_port,
                                          healthz)

    async def run(self, stop: asyncio.Event | None = None, max_cycles: int | None = None) -> None:
        """Cycle every ``interval_s`` until ``stop`` is set or ``max_cycles`` ran."""
        stop = stop or asyncio.Event()
        runner = await self._metrics_app()
        try:
            async with aiohttp.ClientSession() as session:
                def failed(_: Exception) -> None:  # keep serving; the map in service is untouched
                    log.exception("balancing cycle failed")
                    self.metrics.cycles.labels("error").inc()

                await run_every(self.config.interval_s, lambda: self.run_cycle(session), stop, max_cycles, failed)
        finally:
            if runner is not None:
                await runner.cleanup()


@dataclass
class DaemonHandle:
    """A daemon running in a background thread; ``stop()`` ends it and joins."""

    daemon: BalancerDaemon
    thread: threading.Thread
    loop: asyncio.AbstractEventLoop
    stop_event: asyncio.Event

    def stop(self, timeout: float = 10.0) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(timeout)


def start_in_thread(daemon: BalancerDaemon, max_cycles: int | None = None) -> DaemonHandle:
    """Run ``daemon`` in a daemon thread with its own event loop."""
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        box["loop"], box["stop"] = loop, asyncio.Event()
        ready.set()
        loop.run_until_complete(daemon.run(box["stop"], max_cycles))
        loop.close()

    thread = threading.Thread(target=main, name="expert-balancer", daemon=True)
    thread.start()
    ready.wait()
    return DaemonHandle(daemon, thread, box["loop"], box["stop"])


def serve_command(args: Sequence[str]) -> list[str]:
    """The argv of ``ascend-deploy balance serve ARGS`` with this interpreter."""
    return [sys.executable, "-m", "ascend_runtime", "balance", "serve", *args]


def start_process(args: Sequence[str], **popen: Any) -> subprocess.Popen:
    """Start ``ascend-deploy balance serve ARGS`` as a child process (see docs/balancer.md)."""
    return subprocess.Popen(serve_command(args), **popen)
