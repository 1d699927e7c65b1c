"""Prometheus metrics of the proxy, in a registry of its own (one per proxy).

Names (all prefixed ``ascend_proxy_``):
  requests_total{endpoint,outcome,status}   counter; outcome in success, client_error,
                                            upstream_error, no_instance, stream_error,
                                            client_disconnect, proxy_error, bad_request (a
                                            malformed request head: endpoint "-",
                                            protolog.py); status is the
                                            answer's HTTP status (200 for a stream ended
                                            by an error event, 499 client went away)
  ttft_seconds / itl_seconds / e2e_seconds   histograms measured at the proxy (seconds):
                                            first relayed byte after arrival, gaps between
                                            relayed upstream chunks, last byte after arrival
  inflight{role,instance}                   gauge of requests currently on each instance
  routing_decisions_total{role,instance}    counter of picks
  retries_total{role,reason}                counter of attempts moved to another instance
  ejections_total{role,instance,reason}     counter; reason in consecutive_errors,
                                            connect_failure, success_rate, failure_percent,
                                            health_check
  ejections_skipped_total{role,instance,reason}  outlier evidence that did not eject because
                                            of the max ejection percent (kept in rotation)
  readmissions_total{role,instance}         ejected instances put back in rotation
  panic_routing_total{role,kind}            picks that had to use an outlier kept in
                                            rotation (kind=outlier) or an ejected instance
                                            (kind=ejected) because nothing else was left
  slow_health_checks_total{role,instance}   /health checks that timed out (not failures)
  instance_ejected{role,instance}           1 while ejected (refreshed on scrape)
  recomputes_total                          decode answers continued after stop_reason=recomputed
  migrations_total                          streams moved off an evacuated decode instance and
                                            continued on another (drain with migrate)
  relayed_chunks_total                      upstream body chunks relayed to clients
  instance_routable{role,instance}          1 if routable now (refreshed on scrape)
  instance_kv_cache_usage{role,instance}    last scraped vllm:kv_cache_usage_perc
  rank_endpoint{role,instance,engine_instance}  1 for each endpoint that is one DP rank of engine
                                            instance ``engine_instance`` (rank serving; the
                                            family is absent while no endpoint is a rank)

``instance`` is the endpoint's name: under rank serving one series per DP rank
(``prefill-0-dp1``); ``rank_endpoint`` maps those back to their engine instance.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ascend_runtime.proxy.pool import InstancePool, InstanceState

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


class BatchHistogram(Collector):
    """A histogram fed in batches: the stream relay counts gaps per stream and adds them once at its end.

    Same exposition as ``prometheus_client.Histogram`` (``_bucket{le}``,
    ``_count``, ``_sum``; a value v falls in the first bucket with v <= le);
    :meth:`add` costs one call per stream instead of one ``observe`` per event.
    """

    def __init__(self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry):
        self.name, self.documentation = name, documentation
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # last: above the largest bound (+Inf)
        self.sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        """One value (seconds)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def add(self, counts: Iterable[int], total: float) -> None:
        """Per-bucket counts (same layout as :attr:`counts`) and their sum, from one stream."""
        for i, c in enumerate(counts):
            if c:
                self.counts[i] += c
        self.sum += total

    def _family(self) -> HistogramMetricFamily:
        cum, buckets = 0, []
        for bound, c in zip(self.bounds + (math.inf,), self.counts):
            cum += c
            buckets.append((floatToGoString(bound), cum))
        return HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, buckets=[("+Inf", 0)], sum_value=0)

    def collect(self) -> Iterator[Metric]:
        yield self._family()


class RankEndpoints(Collector):
    """``ascend_proxy_rank_endpoint{role,instance,engine_instance}`` from the pool at each scrape; nothing at
    all while no endpoint is a DP rank (the exposition under instance serving is what it always was)."""

    NAME = "ascend_proxy_rank_endpoint"

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pool: InstancePool | None = None
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        ranks = [s for s in self.pool.all() if s.spec.instance is not None] if self.pool is not None else []
        if not ranks:
            return
        family = GaugeMetricFamily(self.NAME, "1 for each endpoint that is one DP rank of an engine instance",
                                   labels=["role", "instance", "engine_instance"])
        for s in ranks:
            family.add_metric([s.role, s.name, s.spec.group], 1)
        yield family


class ProxyMetrics:
    """Holds the collectors; call :meth:`render` for the ``/metrics`` body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        p = "ascend_proxy_"
        self.requests = Counter(p + "requests", "Client requests by outcome and answer status",
                                ["endpoint", "outcome", "status"], registry=r)
        self.ttft = Histogram(p + "ttft_seconds", "Proxy-side time to first byte", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = BatchHistogram(p + "itl_seconds", "Proxy-side gap between relayed chunks", ITL_BUCKETS, r)
        self.e2e = Histogram(p + "e2e_seconds", "Proxy-side request latency", buckets=LATENCY_BUCKETS, registry=r)
        self.inflight = Gauge(p + "inflight", "Requests in flight per instance", ["role", "instance"], registry=r)
        self.decisions = Counter(p + "routing_decisions", "Routing picks", ["role", "instance"], registry=r)
        self.retries = Counter(p + "retries", "Attempts moved to another instance", ["role", "reason"], registry=r)
        self.ejections = Counter(p + "ejections", "Instances taken out of rotation", ["role", "instance", "reason"],
                                 registry=r)
        self.ejections_skipped = Counter(p + "ejections_skipped", "Outliers kept in rotation by the ejection cap",
                                         ["role", "instance", "reason"], registry=r)
        self.readmissions = Counter(p + "readmissions", "Ejected instances put back in rotation",
                                    ["role", "instance"], registry=r)
        self.panic = Counter(p + "panic_routing", "Picks that used an outlier or ejected instance",
                             ["role", "kind"], registry=r)
        self.slow_checks = Counter(p + "slow_health_checks", "Health checks that timed out", ["role", "instance"],
                                   registry=r)
        self.ejected = Gauge(p + "instance_ejected", "1 while the instance is ejected", ["role", "instance"],
                             registry=r)
        self.recomputes = Counter(p + "recomputes", "Decode answers continued after recompute", registry=r)
        self.migrations = Counter(p + "migrations", "Streams moved off an evacuated decode instance", registry=r)
        self.chunks = Counter(p + "relayed_chunks", "Writes of decode stream bytes to clients", registry=r)
        self.events = Counter(p + "relayed_events", "SSE events relayed to clients", registry=r)
        self.routable = Gauge(p + "instance_routable", "1 if the instance takes new requests", ["role", "instance"],
                              registry=r)
        self.kv_usage = Gauge(p + "instance_kv_cache_usage", "Scraped vllm:kv_cache_usage_perc", ["role", "instance"],
                              registry=r)
        self.rank_endpoints = RankEndpoints(r)

        #: label children of the per-request counters, looked up once per label set (these are never removed)
        self._children: dict[tuple[str, ...], Any] = {}

    def decided(self, role: str, instance: str) -> None:
        """Count one routing pick (``routing_decisions_total{role,instance}``)."""
        child = self._children.get(("d", role, instance))
        if child is None:
            child = self._children[("d", role, instance)] = self.decisions.labels(role, instance)
        child.inc()

    def requested(self, endpoint: str, outcome: str, status: str) -> None:
        """Count one client request (``requests_total{endpoint,outcome,status}``)."""
        child = self._children.get(("r", endpoint, outcome, status))
        if child is None:
            child = self._children[("r", endpoint, outcome, status)] = self.requests.labels(endpoint, outcome, status)
        child.inc()

    def on_pool_event(self, kind: str, state: InstanceState, reason: str) -> None:
        """Hook for :class:`InstancePool` events."""
        if kind == "eject":
            self.ejections.labels(state.role, state.name, reason).inc()
        elif kind == "eject_skipped":
            self.ejections_skipped.labels(state.role, state.name, reason).inc()
        elif kind == "readmit":
            self.readmissions.labels(state.role, state.name).inc()
        elif kind == "panic":
            self.panic.labels(state.role, reason).inc()
        elif kind == "slow_check":
            self.slow_checks.labels(state.role, state.name).inc()
        elif kind == "remove":
            for gauge in (self.inflight, self.routable, self.kv_usage, self.ejected):
                try:
                    gauge.remove(state.role, state.name)
                except KeyError:
                    pass

    def render(self, pool: InstancePool) -> bytes:
        """Refresh per-instance gauges from ``pool`` and return the exposition text."""
        now = pool.clock()
        self.rank_endpoints.pool = pool
        for s in pool.all():
            self.inflight.labels(s.role, s.name).set(s.inflight)
            self.routable.labels(s.role, s.name).set(1 if s.routable(now) else 0)
            self.ejected.labels(s.role, s.name).set(1 if s.ejected else 0)
            if s.kv_usage is not None:
                self.kv_usage.labels(s.role, s.name).set(s.kv_usage)
        return generate_latest(self.registry)
