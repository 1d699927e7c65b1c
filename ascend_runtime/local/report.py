"""Post-start checks of the local stack and the report comparing with the published figure.

Two clocks. The simulator divides all modelled time by ``speedup``, so on the
wall clock latencies are ``1/speedup`` of the modelled ones and rates are
``speedup`` times higher. The report speaks *real time* (what the modelled
NPUs would show): latencies = measured x speedup, rates (throughput, goodput)
= measured / speedup. The SLOs and ``min_goodput`` are real-time figures; the
load generator judges each request against the SLOs scaled by 1/speedup (wall
clock), and the goodput it counts per wall second is divided by ``speedup``
before it is compared with ``min_goodput``; the median TTFT and TPOT must be
within the SLOs too (a low ``min_goodput`` would pass a run most of whose
requests miss them).

Real time is only what the modelled NPUs would show when the simulators keep
their sped-up clock. :mod:`.host` measures how far they fell behind (the lag)
and who kept the CPUs busy; a throughput check that misses its goodput while
the host lagged is reported as INCONCLUSIVE with the host named as the cause,
not as a failure of the deployment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ascend_runtime.files.write import write_file
from ascend_runtime.local.host import (
    CpuUse,
    HostLoad,
    cpu_sample,
    load_average,
    mean_modelled_step,
    step_totals,
)

if TYPE_CHECKING:
    from ascend_runtime.checks import SmokeReport, ThroughputConfig, ThroughputResult
    from ascend_runtime.planner.plan import Plan

#: Published operating point of ``throughput_check.published_decode_tokens_per_npu`` (Huawei's A2 figure).
PUBLISHED_SEQS_PER_NPU = 72


@dataclass(frozen=True)
class LocalReport:
    """What `up` prints after the checks."""

    smoke: SmokeReport
    throughput: ThroughputResult | None
    lines: list[str]
    min_goodput: float = 0.0
    speedup: float = 1.0
    host: HostLoad | None = field(default=None)

    @property
    def goodput(self) -> float | None:
        """Requests per real-time second meeting every SLO (the wall-clock figure / speedup)."""
        if self.throughput is None:
            return None
        wall = self.throughput.to_dict().get("request_goodput")
        return None if wall is None else wall / self.speedup

    @property
    def latency_misses(self) -> list[str]:
        """Each median (TTFT, TPOT) over the stack's SLO, in real time: a run most of whose requests miss an
        SLO fails whatever ``min_goodput`` lets through."""
        if self.throughput is None:
            return []
        return [f"median {name} {median * self.speedup:.0f} ms > slo.{name.lower()}_ms {limit * self.speedup:g} ms "
                "(real time)" for name, median, limit in self.throughput.median_misses()]

    @property
    def throughput_ok(self) -> bool:
        """No failed requests, real-time goodput at or above the stack's threshold, medians within the SLOs."""
        if self.throughput is None:
            return True
        return (self.throughput.failed == 0 and (self.goodput or 0.0) >= self.min_goodput
                and not self.latency_misses)

    @property
    def verdict(self) -> str:
        """PASS; FAIL (smoke, failed requests, or goodput or a median over its SLO on a host that kept up);
        INCONCLUSIVE (goodput or a median missed while the host lagged)."""
        if not self.smoke.passed:
            return "FAIL"
        if self.throughput_ok:
            return "PASS"
        if self.throughput is not None and self.throughput.failed == 0 and self.host is not None and self.host.host_bound:
            return "INCONCLUSIVE"
        return "FAIL"

    @property
    def passed(self) -> bool:
        """Smoke passed and the throughput check met its goodput threshold."""
        return self.verdict == "PASS"

    def verdict_line(self) -> str:
        """``checks: PASS`` / ``checks: FAIL`` / ``checks: INCONCLUSIVE (...)`` with the reason."""
        verdict = self.verdict
        if verdict == "INCONCLUSIVE":
            assert self.host is not None
            return (f"checks: INCONCLUSIVE: the smoke check passed and no request failed, but "
                    f"{'; '.join(self._slo_reasons())} was measured while the simulators ran "
                    f"{self.host.lag:.1f}x behind their clock: {self.host.cause()}. This measures the host, not the "
                    "deployment; re-run on an idle host or with a lower simulator.speedup")
        if verdict == "FAIL" and self.smoke.passed and self.throughput is not None:
            failed = [f"{self.throughput.failed} requests failed"] if self.throughput.failed else []
            return "checks: FAIL (" + "; ".join(failed + self._slo_reasons()) + ")"
        if verdict == "FAIL":
            return "checks: FAIL (smoke check: " + "; ".join(i.name for i in self.smoke.failures) + ")"
        return "checks: PASS"

    def _slo_reasons(self) -> list[str]:
        """The goodput miss and the medians over the SLOs, in real time."""
        goodput = [f"goodput {self.goodput or 0.0:.3g} req/s < {self.min_goodput:g} (real time)"
                   ] if (self.goodput or 0.0) < self.min_goodput else []
        return goodput + self.latency_misses


def _speedup(plan: Plan) -> float:
    """How much faster than real time the stack's engines run: the simulator's speedup, else 1."""
    simulated = plan.target == "kind" or (plan.target == "local" and plan.config.get("local_engine", {}).get(
        "kind", "simulator") == "simulator")
    return float(plan.config["simulator"]["speedup"]) if simulated else 1.0


def throughput_config(plan: Plan, num_prompts: int | None = None, progress: bool = True) -> ThroughputConfig:
    """The stack's throughput-check shape, SLOs scaled by the simulator's speedup (wall clock)."""
    from ascend_runtime.checks import SLO, ThroughputConfig  # noqa: PLC0415

    check, slo = plan.config["throughput_check"], plan.config["slo"]
    speedup = _speedup(plan)
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


def tokens_per_step(plan: Plan) -> float:
    """Tokens a decoding sequence gets per step: 1, plus the accepted MTP draft token with MTP."""
    if not plan.config["decode"].get("mtp"):
        return 1.0
    from ascend_runtime.perf.sim_config import SimConfig  # noqa: PLC0415

    return 1.0 + float(SimConfig.model_fields["mtp_acceptance"].default)


def host_load(plan: Plan, result: ThroughputResult, steps_before: dict[str, tuple[float, float]],
              steps_after: dict[str, tuple[float, float]], cpu: CpuUse | None) -> HostLoad:
    """The simulators' lag behind their clock during the check, and the CPU use."""
    speedup = _speedup(plan)
    step_s = mean_modelled_step(steps_before, steps_after)
    tpot_s = result.to_dict()["median_tpot_ms"] / 1000.0
    lag = None
    if step_s and tpot_s > 0:
        lag = tpot_s * tokens_per_step(plan) / (step_s / speedup)
    return HostLoad(lag=lag, modelled_step_ms=step_s * 1000.0 if step_s else None, cpu=cpu, load_average=load_average())


def published_line(published: float, per_npu: float, seqs_per_npu: float, lag: float | None = None) -> str:
    """This run's per-NPU decode rate against the published figure, as the product of its two factors.

    per-NPU rate = sequences per NPU x tokens/s per sequence, so the share of the figure is the share of
    the published batch times the ratio of per-sequence rates; both are printed with their product, so the
    sentence holds whatever the run measured. ``lag``: how far the simulators fell behind, when the host did."""
    batch = seqs_per_npu / PUBLISHED_SEQS_PER_NPU
    per_seq, published_per_seq = per_npu / seqs_per_npu, published / PUBLISHED_SEQS_PER_NPU
    rate = per_seq / published_per_seq
    host = f"; on this host the simulators ran {lag:.1f}x behind their clock" if lag is not None else ""
    return (f"published figure for this hardware: {published:g} tok/s/NPU at {PUBLISHED_SEQS_PER_NPU} sequences per "
            f"NPU (2K in + 2K out); this run {100 * per_npu / published:.3g}% of it: the check keeps "
            f"{seqs_per_npu:.2f} sequences per NPU in flight against the published figure {PUBLISHED_SEQS_PER_NPU} "
            f"({100 * batch:.3g}% of its batch), and each sequence gets {per_seq:.3g} tok/s, {rate:.3g}x the "
            f"published point's {published_per_seq:.3g}; {100 * batch:.3g}% x {rate:.3g} = "
            f"{100 * batch * rate:.3g}%{host}. The check judges goodput under the SLOs, not this figure; the "
            "simulator's calibration at the published operating point is in docs/benchmarks.md (sim_calibration).")


def comparison_lines(plan: Plan, result: ThroughputResult, host: HostLoad | None = None) -> list[str]:
    """Throughput, latency, per-NPU decode throughput against the published figure, goodput; all in real time."""
    data = result.to_dict()
    speedup = _speedup(plan)
    decode_npus = sum(i.npus for i in plan.by_role("decode"))
    concurrency = min(plan.config["throughput_check"]["concurrency"], len(result.requests))
    seqs_per_npu = concurrency / decode_npus
    per_npu = data["output_throughput"] / speedup / decode_npus
    published = plan.config["throughput_check"].get("published_decode_tokens_per_npu")
    host_bound = host is not None and host.host_bound
    lines = [
        f"throughput: {data['completed']} requests, output {data['output_throughput']:.0f} tok/s per wall second "
        f"(simulator speedup {speedup:g}x -> {data['output_throughput'] / speedup:.0f} tok/s real time)",
        f"latency (real time, wall x {speedup:g}): median TTFT {data['median_ttft_ms'] * speedup:.0f} ms, "
        f"median TPOT {data['median_tpot_ms'] * speedup:.1f} ms, p99 ITL {data['p99_itl_ms'] * speedup:.1f} ms",
        f"decode per NPU: {per_npu:.1f} tok/s/NPU (real time) at {seqs_per_npu:.2f} sequences per NPU "
        f"({decode_npus} decode NPUs)",
    ]
    if published:
        lines.append(published_line(float(published), per_npu, seqs_per_npu, host.lag if host_bound else None))
    if host is not None:
        line = host.line(speedup)
        if line:
            lines.append(line)
    goodput = data.get("request_goodput")
    if goodput is not None:
        slo = plan.config["slo"]
        lines.append(
            f"goodput: {goodput / speedup:.3g} req/s real time ({goodput:.3g} per wall second / speedup {speedup:g}) "
            f"under TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} ms (real time; "
            f"{slo['ttft_ms'] / speedup:g} / {slo['tpot_ms'] / speedup:g} ms wall), "
            f"threshold {plan.config['throughput_check']['min_goodput']:g} req/s real time")
    return lines


def _stack_pids(state_dir: Path) -> list[int]:
    from ascend_runtime.local.state import StackState  # noqa: PLC0415

    state = StackState.load(state_dir)
    return [p.pid for p in state.processes] if state else []


def run_checks(plan: Plan, state_dir: Path, num_prompts: int | None = None, progress: bool = True) -> LocalReport:
    """Smoke (proxy and every instance of the Plan) then a short throughput check; result JSON in the state dir."""
    from ascend_runtime.checks import run_smoke_sync, run_throughput_sync  # noqa: PLC0415
    from ascend_runtime.checks.smoke import plan_endpoints  # noqa: PLC0415
    from ascend_runtime.local.topology import engine_kind  # noqa: PLC0415

    if engine_kind(plan) == "vllm-cpu":
        from ascend_runtime.local.vllm_engine.checks import run_real_engine_checks  # noqa: PLC0415

        return run_real_engine_checks(plan, state_dir, num_prompts, progress)
    instances = plan_endpoints(plan)  # with serving: rank, every DP rank's own server
    smoke = run_smoke_sync(plan.proxy_url, instances=instances, timeout_s=30.0)
    lines = [item.line() for item in smoke.items]
    result = None
    host = None
    if smoke.passed:
        decode_urls = [i.api_url for i in plan.by_role("decode")]
        pids = _stack_pids(state_dir)
        steps_before, cpu_before = step_totals(decode_urls), cpu_sample(pids)
        result = run_throughput_sync(throughput_config(plan, num_prompts, progress))
        cpu = CpuUse.between(cpu_before, cpu_sample(pids))
        host = host_load(plan, result, steps_before, step_totals(decode_urls), cpu)
        data = result.to_dict()
        data["local_report"] = {
            "speedup": _speedup(plan),
            "request_goodput_real_time": None if data["request_goodput"] is None else data["request_goodput"] / _speedup(plan),
            "simulator_lag": host.lag,
            "modelled_decode_step_ms": host.modelled_step_ms,
            "cpus_busy_stack": cpu.ours if cpu else None,
            "cpus_busy_others": cpu.others if cpu else None,
            "cpus": cpu.cpus if cpu else None,
            "load_average": host.load_average,
        }
        write_file(state_dir / "throughput.json", json.dumps(data, indent=2, sort_keys=True))
        lines += comparison_lines(plan, result, host)
    return LocalReport(smoke, result, lines, float(plan.config["throughput_check"]["min_goodput"]), _speedup(plan), host)


def report_dict(report: LocalReport) -> dict[str, Any]:
    """JSON-ready report."""
    return {
        "passed": report.passed,
        "verdict": report.verdict,
        "smoke": report.smoke.to_dict(),
        "throughput": report.throughput.to_dict() if report.throughput else None,
        "lines": report.lines,
    }
