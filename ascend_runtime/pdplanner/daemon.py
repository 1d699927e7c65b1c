"""The P:D planner process: scrape -> observe -> forecast -> decide -> export (-> publish).

Every ``interval_s`` it GETs the proxy's ``/metrics``, turns the interval since the last
scrape into an :class:`~ascend_runtime.pdplanner.observe.Observation`, folds arrival rate,
prompt and output length into Holt forecasters, and runs
:func:`~ascend_runtime.pdplanner.decide.decide` on the forecast. Every decision is counted
in ``ascend_pdplanner_decisions_total{reason}``. ``dry_run`` only logs and exports; otherwise
a change is written atomically as JSON to ``target_file`` (``{"prefill": P, "decode": D, ...}``)
for whatever scales the instances. Metrics are served on ``metrics_port`` (``/metrics``).

With flexible node groups (``pd_ratio: auto``, a :class:`GroupPool`) the decision is
:func:`~ascend_runtime.pdplanner.decide.decide_split` (how many groups serve prefill) and, unless
``dry_run``, a :class:`~ascend_runtime.pdplanner.actuate.GroupMover` carries it out in the
background (drain, restart in the other shape, re-register); cycles during a move decide nothing
(reason ``acting``). Prompt lengths come from the prefill engines' ``/metrics``
(``engine_urls``; observe.py). The prefill in-flight count and its change over the interval reach
the decision as the backlog and its measured growth (``Load.backlog``, ``Load.backlog_growth``);
after a completed move ``PlannerConfig.move_s`` becomes its measured drain + restart.

Memory stays bounded however long the process runs: no decision reads past cycles' records (the
forecasters carry O(1) state, :class:`PlannerState` carries the streak and the change times of the
last hour, at most ``max_changes_per_hour`` of them), so ``history`` keeps only the last
:data:`HISTORY_CYCLES` records, for inspection; ``cycles`` and ``changes`` count over the whole run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
)

from ascend_runtime.eventloop import run_every
from ascend_runtime.metrics_server import start_metrics_server
from ascend_runtime.pdplanner.decide import (
    REASONS,
    Decision,
    GroupPool,
    Load,
    PlannerConfig,
    PlannerState,
    Pool,
    Slo,
    decide,
    decide_split,
)
from ascend_runtime.pdplanner.forecast import HoltForecaster
from ascend_runtime.pdplanner.observe import (
    Observation,
    Snapshot,
    observe,
    parse,
    parse_engine_prompts,
)
from ascend_runtime.pdplanner.scrape import ScrapeFailed, fetch_metrics

log = logging.getLogger(__name__)

#: seconds for the whole answer of the proxy's /metrics, and of a prefill engine's
PROXY_SCRAPE_TIMEOUT_S = 10.0
ENGINE_SCRAPE_TIMEOUT_S = 5.0
#: cycle records ``PDPlanner.history`` keeps (the newest); no decision reads any of them
HISTORY_CYCLES = 256


@dataclass
class DaemonConfig:
    """Process settings; ``default_prompt_tokens`` stands in for the prompt length the proxy does not export."""

    metrics_url: str
    interval_s: float = 30.0
    dry_run: bool = True
    target_file: str | None = None
    default_prompt_tokens: float = 2048.0
    default_output_tokens: float = 2048.0
    alpha: float = 0.5
    beta: float = 0.3
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None


class PlannerMetrics:
    """Prometheus metrics on a private registry (names ``ascend_pdplanner_*``)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "ascend_pdplanner_"
        self.decisions = Counter(p + "decisions", "Decisions by reason and whether they changed the counts",
                                 ["reason", "change"], registry=r)
        self.last_reason = Gauge(p + "last_decision", "1 for the reason of the last decision, 0 for the others",
                                 ["reason"], registry=r)
        self.target = Gauge(p + "target_instances", "Instances the last decision wants", ["role"], registry=r)
        self.current = Gauge(p + "current_instances", "Instances in service as the planner sees them", ["role"],
                             registry=r)
        self.optimum = Gauge(p + "optimum_instances", "Model optimum before hysteresis and rate limit", ["role"],
                             registry=r)
        self.need = Gauge(p + "required_instances", "Fractional instances the model says the forecast needs",
                          ["role"], registry=r)
        self.forecast = Gauge(p + "forecast", "Forecast of the next interval", ["series"], registry=r)
        self.observed = Gauge(p + "observed_seconds", "Observed latency percentiles at the proxy",
                              ["metric", "quantile"], registry=r)
        self.modelled = Gauge(p + "modelled_seconds", "Modelled latency behind the decision", ["metric"], registry=r)
        self.missing = Gauge(p + "missing_series", "1 for each proxy series the planner needed and did not find",
                             ["series"], registry=r)
        self.changes = Counter(p + "changes", "Decisions that changed the counts (published or, dry run, logged)",
                               registry=r)
        self.dry_run = Gauge(p + "dry_run", "1 when the planner only logs and exports", registry=r)
        self.scrape_errors = Counter(p + "scrape_errors", "Failed proxy scrapes", registry=r)
        self.cycle_errors = Counter(p + "cycle_errors", "Cycles that raised (logged with a traceback)", registry=r)
        self.prefill_groups = Gauge(p + "prefill_groups", "Flexible node groups serving prefill (pd_ratio auto)",
                                    registry=r)
        self.moves = Counter(p + "group_moves", "Flexible group moves by target role and result (ok, abandoned)",
                             ["role", "result"], registry=r)
        self.move_seconds = Gauge(p + "last_move_seconds", "Phases of the last group move (drain, restart)",
                                  ["phase"], registry=r)
        for reason in REASONS:
            self.last_reason.labels(reason).set(0)


def write_target(path: str, decision: Decision, now: float) -> None:
    """Write the target counts atomically (temp file + rename)."""
    doc = {"prefill": decision.prefill, "decode": decision.decode, "reason": decision.reason, "time": now}
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=str(target.parent or "."), prefix=".pd-target-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, sort_keys=True)
    os.replace(tmp, target)


def _measured(load: Load | None) -> str:
    """`` [measured median TTFT X ms, TPOT Y ms]`` of the interval, for the decision's log line ("" if none)."""
    if load is None or (load.ttft_observed_s is None and load.tpot_observed_s is None):
        return ""
    parts = [f"{name} {value * 1000:.0f} ms" for name, value in (("TTFT", load.ttft_observed_s),
                                                                  ("TPOT", load.tpot_observed_s)) if value is not None]
    return f" [measured median {', '.join(parts)}]"


class PDPlanner:
    """Runs planning cycles against one proxy; ``current`` starts at the Plan's instance counts."""

    def __init__(self, config: DaemonConfig, pool: Pool, slo: Slo, planner: PlannerConfig,
                 current: tuple[int, int], clock: Callable[[], float] = time.monotonic,
                 groups: GroupPool | None = None, mover: Any = None,
                 engine_urls: Callable[[], list[str]] | None = None) -> None:
        if not config.dry_run and not config.target_file and mover is None:
            raise ValueError("a target file or a group mover is required unless dry_run is set")
        if mover is not None and groups is None:
            raise ValueError("a group mover needs the flexible group pool")
        self.groups, self.mover, self.engine_urls = groups, mover, engine_urls
        self.current_k = mover.prefill_groups() if mover is not None else 0
        self.move_task: asyncio.Task[Any] | None = None
        # the one-interval projection of the overwhelming-evidence rule runs on the daemon's own interval
        self.config, self.pool, self.slo = config, pool, slo
        self.planner = replace(planner, interval_s=config.interval_s)
        self.current = current
        self.clock = clock
        self.state = PlannerState()
        self.metrics = PlannerMetrics()
        self.metrics.dry_run.set(1 if config.dry_run else 0)
        self.rate = HoltForecaster(config.alpha, config.beta)
        self.prompt = HoltForecaster(config.alpha, 0.0, floor=1.0)
        self.output = HoltForecaster(config.alpha, 0.0, floor=1.0)
        self.previous: Snapshot | None = None
        self.previous_queue: float | None = None  # prefill in-flight at the last scrape (requests)
        #: the last HISTORY_CYCLES cycle records (inspection only; decisions read none of them)
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_CYCLES)
        self.cycles = 0  # cycles run since start
        self.changes = 0  # of them, decisions that changed the counts

    def _export_observation(self, obs: Observation) -> None:
        m = self.metrics
        for metric, values in (("ttft", (obs.ttft_p50, obs.ttft_p90)), ("tpot", (obs.tpot_p50, obs.tpot_p90))):
            for q, v in zip(("0.5", "0.9"), values):
                if v is not None:
                    m.observed.labels(metric, q).set(v)
        for series in obs.missing:
            m.missing.labels(series).set(1)

    def step(self, snapshot: Snapshot) -> dict[str, Any]:
        """One cycle on a fresh snapshot (no I/O besides the target file); returns its record."""
        record: dict[str, Any] = {"time": snapshot.time}
        load: Load | None = None
        if self.previous is not None:
            obs = observe(self.previous, snapshot, self.config.default_prompt_tokens)
            self._export_observation(obs)
            observed = (obs.instances.get("prefill"), obs.instances.get("decode"))
            if observed[0] and observed[1]:
                self.current = (observed[0], observed[1])
            self.rate.update(obs.arrival_rate)
            if obs.prompt_tokens is not None:
                self.prompt.update(obs.prompt_tokens)
            if obs.output_tokens is not None:
                self.output.update(obs.output_tokens)
            queue = obs.queue_depth or 0.0
            growth = (queue - self.previous_queue) / obs.interval_s if (
                obs.queue_depth is not None and self.previous_queue is not None) else None
            load = Load(self.rate.forecast() or 0.0, self.prompt.forecast() or self.config.default_prompt_tokens,
                        self.output.forecast() or self.config.default_output_tokens, queue, growth,
                        ttft_observed_s=obs.ttft_p50, tpot_observed_s=obs.tpot_p50)
            record.update(observation=obs, load=load)
            for series, value in (("arrival_rate", load.arrival_rate), ("prompt_tokens", load.prompt_tokens),
                                  ("output_tokens", load.output_tokens)):
                self.metrics.forecast.labels(series).set(value)
        self.previous = snapshot
        self.previous_queue = snapshot.inflight.get("prefill")
        if self.groups is not None:
            if self.mover is not None:
                self.current_k = self.mover.prefill_groups()
            self.current = self.groups.counts(self.current_k)
            self.metrics.prefill_groups.set(self.current_k)
            if self.move_task is not None and not self.move_task.done():
                d = Decision(*self.current, "acting", False, self.current, None, self.state,
                             "a group move is under way", self.current_k)
            else:
                d = decide_split(load, self.current_k, self.groups, self.slo, self.planner, self.state, snapshot.time)
        else:
            d = decide(load, self.current, self.pool, self.slo, self.planner, self.state, snapshot.time)
        self.state = d.state
        self._export_decision(d)
        record.update(decision=d)
        measured = _measured(load)
        if d.change:
            log.info("%s: %dP + %dD -> %dP + %dD %s%s%s", d.reason, *self.current, d.prefill, d.decode, d.detail,
                     measured, " (dry run: not published)" if self.config.dry_run else "")
            if not self.config.dry_run and self.mover is None:
                assert self.config.target_file is not None
                write_target(self.config.target_file, d, time.time())
                self.current = (d.prefill, d.decode)
            elif self.groups is not None and self.mover is None:
                self.current_k = d.prefill_groups or 0  # dry run: count as if it had happened
        else:
            # a dry run exists to be watched: each decision is shown at the default level
            (log.info if self.config.dry_run else log.debug)("%s: keep %dP + %dD %s%s", d.reason, *self.current,
                                                             d.detail, measured)
        self.history.append(record)
        self.cycles += 1
        self.changes += 1 if d.change else 0
        return record

    def _export_decision(self, d: Decision) -> None:
        m = self.metrics
        m.decisions.labels(d.reason, "true" if d.change else "false").inc()
        for reason in REASONS:
            m.last_reason.labels(reason).set(1 if reason == d.reason else 0)
        m.target.labels("prefill").set(d.prefill)
        m.target.labels("decode").set(d.decode)
        m.current.labels("prefill").set(self.current[0])
        m.current.labels("decode").set(self.current[1])
        m.optimum.labels("prefill").set(d.optimum[0])
        m.optimum.labels("decode").set(d.optimum[1])
        if d.change:
            m.changes.inc()
        if d.requirement is not None:
            r = d.requirement
            m.need.labels("prefill").set(r.need_p)
            m.need.labels("decode").set(r.need_d)
            m.modelled.labels("ttft_floor").set(r.ttft_floor_s)
            m.modelled.labels("tpot").set(r.decode_tpot_s)

    async def run_cycle(self, session: aiohttp.ClientSession) -> dict[str, Any] | None:
        """Scrape the proxy and run one cycle; None when the scrape failed (scrape.py: no answer in time, not
        200, too large, not UTF-8; observe.parse: not an exposition the planner can read): counted, logged,
        nothing decided, the forecasts and the last good sample kept for the next cycle."""
        try:
            text = await fetch_metrics(session, self.config.metrics_url, PROXY_SCRAPE_TIMEOUT_S)
            snapshot = parse(text, self.clock())
        except (ScrapeFailed, ValueError) as exc:
            log.warning("scraping %s failed, no decision this cycle: %s", self.config.metrics_url, exc)
            self.metrics.scrape_errors.inc()
            return None
        if self.engine_urls is not None:
            snapshot.engine_prompts = await self._scrape_engines(session)
        record = self.step(snapshot)
        d = record["decision"]
        if d.change and self.mover is not None and not self.config.dry_run and d.prefill_groups is not None:
            self.move_task = asyncio.create_task(self._move(d.prefill_groups))
        return record

    async def _scrape_engines(self, session: aiohttp.ClientSession) -> dict[str, tuple[float, float]]:
        """``vllm:request_prompt_tokens`` (sum, count) of every prefill engine that answers."""
        assert self.engine_urls is not None

        async def one(url: str) -> tuple[str, tuple[float, float] | None]:
            try:  # a failed engine scrape leaves that engine out of this interval's prompt length
                return url, parse_engine_prompts(await fetch_metrics(session, url + "/metrics", ENGINE_SCRAPE_TIMEOUT_S))
            except (ScrapeFailed, ValueError) as exc:
                log.info("prefill engine scrape left out of this cycle: %s", exc)
                return url, None

        found = await asyncio.gather(*(one(u) for u in self.engine_urls()))
        return {u: v for u, v in found if v is not None}

    async def _move(self, prefill_groups: int) -> None:
        """Carry a decision out; a failed or abandoned move is logged and counted, the split stays."""
        try:
            results = await self.mover.apply(prefill_groups)
            for result in results:
                self.metrics.moves.labels(result.to_role, "ok" if result.ok else "abandoned").inc()
                self.metrics.move_seconds.labels("drain").set(result.drain_s)
                self.metrics.move_seconds.labels("restart").set(result.restart_s)
            took = [r.drain_s + r.restart_s for r in results if r.ok]
            if took:  # the backlog projection uses how long a move really takes here
                self.planner = replace(self.planner, move_s=max(took))
        except Exception:  # noqa: BLE001 - the daemon keeps planning; the traceback is in the log
            log.exception("moving flexible groups to %d prefill groups failed", prefill_groups)
        self.current_k = self.mover.prefill_groups()
        self.metrics.prefill_groups.set(self.current_k)

    def _cycle_failed(self, exc: Exception) -> None:
        """A cycle that raised (a fault of the planner's own, not of a scrape: those are failed samples): logged
        with its traceback and counted; the loop goes on with the next cycle."""
        log.error("planner cycle failed; the next cycle runs as planned", exc_info=exc)
        self.metrics.cycle_errors.inc()

    async def _metrics_app(self) -> web.AppRunner | None:
        if self.config.metrics_port is None:
            return None

        return await start_metrics_server(self.metrics.registry, self.config.metrics_host, self.config.metrics_port)

    async def run(self, stop: asyncio.Event | None = None, max_cycles: int | None = None) -> None:
        """Cycle every ``interval_s`` until ``stop`` is set or ``max_cycles`` ran."""
        stop = stop or asyncio.Event()
        runner = await self._metrics_app()
        try:
            async with aiohttp.ClientSession() as session:
                await run_every(self.config.interval_s, lambda: self.run_cycle(session), stop, max_cycles,
                                on_error=self._cycle_failed)
        finally:
            if self.move_task is not None and not self.move_task.done():
                log.info("waiting for the group move under way to finish before stopping")
                await asyncio.shield(self.move_task)
            if runner is not None:
                await runner.cleanup()
