"""Proxy metrics -> what the planner observes over one interval.

Reads the proxy's exposition (ascend_runtime/proxy/metrics.py, names ``ascend_proxy_*``):

- arrival rate (requests/s) = (delta requests_total + delta sum of inflight) / interval
  (requests_total counts finished requests; in-flight growth adds the ones still running);
- output tokens per request = delta itl_seconds_count / delta requests_total + 1
  (relayed chunks per request; one token per chunk when streamed, as vLLM streams);
- TTFT and TPOT percentiles (s) from the interval's ttft_seconds and itl_seconds
  histogram buckets (linear inside a bucket, as PromQL histogram_quantile);
- queue depth = sum of inflight{role="prefill"} (requests on prefill instances now);
- instances per role = engine instances with a series of instance_routable{role} of value 1. Under
  rank serving the proxy's series are per DP rank endpoint (``instance="decode-0-dp1"``) and
  ``rank_endpoint{instance,engine_instance}`` names the engine instance of each: the ranks of one
  instance count once, when at least one of them is routable.

The proxy exports no prompt length. The prompt length per request is read from the prefill
engines instead: vLLM's ``vllm:request_prompt_tokens`` histogram (``_sum`` / ``_count`` over the
interval, summed over instances and engine labels; registered in ``PrometheusStatLogger``,
vllm/v1/metrics/loggers.py, vLLM 0.23.0; the simulator exports the same family). A prefill
instance finishes every request after its one token, so its histogram holds every prompt. A
counter that went down (the instance restarted) is left out of that interval. With no engine
series at all, ``prompt_tokens`` is the configured default and ``missing`` names it; with
series but no request in the interval it is None (nothing to learn).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

P = "ascend_proxy_"


@dataclass
class Snapshot:
    """Cumulative series at one scrape (``time`` in seconds, monotonic)."""

    time: float
    requests: float | None = None
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # le (s) -> cumulative count
    itl_buckets: dict[float, float] = field(default_factory=dict)
    itl_count: float | None = None
    inflight: dict[str, float] = field(default_factory=dict)  # role -> sum over instances
    routable: dict[str, int] = field(default_factory=dict)  # role -> routable instances
    prompt_tokens_sum: float | None = None  # a prompt-token counter, if the proxy ever exports one
    #: prefill engine URL -> (vllm:request_prompt_tokens_sum, _count) at this scrape
    engine_prompts: dict[str, tuple[float, float]] = field(default_factory=dict)


def _samples(text: str, names: frozenset[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample of ``text`` (a Prometheus text exposition) named in ``names``;
    ``ValueError`` naming the sample for text that does not parse or a value that is not a finite number >= 0
    (every series the planner reads is a count, a sum of non-negative amounts, or a gauge of them)."""
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name not in names:
                continue
            value = float(sample.value)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{sample.name}{sample.labels or ''} is {value!r}, not a finite number >= 0")
            yield sample.name, sample.labels, value


def _le(name: str, labels: dict[str, str]) -> float:
    """The upper bound (seconds) of a histogram bucket sample; ``ValueError`` without a number in ``le``."""
    try:
        bound = float(labels["le"])
    except (KeyError, ValueError):
        raise ValueError(f"{name}{labels or ''} has no upper bound (le) that is a number") from None
    if math.isnan(bound):
        raise ValueError(f"{name}{labels} has no upper bound (le) that is a number")
    return bound


#: the proxy's series :func:`parse` reads
_PROXY_SERIES = frozenset(P + n for n in ("requests_total", "ttft_seconds_bucket", "itl_seconds_bucket",
                                          "itl_seconds_count", "inflight", "instance_routable", "prompt_tokens_total",
                                          "rank_endpoint"))
#: the engine's series :func:`parse_engine_prompts` reads
_ENGINE_SERIES = frozenset(("vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count"))


def parse(text: str, now: float) -> Snapshot:
    """Snapshot of a Prometheus text exposition of the proxy; ``ValueError`` (saying what) for one the
    planner cannot read: text that does not parse, a value of a series it reads that is not a finite
    number >= 0, a histogram bucket without a numeric ``le``."""
    s = Snapshot(now)
    routable: dict[tuple[str, str], bool] = {}  # (role, endpoint) -> routable now
    engine_of: dict[str, str] = {}  # rank endpoint -> its engine instance
    for name, labels, value in _samples(text, _PROXY_SERIES):
        if name == P + "requests_total":
            s.requests = (s.requests or 0.0) + value
        elif name == P + "ttft_seconds_bucket":
            s.ttft_buckets[_le(name, labels)] = value
        elif name == P + "itl_seconds_bucket":
            s.itl_buckets[_le(name, labels)] = value
        elif name == P + "itl_seconds_count":
            s.itl_count = value
        elif name == P + "inflight":
            s.inflight[labels.get("role", "")] = s.inflight.get(labels.get("role", ""), 0.0) + value
        elif name == P + "instance_routable":
            key = (labels.get("role", ""), labels.get("instance", ""))
            routable[key] = routable.get(key, False) or value >= 1
        elif name == P + "prompt_tokens_total":
            s.prompt_tokens_sum = (s.prompt_tokens_sum or 0.0) + value
        elif name == P + "rank_endpoint" and value >= 1 and labels.get("engine_instance"):
            engine_of[labels.get("instance", "")] = labels["engine_instance"]
    s.routable = routable_instances(routable, engine_of)
    return s


def routable_instances(routable: dict[tuple[str, str], bool], engine_of: dict[str, str]) -> dict[str, int]:
    """Role -> engine instances with at least one routable endpoint; ``routable``: (role, endpoint name) ->
    routable, ``engine_of``: rank endpoint -> its engine instance (an endpoint not in it is a whole instance).
    Every role with a series is a key (0 when none of its instances is routable)."""
    seen: dict[str, set[str]] = {}
    for (role, endpoint), ok in routable.items():
        groups = seen.setdefault(role, set())
        if ok:
            groups.add(engine_of.get(endpoint, endpoint))
    return {role: len(groups) for role, groups in seen.items()}


def parse_engine_prompts(text: str) -> tuple[float, float] | None:
    """(sum, count) of ``vllm:request_prompt_tokens`` over every label set of one engine's exposition; None
    without the series; ``ValueError`` as :func:`parse` for an exposition the planner cannot read."""
    total, count, seen = 0.0, 0.0, False
    for name, _, value in _samples(text, _ENGINE_SERIES):
        if name == "vllm:request_prompt_tokens_sum":
            total += value
        else:
            count += value
        seen = True
    return (total, count) if seen else None


def engine_prompt_mean(before: Snapshot, after: Snapshot) -> tuple[float | None, bool]:
    """(mean prompt tokens per request over the interval or None, whether any engine series exists)."""
    d_sum = d_count = 0.0
    for url, (s1, c1) in after.engine_prompts.items():
        if url not in before.engine_prompts:
            continue
        s0, c0 = before.engine_prompts[url]
        if c1 < c0 or s1 < s0:
            continue  # restarted during the interval
        d_sum, d_count = d_sum + s1 - s0, d_count + c1 - c0
    return (d_sum / d_count if d_count > 0 else None), bool(after.engine_prompts)


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """q-quantile (s) of the observations between two cumulative bucket sets; None if there were none."""
    if not after:
        return None
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    lo, prev = 0.0, 0.0
    for b, c in zip(bounds, counts):
        if c >= rank:
            if math.isinf(b):
                return lo  # above the last finite bound: report that bound
            return lo + (b - lo) * ((rank - prev) / (c - prev) if c > prev else 1.0)
        lo, prev = b, c
    return lo


@dataclass(frozen=True)
class Observation:
    """One interval. Rates in requests/s, lengths in tokens, latencies in seconds (None: no data)."""

    interval_s: float
    arrival_rate: float
    prompt_tokens: float | None
    output_tokens: float | None
    ttft_p50: float | None
    ttft_p90: float | None
    tpot_p50: float | None
    tpot_p90: float | None
    queue_depth: float | None
    instances: dict[str, int]
    missing: tuple[str, ...]


def observe(before: Snapshot, after: Snapshot, default_prompt_tokens: float) -> Observation:
    """The interval between two snapshots."""
    dt = max(1e-9, after.time - before.time)
    missing: list[str] = []
    if after.requests is None:
        missing.append(P + "requests_total")
    d_req = (after.requests or 0.0) - (before.requests or 0.0)
    d_inflight = sum(after.inflight.values()) - sum(before.inflight.values())
    if not after.inflight:
        missing.append(P + "inflight")
    rate = max(0.0, d_req + d_inflight) / dt
    out = None
    if after.itl_count is None:
        missing.append(P + "itl_seconds")
    elif d_req > 0:
        out = max(1.0, (after.itl_count - (before.itl_count or 0.0)) / d_req + 1.0)
    engine_prompt, engine_series = engine_prompt_mean(before, after)
    prompt: float | None
    if after.prompt_tokens_sum is not None and before.prompt_tokens_sum is not None and d_req > 0:
        prompt = (after.prompt_tokens_sum - before.prompt_tokens_sum) / d_req
    elif engine_series:
        prompt = engine_prompt
    else:
        missing.append("prompt_tokens (not exported by the proxy; configured default used)")
        prompt = default_prompt_tokens
    if not after.ttft_buckets:
        missing.append(P + "ttft_seconds")
    return Observation(
        interval_s=dt, arrival_rate=rate, prompt_tokens=prompt, output_tokens=out,
        ttft_p50=quantile(0.5, before.ttft_buckets, after.ttft_buckets),
        ttft_p90=quantile(0.9, before.ttft_buckets, after.ttft_buckets),
        tpot_p50=quantile(0.5, before.itl_buckets, after.itl_buckets),
        tpot_p90=quantile(0.9, before.itl_buckets, after.itl_buckets),
        queue_depth=after.inflight.get("prefill"), instances=dict(after.routable), missing=tuple(missing),
    )
