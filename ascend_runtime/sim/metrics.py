"""Prometheus exposition: vLLM's metric names plus ``ascend_sim:*``.

Latencies (vllm:*) are wall-clock seconds as a client sees them (so with
``--speedup F`` they are F times shorter than on hardware); ``ascend_sim:step_
modelled_seconds`` is the modelled (unscaled) step time and
``ascend_sim:speedup`` says which factor is in force. Histograms take a count
per observation so a step can record the inter-token latency of every sequence
in one call. Every family carries the label ``model_name``, like vLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0)


@dataclass
class Histogram:
    """Cumulative histogram with weighted observations."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: np.ndarray = field(default_factory=lambda: np.zeros(len(LATENCY_BUCKETS) + 1, dtype=np.int64))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float, count: int = 1) -> None:
        """Record ``count`` observations of ``value``."""
        if count <= 0:
            return
        self.counts[int(np.searchsorted(self.buckets, value, side="left"))] += count
        self.total += value * count
        self.n += count

    def observe_many(self, values: np.ndarray) -> None:
        """Record one observation of each of ``values`` (vectorised ``observe``)."""
        if values.size == 0:
            return
        idx = np.searchsorted(self.buckets, values, side="left")
        self.counts += np.bincount(idx, minlength=len(self.counts))
        self.total += float(values.sum())
        self.n += int(values.size)

    def family(self, name: str, doc: str, model: str) -> HistogramMetricFamily:
        """As a Prometheus histogram family."""
        fam = HistogramMetricFamily(name, doc, labels=["model_name"])
        cum = np.cumsum(self.counts)
        pts = [(repr(b), int(c)) for b, c in zip(self.buckets, cum[:-1])] + [("+Inf", int(cum[-1]))]
        fam.add_metric([model], pts, self.total)
        return fam


class SimMetrics:
    """All counters of one simulator instance and their exposition."""

    def __init__(self, model: str, instance: str, gauges: Callable[[], dict[str, float]]) -> None:
        self.model, self.instance = model, instance
        self._gauges = gauges
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success: dict[str, int] = {}
        self.failures = 0
        self.ttft, self.itl, self.e2e = Histogram(), Histogram(), Histogram()
        self.step = Histogram()
        self.steps = 0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # type: ignore[arg-type]

    def collect(self) -> Iterator[Metric]:
        """prometheus_client collector protocol."""
        m = self.model
        g = self._gauges()
        for name, doc in (
            ("vllm:num_requests_running", "Requests in model execution batches."),
            ("vllm:num_requests_waiting", "Requests waiting to be processed."),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
            ("ascend_sim:balancedness", "Mean/max EP rank load over recent steps (1 = perfect)."),
            ("ascend_sim:speedup", "Factor dividing every modelled time."),
            ("ascend_sim:mean_step_modelled_seconds", "Mean modelled step time (before speedup)."),
        ):
            fam = GaugeMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric([m], float(g.get(name, 0.0)))
            yield fam
        for name, doc, value in (
            ("vllm:prompt_tokens", "Prefill tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens", "Generation tokens processed.", self.generation_tokens),
            ("ascend_sim:steps", "Engine steps run.", self.steps),
            ("ascend_sim:request_failures", "Requests answered with an error (faults, KV pulls).", self.failures),
            ("ascend_sim:kv_bytes_moved", "Modelled KV bytes sent or received over the PD link.",
             g.get("kv_bytes_moved", 0)),
            ("ascend_sim:kv_wire_bytes", "KV bytes that really crossed the socket.", g.get("kv_wire_bytes", 0)),
        ):
            fam = CounterMetricFamily(name, doc, labels=["model_name"])
            fam.add_metric([m], float(value))
            yield fam
        fam = CounterMetricFamily("vllm:request_success", "Successfully processed requests.",
                                  labels=["model_name", "finished_reason"])
        for reason, count in sorted(self.success.items()) or [("length", 0)]:
            fam.add_metric([m, reason], float(count))
        yield fam
        yield self.ttft.family("vllm:time_to_first_token_seconds", "Time to first token (wall s).", m)
        yield self.itl.family("vllm:inter_token_latency_seconds", "Inter-token latency (wall s).", m)
        yield self.e2e.family("vllm:e2e_request_latency_seconds", "End-to-end request latency (wall s).", m)
        yield self.step.family("ascend_sim:step_modelled_seconds", "Modelled step time before speedup (s).", m)

    def exposition(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)
