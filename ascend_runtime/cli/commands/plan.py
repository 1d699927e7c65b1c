"""`ascend-deploy plan`: show the deployment Plan of a stack as a table or JSON."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from ascend_runtime.cli.stackargs import add_stack_options, input_error, plan_or_exit
from ascend_runtime.planner import Plan
from ascend_runtime.planner.frontend_sizing import decode_front_end


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `plan` command."""
    parser = subparsers.add_parser("plan", help="validate a stack and show its Plan", description=__doc__)
    add_stack_options(parser)
    parser.add_argument("--json", action="store_true", help="print the Plan as deterministic JSON")
    parser.add_argument("--advise", action="store_true",
                        help="compare candidate per-stage layouts with the performance model (docs/modules.md)")
    parser.set_defaults(func=run)


def plan_table(plan: Plan) -> Table:
    """Per instance: role, nodes, NPUs, DP/TP/EP, ports, HBM estimate per NPU."""
    table = Table(title=f"Plan of stack {plan.stack}: {plan.hardware}, target {plan.target}, KV connector {plan.kv_connector}")
    for column in ("instance", "role", "nodes", "NPUs", "DP/TP/EP", "expert slots", "API", "KV ports", "HBM/NPU (GiB)"):
        table.add_column(column)
    for inst in plan.instances:
        pod = f" (super pod {inst.super_pod_id})" if inst.super_pod_id is not None else ""
        table.add_row(
            inst.name,
            inst.role,
            ", ".join(inst.nodes) + pod,
            str(inst.npus),
            f"{inst.dp}/{inst.tp}/{inst.ep}",
            str(inst.expert_slots_per_rank),
            f"{inst.api_host}:{inst.api_port}" + (f" +{len(inst.api_endpoints) - 1} ranks"
                                                  if inst.serving == "rank" and len(inst.api_endpoints) > 1 else ""),
            inst.kv_ports,
            f"{inst.memory.total_gib} / {inst.memory.budget_gib}",
        )
    return table


def summary_lines(plan: Plan) -> list[str]:
    """One line per role: instances, nodes and NPUs; HCCL_BUFFSIZE per role with its MC2 window need (MB)."""
    lines = []
    for role in ("prefill", "decode"):
        insts = plan.by_role(role)
        nodes = sum(len(i.ranks) for i in insts)
        npus = sum(i.npus for i in insts)
        lines.append(f"{role}: {len(insts)} instance(s), {npus} NPUs on {nodes} nodes")
    lines += [buf.describe() for buf in plan.hccl_buffers.values()]  # planner/hccl_buffer.py
    front = decode_front_end(plan.config)  # planner/frontend_sizing.py
    if front is not None:
        lines.append(front.describe())
    if any(i.serving == "rank" for i in plan.instances):  # docs/rank-serving.md
        for inst in plan.instances:
            ports = ", ".join(f"dp{e.dp_rank} {e.host}:{e.port}" for e in inst.api_endpoints)
            lines.append(f"{inst.name} API servers (rank serving, one per DP rank): {ports}")
    unused = [n.name for n in plan.nodes if n.role is None]
    lines.append(f"unused nodes: {', '.join(unused) if unused else 'none'}")
    lines.append(f"proxy: {plan.proxy_url}")
    if plan.instances:
        lines.append(plan.proxy.describe())  # planner/proxy_sizing.py
    return lines


def run(args: argparse.Namespace) -> int:
    """Print the Plan; exit 2 with the problems when the stack is invalid."""
    if getattr(args, "advise", False) and args.json:
        return input_error("--advise", "prints a text comparison; use it without --json")
    plan = plan_or_exit(args)
    if plan is None:
        return 2
    from ascend_runtime.config.errors import ConfigError  # noqa: PLC0415
    from ascend_runtime.engine.conformance import require_conformance  # noqa: PLC0415
    from ascend_runtime.planner.validation import require_engine_resources  # noqa: PLC0415

    try:
        require_engine_resources(plan)  # the engine pod fit render and pulumi refuse (docs/validation.md)
        require_conformance(plan)  # every rendered flag, key and env var exists in the release, as render checks
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from ascend_runtime.config.runtime_image import digest_warning  # noqa: PLC0415

    warning = digest_warning(plan.config)  # a prebuilt runtime image without a digest: allowed, not pinned
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if getattr(args, "advise", False):
        from ascend_runtime.planner.advise import advice_lines  # noqa: PLC0415

        print("\n".join(advice_lines(plan)))
        return 0
    if args.json:
        sys.stdout.write(plan.to_json())
        return 0
    console = Console(width=200)
    console.print(plan_table(plan))
    for line in summary_lines(plan):
        console.print(line)
    return 0
