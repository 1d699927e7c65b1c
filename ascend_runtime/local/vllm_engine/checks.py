"""`up`'s checks on the real-engine target: the smoke check (with the KV handover item) and a short
throughput check, reported in real time with no comparison against NPU figures (a tiny model on the CPU
says nothing about an Ascend deployment's speed; the simulator is what models that)."""

from __future__ import annotations

import json
from pathlib import Path

from ascend_runtime.files.write import write_file
from ascend_runtime.local.report import LocalReport, throughput_config
from ascend_runtime.planner.plan import Plan


def run_real_engine_checks(plan: Plan, state_dir: Path, num_prompts: int | None = None,
                           progress: bool = True) -> LocalReport:
    """Smoke (proxy, every instance, KV handover) then the stack's throughput check; JSON in the state dir."""
    from ascend_runtime.checks import run_smoke_sync, run_throughput_sync  # noqa: PLC0415
    from ascend_runtime.checks.smoke import Instance  # noqa: PLC0415

    instances = [Instance(i.name, i.api_url, i.role) for i in plan.instances]
    smoke = run_smoke_sync(plan.proxy_url, instances=instances, timeout_s=60.0)
    lines = [item.line() for item in smoke.items]
    result = None
    if smoke.passed:
        result = run_throughput_sync(throughput_config(plan, num_prompts, progress))
        data = result.to_dict()
        write_file(state_dir / "throughput.json", json.dumps(data, indent=2, sort_keys=True))
        lines.append(
            f"real engine (vLLM CPU build, generated model): {data['completed']} of {result.completed + result.failed} "
            f"requests, output {data['output_throughput']:.1f} tok/s, median TTFT {data['median_ttft_ms']:.0f} ms, "
            f"median TPOT {data['median_tpot_ms']:.1f} ms (real time; no NPU comparison on this engine)")
    return LocalReport(smoke, result, lines, float(plan.config["throughput_check"]["min_goodput"]), 1.0, None)
