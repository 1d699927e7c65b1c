"""Post-start checks of the local stack and the report comparing with the published figure.

The simulator divides all modelled time by ``speedup``, so latencies measured
on the local stack are ``1/speedup`` of the modelled ones and throughput is
``speedup`` times higher. The report converts back: real-time-equivalent
throughput = measured / speedup; SLOs are scaled by 1/speedup before the
goodput check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascend_runtime.checks import SLO, SmokeReport, ThroughputConfig, ThroughputResult, run_smoke_sync, run_throughput_sync
from ascend_runtime.checks.smoke import Instance
from ascend_runtime.planner.plan import Plan


@dataclass(frozen=True)
class LocalReport:
    """What `up` prints after the checks."""

    smoke: SmokeReport
    throughput: ThroughputResult | None
    lines: list[str]
    min_goodput: float = 0.0

    @property
    def passed(self) -> bool:
        """Smoke passed and the throughput check met its goodput threshold."""
        return self.smoke.passed and (self.throughput is None or self.throughput_ok)

    @property
    def throughput_ok(self) -> bool:
        """No failed requests and goodput at or above the stack's threshold."""
        if self.throughput is None:
            return True
        data = self.throughput.to_dict()
        return self.throughput.failed == 0 and (data.get("request_goodput") or 0.0) >= self.min_goodput


def throughput_config(plan: Plan, num_prompts: int | None = None, progress: bool = True) -> ThroughputConfig:
    """The stack's throughput-check shape, SLOs scaled by the simulator's speedup."""
    check, slo = plan.config["throughput_check"], plan.config["slo"]
    speedup = float(plan.config["simulator"]["speedup"]) if plan.target in ("local", "kind") else 1.0
    return ThroughputConfig(
        endpoint=plan.proxy_url,
        input_len=check["input_len"],
        output_len=check["output_len"],
        num_prompts=num_prompts or check["num_prompts"],
        concurrency=check["concurrency"],
        slo=SLO(ttft_ms=slo["ttft_ms"] / speedup, tpot_ms=slo["tpot_ms"] / speedup),
        npus=sum(i.npus for i in plan.by_role("decode")),
        progress=progress,
    )


def comparison_lines(plan: Plan, result: ThroughputResult) -> list[str]:
    """Per-NPU decode throughput in real-time terms against the published figure the stack names."""
    data = result.to_dict()
    speedup = float(plan.config["simulator"]["speedup"])
    decode_npus = sum(i.npus for i in plan.by_role("decode"))
    concurrency = min(plan.config["throughput_check"]["concurrency"], len(result.requests))
    per_npu = data["output_throughput"] / speedup / decode_npus
    published = plan.config["throughput_check"].get("published_decode_tokens_per_npu")
    lines = [
        f"throughput: {data['completed']} requests, output {data['output_throughput']:.0f} tok/s measured "
        f"(simulator speedup {speedup:g}x -> {data['output_throughput'] / speedup:.0f} tok/s real-time equivalent)",
        f"latency (real-time equivalent): median TTFT {data['median_ttft_ms'] * speedup:.0f} ms, "
        f"median TPOT {data['median_tpot_ms'] * speedup:.1f} ms, p99 ITL {data['p99_itl_ms'] * speedup:.1f} ms",
        f"decode per NPU: {per_npu:.1f} tok/s/NPU at {concurrency / decode_npus:.2f} sequences per NPU "
        f"({decode_npus} decode NPUs)",
    ]
    if published:
        lines.append(
            f"published figure for this hardware: {published:g} tok/s/NPU (at 72 sequences per NPU, 2K in + 2K out); "
            f"this run: {100 * per_npu / published:.1f}% of it at {concurrency / decode_npus:.2f} sequences per NPU. "
            "The simulator's calibration at the published operating point: docs/benchmarks.md (sim_calibration)."
        )
    goodput = data.get("request_goodput")
    if goodput is not None:
        lines.append(f"goodput: {goodput:.2f} req/s under TTFT <= {plan.config['slo']['ttft_ms']:g} ms, "
                     f"TPOT <= {plan.config['slo']['tpot_ms']:g} ms (real-time), threshold {plan.config['throughput_check']['min_goodput']:g}")
    return lines


def run_checks(plan: Plan, state_dir: Path, num_prompts: int | None = None, progress: bool = True) -> LocalReport:
    """Smoke (proxy and every instance of the Plan) then a short throughput check; result JSON in the state dir."""
    instances = [Instance(i.name, i.api_url, i.role) for i in plan.instances]
    smoke = run_smoke_sync(plan.proxy_url, instances=instances, timeout_s=30.0)
    lines = [item.line() for item in smoke.items]
    result = None
    if smoke.passed:
        result = run_throughput_sync(throughput_config(plan, num_prompts, progress))
        (state_dir / "throughput.json").write_text(json.dumps(result.to_dict(), indent=2, sort_keys=True))
        lines += comparison_lines(plan, result)
    return LocalReport(smoke, result, lines, float(plan.config["throughput_check"]["min_goodput"]))


def report_dict(report: LocalReport) -> dict[str, Any]:
    """JSON-ready report."""
    return {
        "passed": report.passed,
        "smoke": report.smoke.to_dict(),
        "throughput": report.throughput.to_dict() if report.throughput else None,
        "lines": report.lines,
    }
