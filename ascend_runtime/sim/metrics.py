"""Prometheus exposition: vLLM 0.23.0's metrics, plus ``ascend_sim:*``.

The ``vllm:*`` families are those vLLM 0.23.0's ``PrometheusStatLogger``
registers (``vllm/v1/metrics/loggers.py``) for this engine's configuration,
with its names, types, label names and histogram bucket boundaries; what they
count follows ``vllm/v1/metrics/stats.py`` (see docs/simulator.md, "Metrics").
Every family carries ``model_name`` and ``engine`` (the DP rank, one series
per rank, as vLLM labels each engine core), except ``vllm:cache_config_info``
whose labels are the cache config and ``engine``. Families vLLM registers only
for features the simulator does not have (LoRA, KV-cache residency sampling,
NaN detection, MFU estimates, connector transfer metrics) are left out;
``vllm:spec_decode_*`` exist with ``--mtp`` only, as vLLM registers them only
with a speculative config. The kit's own families are ``ascend_sim:*``
(``model_name`` only).

Latencies are wall-clock seconds as a client sees them (so with ``--speedup F``
they are F times shorter than on hardware); ``ascend_sim:step_modelled_seconds``
is the modelled (unscaled) step time and ``ascend_sim:speedup`` says which
factor is in force. Histograms take a count per observation so a step can
record a latency for many sequences in one call. The text is written
directly (Prometheus text format 0.0.4): a DP64 instance has about 20,000
samples, which a generic client library would format too slowly for a
scrape every second.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

#: The simulator's own step-time histogram.
STEP_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0)
# vllm/v1/metrics/loggers.py PrometheusStatLogger bucket boundaries
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                           240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)
#: ``FinishReason`` strings (vllm/v1/engine/__init__.py); ``vllm:request_success`` has a series for each.
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
#: ``PromptTokenStats.ALL_SOURCES`` (vllm/v1/metrics/stats.py).
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (loggers.py ``build_1_2_5_buckets``)."""
    out: list[int] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return tuple(out)
            out.append(v)
        exp += 1


def _num(v: float) -> str:
    """A sample value or bound as Prometheus clients write it (``1.0``, ``0.25``, ``+Inf``)."""
    v = float(v)
    if v == float("inf"):
        return "+Inf"
    if v == float("-inf"):
        return "-Inf"
    if v != v:
        return "NaN"
    return repr(v)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Histogram:
    """Cumulative histogram per engine with weighted observations."""

    def __init__(self, buckets: Iterable[float] = STEP_BUCKETS, engines: int = 1) -> None:
        self.buckets = np.asarray(tuple(buckets), dtype=np.float64)
        self.le = [_num(b) for b in self.buckets] + ["+Inf"]
        self.counts = np.zeros((engines, len(self.buckets) + 1), dtype=np.int64)
        self.sums = np.zeros(engines)

    @property
    def n(self) -> int:
        """Observations over all engines."""
        return int(self.counts.sum())

    @property
    def total(self) -> float:
        """Sum of observed values over all engines."""
        return float(self.sums.sum())

    def observe(self, value: float, count: int = 1, engine: int = 0) -> None:
        """Record ``count`` observations of ``value`` on ``engine``."""
        if count <= 0:
            return
        self.counts[engine, int(np.searchsorted(self.buckets, value, side="left"))] += count
        self.sums[engine] += value * count

    def observe_many(self, values: np.ndarray, engines: np.ndarray | None = None) -> None:
        """One observation of each of ``values`` on the matching ``engines`` (default engine 0)."""
        values = np.asarray(values, dtype=np.float64)
        if values.size == 0:
            return
        width = self.counts.shape[1]
        idx = np.searchsorted(self.buckets, values, side="left")
        if engines is None:
            self.counts[0] += np.bincount(idx, minlength=width)
            self.sums[0] += float(values.sum())
            return
        e = self.counts.shape[0]
        self.counts += np.bincount(engines * width + idx, minlength=e * width).reshape(e, width)
        self.sums += np.bincount(engines, weights=values, minlength=e)

    def write(self, out: list[str], name: str, labels: list[str], engines: list[int] | None = None) -> None:
        """Sample lines, one block per engine (``labels[e]`` is its label string without braces); ``engines``:
        only these engines' blocks (default all)."""
        cum = np.cumsum(self.counts, axis=1).tolist()
        sums = self.sums.tolist()
        le = self.le
        for e in range(len(labels)) if engines is None else engines:
            lab = labels[e]
            row = cum[e]
            out.extend(f'{name}_bucket{{{lab},le="{b}"}} {float(c)!r}\n' for b, c in zip(le, row))
            out.append(f"{name}_count{{{lab}}} {float(row[-1])!r}\n")
            out.append(f"{name}_sum{{{lab}}} {_num(sums[e])}\n")


class SimMetrics:
    """Counters, gauges and histograms of one simulator instance, and their exposition.

    ``gauges()`` returns the engine's current state: per-engine arrays ``running``,
    ``waiting_capacity``, ``waiting_deferred``, ``kv_usage`` and the instance-level
    ``ascend_sim`` values. :meth:`configure` sizes the per-engine state (the engine does it).
    """

    def __init__(self, model: str, instance: str, gauges: Callable[[], dict[str, Any]], engines: int = 1,
                 max_model_len: int = 32768, spec_decode: bool = False,
                 cache_info: dict[str, str] | None = None) -> None:
        self.model, self.instance = model, instance
        self._gauges = gauges
        self.cache_info = dict(cache_info or {})
        self.failures = 0
        self.steps = 0
        self.step = Histogram(STEP_BUCKETS, 1)
        self.configure(engines, max_model_len, spec_decode)

    def configure(self, engines: int, max_model_len: int, spec_decode: bool = False) -> None:
        """(Re)create the per-engine state for ``engines`` DP ranks (counts restart at 0)."""
        self.engines, self.max_model_len, self.spec_decode = engines, max_model_len, spec_decode
        z = lambda: np.zeros(engines)
        self.prompt_tokens, self.generation_tokens = z(), z()
        self.prompt_by_source = {s: z() for s in PROMPT_SOURCES}
        self.prompt_cached = z()
        self.prefix_queries, self.prefix_hits = z(), z()
        self.external_queries, self.external_hits = z(), z()
        self.preemptions = z()
        self.spec_drafts, self.spec_draft_tokens, self.spec_accepted = z(), z(), z()
        self.success = {r: z() for r in FINISH_REASONS}
        tokens = build_1_2_5_buckets(max_model_len)
        h = lambda b: Histogram(b, engines)
        self.ttft, self.itl, self.tpot = h(TTFT_BUCKETS), h(ITL_BUCKETS), h(ITL_BUCKETS)
        self.e2e, self.queue, self.inference = h(REQUEST_LATENCY_BUCKETS), h(REQUEST_LATENCY_BUCKETS), \
            h(REQUEST_LATENCY_BUCKETS)
        self.prefill_time, self.decode_time = h(REQUEST_LATENCY_BUCKETS), h(REQUEST_LATENCY_BUCKETS)
        self.request_prompt, self.request_generation = h(tokens), h(tokens)
        self.max_generation, self.params_max_tokens = h(tokens), h(tokens)
        self.prefill_kv_computed = h(tokens)
        self.iteration_tokens, self.params_n = h(ITERATION_TOKENS_BUCKETS), h(N_BUCKETS)
        m, e = _esc(self.model), engines
        self._labels = [f'model_name="{m}",engine="{i}"' for i in range(e)]

    def success_totals(self) -> dict[str, int]:
        """Finished requests by reason, summed over engines (reasons with none left out)."""
        return {r: int(v.sum()) for r, v in self.success.items() if v.sum()}

    def exposition(self, engine: int | None = None) -> bytes:
        """The Prometheus text format; ``engine``: only that DP rank's ``vllm:*`` series (rank serving: what the
        rank's own API server exports, ``engine="<rank>"``); the ``ascend_sim:*`` families are the instance's."""
        g = self._gauges()
        out: list[str] = []
        w = out.append
        labels = self._labels
        shown = list(range(self.engines)) if engine is None else [engine]
        model = _esc(self.model)

        def head(name: str, kind: str, doc: str) -> None:
            # a counter's HELP/TYPE lines name its _total sample, as prometheus_client writes format 0.0.4
            w(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")

        def per_engine(name: str, kind: str, doc: str, values: Any, suffix: str = "") -> None:
            head(name + suffix, kind, doc)
            vals = np.broadcast_to(np.asarray(values, dtype=np.float64), (self.engines,)).tolist()
            out.extend(f"{name}{suffix}{{{labels[e]}}} {_num(vals[e])}\n" for e in shown)

        def labelled(name: str, kind: str, doc: str, label: str, series: dict[str, Any], suffix: str = "") -> None:
            head(name + suffix, kind, doc)
            for key, values in series.items():
                vals = np.broadcast_to(np.asarray(values, dtype=np.float64), (self.engines,)).tolist()
                out.extend(f'{name}{suffix}{{{labels[e]},{label}="{key}"}} {_num(vals[e])}\n' for e in shown)

        def hist(name: str, doc: str, hg: Histogram) -> None:
            head(name, "histogram", doc)
            hg.write(out, name, labels, shown)

        # gauges
        per_engine("vllm:num_requests_running", "gauge", "Requests in model execution batches.", g["running"])
        waiting = np.asarray(g["waiting_capacity"], dtype=np.float64) + np.asarray(g["waiting_deferred"])
        per_engine("vllm:num_requests_waiting", "gauge", "Requests waiting to be processed.", waiting)
        labelled("vllm:num_requests_waiting_by_reason", "gauge",
                 "Waiting requests by reason: capacity (scheduling room) or deferred (KV transfer in progress).",
                 "reason", {"capacity": g["waiting_capacity"], "deferred": g["waiting_deferred"]})
        labelled("vllm:engine_sleep_state", "gauge", "Engine sleep state (awake = 1: serving).", "sleep_state",
                 {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0})
        per_engine("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", g["kv_usage"])
        # counters
        for name, doc, values in (
            ("vllm:prefix_cache_queries", "Prefix cache queries, in queried tokens.", self.prefix_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in cached tokens.", self.prefix_hits),
            ("vllm:external_prefix_cache_queries", "KV connector cache queries, in queried tokens.",
             self.external_queries),
            ("vllm:external_prefix_cache_hits", "KV connector cache hits, in tokens loaded from the remote instance.",
             self.external_hits),
            ("vllm:mm_cache_queries", "Multi-modal cache queries, in items.", 0.0),
            ("vllm:mm_cache_hits", "Multi-modal cache hits, in items.", 0.0),
            ("vllm:num_preemptions", "Preemptions by the scheduler.", self.preemptions),
            ("vllm:prompt_tokens", "Prompt tokens of the requests that got their first token.", self.prompt_tokens),
        ):
            per_engine(name, "counter", doc, values, "_total")
        labelled("vllm:prompt_tokens_by_source", "counter", "Prompt tokens by source.", "source",
                 self.prompt_by_source, "_total")
        per_engine("vllm:prompt_tokens_cached", "counter", "Prompt tokens not computed (local cache + KV transfer).",
                   self.prompt_cached, "_total")
        per_engine("vllm:generation_tokens", "counter", "Generated tokens.", self.generation_tokens, "_total")
        labelled("vllm:request_success", "counter", "Finished requests by finish reason.", "finished_reason",
                 self.success, "_total")
        if self.spec_decode:
            per_engine("vllm:spec_decode_num_drafts", "counter", "Speculative (MTP) drafts.", self.spec_drafts,
                       "_total")
            per_engine("vllm:spec_decode_num_draft_tokens", "counter", "Draft tokens.", self.spec_draft_tokens,
                       "_total")
            per_engine("vllm:spec_decode_num_accepted_tokens", "counter", "Accepted draft tokens.",
                       self.spec_accepted, "_total")
            labelled("vllm:spec_decode_num_accepted_tokens_per_pos", "counter", "Accepted draft tokens per position.",
                     "position", {"0": self.spec_accepted}, "_total")
        # histograms
        hist("vllm:request_prompt_tokens", "Prompt tokens per finished request.", self.request_prompt)
        hist("vllm:request_generation_tokens", "Generated tokens per finished request.", self.request_generation)
        hist("vllm:iteration_tokens_total", "Tokens per engine step.", self.iteration_tokens)
        hist("vllm:request_max_num_generation_tokens", "Most tokens generated by a choice of a finished request.",
             self.max_generation)
        hist("vllm:request_params_n", "The n request parameter.", self.params_n)
        hist("vllm:request_params_max_tokens", "The max_tokens request parameter.", self.params_max_tokens)
        hist("vllm:time_to_first_token_seconds", "Time to first token (s).", self.ttft)
        hist("vllm:inter_token_latency_seconds", "Time between an output and the request's previous one (s).",
             self.itl)
        hist("vllm:request_time_per_output_token_seconds", "Mean time per output token of a finished request (s).",
             self.tpot)
        hist("vllm:e2e_request_latency_seconds", "End-to-end request latency (s).", self.e2e)
        hist("vllm:request_queue_time_seconds", "Time waiting before first scheduled (s).", self.queue)
        hist("vllm:request_inference_time_seconds", "Time from first scheduled to last token (s).", self.inference)
        hist("vllm:request_prefill_time_seconds", "Time from first scheduled to first token (s).", self.prefill_time)
        hist("vllm:request_decode_time_seconds", "Time from first to last token (s).", self.decode_time)
        hist("vllm:request_prefill_kv_computed_tokens", "Prompt tokens computed in prefill (not cached).",
             self.prefill_kv_computed)
        # cache config info (labels: the cache config, then engine; no model_name)
        head("vllm:cache_config_info", "gauge", "Information of the engine's CacheConfig.")
        info = ",".join(f'{k}="{_esc(str(v))}"' for k, v in self.cache_info.items())
        for e in shown:
            w(f'vllm:cache_config_info{{{info}{"," if info else ""}engine="{e}"}} 1.0\n')
        # the simulator's own
        for name, doc in (
            ("ascend_sim:balancedness", "Mean/max EP rank load over recent steps (1 = perfect)."),
            ("ascend_sim:speedup", "Factor dividing every modelled time."),
            ("ascend_sim:mean_step_modelled_seconds", "Mean modelled step time (before speedup)."),
        ):
            head(name, "gauge", doc)
            w(f'{name}{{model_name="{model}"}} {_num(g.get(name, 0.0))}\n')
        for name, doc, value in (
            ("ascend_sim:steps", "Engine steps run.", self.steps),
            ("ascend_sim:request_failures", "Requests answered with an error (faults, KV pulls).", self.failures),
            ("ascend_sim:kv_bytes_moved", "Modelled KV bytes sent or received over the PD link.",
             g.get("kv_bytes_moved", 0)),
            ("ascend_sim:kv_wire_bytes", "KV bytes that really crossed the socket.", g.get("kv_wire_bytes", 0)),
        ):
            head(name + "_total", "counter", doc)
            w(f'{name}_total{{model_name="{model}"}} {_num(value)}\n')
        head("ascend_sim:step_modelled_seconds", "histogram", "Modelled step time before speedup (s).")
        self.step.write(out, "ascend_sim:step_modelled_seconds", [f'model_name="{model}"'])
        return "".join(out).encode()
