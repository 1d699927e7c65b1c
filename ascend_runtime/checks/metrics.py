"""Per-request records and the aggregate metrics of ``vllm bench serve``.

Definitions (facts file, section 8; same as vLLM's ``benchmark_serving``):

- TTFT  = time of the first token event (a chunk with choices, empty text included) - send time.
- E2EL  = time of the last token event - send time, per request.
- TPOT  = (E2EL - TTFT) / (output tokens - 1), per request with > 1 output
  token; statistics are over requests.
- ITL   = gaps between consecutive token events, pooled over all requests.
- output throughput = all output tokens / duration; total token throughput =
  (input + output tokens) / duration; request throughput = completed / duration.
- goodput = completed requests meeting every given SLO (TTFT, TPOT, E2EL) per
  second of duration.  Requests with one output token have TPOT 0 for SLOs.

Times are stored in seconds and reported in milliseconds (``*_ms`` keys).
Statistics: mean, median, std (population, as numpy), and percentiles with
numpy's linear interpolation (vLLM's choice).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class RequestResult:
    """Timing of one streamed request; times in seconds (perf_counter)."""

    success: bool = False
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    content_chunks: int = 0
    usage_reported: bool = False
    error: str = ""
    start: float = 0.0

    @property
    def tpot(self) -> float:
        """(E2EL - TTFT) / (output tokens - 1) in seconds; 0 for <= 1 token."""
        if self.output_tokens > 1:
            return (self.latency - self.ttft) / (self.output_tokens - 1)
        return 0.0


@dataclass(frozen=True, slots=True)
class SLO:
    """Service-level objectives in milliseconds; None means not constrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @property
    def any(self) -> bool:
        """True when at least one objective is set."""
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def met_by(self, r: RequestResult) -> bool:
        """True when a successful request meets every objective that is set."""
        if not r.success:
            return False
        if self.ttft_ms is not None and r.ttft * 1000.0 > self.ttft_ms:
            return False
        if self.tpot_ms is not None and r.tpot * 1000.0 > self.tpot_ms:
            return False
        if self.e2el_ms is not None and r.latency * 1000.0 > self.e2el_ms:
            return False
        return True


def _stats(name: str, values_s: list[float], percentiles: tuple[float, ...]) -> dict[str, float]:
    """vLLM-named statistics of ``values_s`` (seconds) in milliseconds."""
    arr = np.asarray(values_s if values_s else [0.0], dtype=np.float64) * 1000.0
    out = {
        f"mean_{name}_ms": float(np.mean(arr)),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(np.std(arr)),
    }
    for p in percentiles:
        label = str(int(p)) if float(p).is_integer() else str(p)
        out[f"p{label}_{name}_ms"] = float(np.percentile(arr, p))
    return out


@dataclass
class ThroughputResult:
    """Aggregate result of one throughput run (vLLM bench key names in ``to_dict``)."""

    requests: list[RequestResult]
    duration: float
    slo: SLO = field(default_factory=SLO)
    npus: int | None = None
    percentiles: tuple[float, ...] = (99.0,)
    max_concurrent_requests: int = 0
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> list[RequestResult]:
        """The successful requests."""
        return [r for r in self.requests if r.success]

    @property
    def completed(self) -> int:
        """Number of successful requests."""
        return sum(1 for r in self.requests if r.success)

    @property
    def failed(self) -> int:
        """Number of failed requests."""
        return len(self.requests) - self.completed

    @property
    def request_goodput(self) -> float | None:
        """Requests meeting every SLO per second; None when no SLO is set."""
        if not self.slo.any:
            return None
        good = sum(1 for r in self.requests if self.slo.met_by(r))
        return good / self.duration if self.duration > 0 else 0.0

    def median_misses(self) -> list[tuple[str, float, float]]:
        """``(metric, median ms, SLO ms)`` for TTFT and TPOT whose median over the completed requests exceeds
        the SLO: more than half the requests miss it, whatever the goodput threshold lets through."""
        ok = self.ok
        medians = (("TTFT", [r.ttft for r in ok], self.slo.ttft_ms),
                   ("TPOT", [r.tpot for r in ok if r.output_tokens > 1], self.slo.tpot_ms))
        misses = []
        for name, values_s, limit_ms in medians:
            median_ms = float(np.median(values_s)) * 1000.0 if values_s else 0.0
            if limit_ms is not None and median_ms > limit_ms:
                misses.append((name, median_ms, limit_ms))
        return misses

    def to_dict(self, detailed: bool = False) -> dict[str, Any]:
        """The result JSON: vLLM bench keys plus ``failed``, ``errors`` and per-NPU figures."""
        ok = self.ok
        dur = self.duration if self.duration > 0 else float("nan")
        total_in = sum(r.prompt_tokens for r in ok)
        total_out = sum(r.output_tokens for r in ok)
        tpots = [r.tpot for r in ok if r.output_tokens > 1]
        itls = [x for r in ok for x in r.itl]
        errors = Counter(r.error for r in self.requests if not r.success)
        d: dict[str, Any] = dict(self.config)
        d.update(
            duration=self.duration,
            completed=len(ok),
            failed=self.failed,
            total_input_tokens=total_in,
            total_output_tokens=total_out,
            request_throughput=len(ok) / dur,
            request_goodput=self.request_goodput,
            output_throughput=total_out / dur,
            total_token_throughput=(total_in + total_out) / dur,
            max_concurrent_requests=self.max_concurrent_requests,
        )
        if self.npus:
            d["npus"] = self.npus
            d["per_npu_output_throughput"] = d["output_throughput"] / self.npus
            d["per_npu_total_token_throughput"] = d["total_token_throughput"] / self.npus
        d.update(_stats("ttft", [r.ttft for r in ok], self.percentiles))
        d.update(_stats("tpot", tpots, self.percentiles))
        d.update(_stats("itl", itls, self.percentiles))
        d.update(_stats("e2el", [r.latency for r in ok], self.percentiles))
        d["slo"] = {"ttft_ms": self.slo.ttft_ms, "tpot_ms": self.slo.tpot_ms, "e2el_ms": self.slo.e2el_ms}
        d["usage_missing"] = sum(1 for r in ok if not r.usage_reported)
        d["errors"] = [f"{msg} (x{n})" for msg, n in errors.most_common(20)]
        if detailed:
            d["input_lens"] = [r.prompt_tokens for r in self.requests]
            d["output_lens"] = [r.output_tokens for r in self.requests]
            d["ttfts"] = [r.ttft for r in self.requests]
            d["itls"] = [r.itl for r in self.requests]
            d["request_errors"] = [r.error for r in self.requests]
        return d
