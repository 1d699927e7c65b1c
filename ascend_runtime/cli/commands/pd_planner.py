"""`ascend-deploy pd-planner`: size prefill and decode from the proxy's metrics (docs/pd-planner.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from ascend_runtime.cli.stackargs import add_stack_options, plan_or_exit


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `pd-planner` sub-command."""
    p = subparsers.add_parser("pd-planner", help="plan the prefill:decode instance split from proxy metrics")
    add_stack_options(p)
    p.add_argument("--proxy-metrics", metavar="URL", help="proxy metrics URL (default: the Plan's proxy URL + /metrics)")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between decisions (default 30)")
    p.add_argument("--dry-run", action="store_true", help="only log and export metrics; never publish a target")
    p.add_argument("--target-file", help="where a change is written as JSON (required without --dry-run)")
    p.add_argument("--prompt-tokens", type=float,
                   help="mean prompt tokens (the proxy exports none; default: throughput_check.input_len)")
    p.add_argument("--margin", type=float, default=0.15, help="relative margin a change must clear (default 0.15)")
    p.add_argument("--k", type=int, default=3, help="consecutive intervals a change must be wanted (default 3)")
    p.add_argument("--max-changes-per-hour", type=int, default=4)
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--metrics-port", type=int, help="serve the planner's Prometheus /metrics here")
    p.add_argument("--max-cycles", type=int, help="stop after this many cycles")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    """Build the planner from the stack's Plan and run it until interrupted."""
    from ascend_runtime.pdplanner.daemon import DaemonConfig, PDPlanner
    from ascend_runtime.pdplanner.decide import PlannerConfig
    from ascend_runtime.pdplanner.from_plan import (
        counts_from_plan,
        pool_from_plan,
        slo_from_plan,
    )

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.dry_run and not args.target_file:
        print("error: --target-file: give where targets are written, or --dry-run", file=sys.stderr)
        return 2
    if args.interval <= 0 or args.margin < 0 or args.k < 1 or args.max_changes_per_hour < 0:
        print("error: need --interval > 0, --margin >= 0, --k >= 1, --max-changes-per-hour >= 0", file=sys.stderr)
        return 2
    plan = plan_or_exit(args)
    if plan is None:
        return 2
    try:
        pool = pool_from_plan(plan)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    check = plan.config.get("throughput_check", {})
    cfg = DaemonConfig(
        metrics_url=args.proxy_metrics or plan.proxy_url + "/metrics", interval_s=args.interval, dry_run=args.dry_run,
        target_file=args.target_file, default_prompt_tokens=args.prompt_tokens or float(check.get("input_len", 2048)),
        default_output_tokens=float(check.get("output_len", 2048)), metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
    )
    planner = PlannerConfig(margin=args.margin, k_intervals=args.k, max_changes_per_hour=args.max_changes_per_hour)
    daemon = PDPlanner(cfg, pool, slo_from_plan(plan), planner, counts_from_plan(plan))
    try:
        asyncio.run(daemon.run(max_cycles=args.max_cycles))
    except KeyboardInterrupt:
        pass
    return 0
