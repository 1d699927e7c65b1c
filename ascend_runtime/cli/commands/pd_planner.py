"""`ascend-deploy pd-planner`: size prefill and decode from the proxy's metrics (docs/pd-planner.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from ascend_runtime.cli.stackargs import (
    MAX_COUNT,
    add_stack_options,
    check_bind_host,
    check_count,
    check_env_name,
    check_http_url,
    check_input_dir,
    check_input_file,
    check_interval,
    check_log_level,
    check_number,
    check_output_file,
    check_port,
    check_proxy_service,
    first_error,
    input_error,
    log_level,
    path_arg,
    plan_or_exit,
    read_json,
)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `pd-planner` sub-command."""
    p = subparsers.add_parser("pd-planner", help="plan the prefill:decode instance split from proxy metrics")
    add_stack_options(p, required=False)
    p.add_argument("--plan-file", type=path_arg, help="the Plan as JSON (plan.json of `render`), instead of --stack (in a cluster)")
    p.add_argument("--proxy-metrics", metavar="URL", help="proxy metrics URL (default: the Plan's proxy URL + /metrics)")
    p.add_argument("--interval", type=float, default=30.0, help="seconds between decisions (0.01 to 86400, default 30)")
    p.add_argument("--dry-run", action="store_true", help="print what it decides each cycle and export metrics; never "
                   "publish a target or move a group")
    p.add_argument("--target-file", type=path_arg, help="where a change is written as JSON (required without --dry-run)")
    p.add_argument("--prompt-tokens", type=float,
                   help="mean prompt tokens, at least 1 (the proxy exports none; default: throughput_check.input_len)")
    p.add_argument("--margin", type=float, default=0.15, help="relative margin a change must clear (default 0.15)")
    p.add_argument("--k", type=int, default=3, help="consecutive intervals a change must be wanted (default 3)")
    p.add_argument("--max-changes-per-hour", type=int, default=4)
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--metrics-port", type=int, help="serve the planner's Prometheus /metrics here")
    p.add_argument("--max-cycles", type=int, help="stop after this many cycles (at most 2^20)")
    p.add_argument("--state-dir", type=path_arg, help="local target: the running stack's state directory "
                   "(default $ASCEND_DEPLOY_STATE_DIR/<stack>)")
    p.add_argument("--proxy-admin", metavar="NS/NAME:PORT",
                   help="kubernetes/kind: the proxy Service whose every replica is drained (default: the Plan's proxy)")
    p.add_argument("--token-env", default="ASCEND_PROXY_TOKEN",
                   help="variable holding the proxy admin token (kubernetes/kind; default ASCEND_PROXY_TOKEN)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=handler)


def _check_args(args: argparse.Namespace) -> int | None:
    """Every option's value, before the Plan is read or anything starts (exit 2 naming the flag)."""
    return first_error(
        input_error("--stack / --plan-file", "give exactly one") if bool(args.stack) == bool(args.plan_file) else None,
        check_log_level("--log-level", args.log_level),
        check_interval("--interval", args.interval),
        check_number("--margin", args.margin, 0.0, strict=False, maximum=1.0),
        check_count("--k", args.k, maximum=MAX_COUNT),
        check_count("--max-changes-per-hour", args.max_changes_per_hour, 0, maximum=3600),
        check_count("--max-cycles", args.max_cycles, maximum=MAX_COUNT),
        check_number("--prompt-tokens", args.prompt_tokens, 1.0, strict=False, maximum=MAX_COUNT),  # a mean: >= 1
        check_input_dir("--state-dir", args.state_dir),
        check_http_url("--proxy-metrics", args.proxy_metrics),
        check_port("--metrics-port", args.metrics_port),
        check_bind_host("--metrics-host", args.metrics_host) if args.metrics_port is not None else None,
        check_output_file("--target-file", args.target_file),
        check_input_file("--plan-file", args.plan_file),
        check_env_name("--token-env", args.token_env),
        check_proxy_service("--proxy-admin", args.proxy_admin),
    )


def handler(args: argparse.Namespace) -> int:
    """Build the planner from the stack's Plan and run it until interrupted."""
    from ascend_runtime.pdplanner.daemon import DaemonConfig, PDPlanner
    from ascend_runtime.pdplanner.decide import PlannerConfig
    from ascend_runtime.pdplanner.from_plan import (
        counts_from_plan,
        pool_from_plan,
        slo_from_plan,
    )

    bad = _check_args(args)
    if bad is not None:
        return bad
    if args.plan_file:
        from ascend_runtime.pdplanner.from_plan import plan_from_doc  # noqa: PLC0415

        doc, rc = read_json("--plan-file", args.plan_file, "plan.json")
        if rc:
            return rc
        try:
            plan = plan_from_doc(doc)
        except ValueError as exc:
            return input_error(f"--plan-file {args.plan_file}", f"{exc}; give the plan.json `ascend-deploy render` writes")
    else:
        plan = plan_or_exit(args)
        if plan is None:
            return 2
    try:
        pool = pool_from_plan(plan)
    except ValueError as exc:
        return input_error(f"--plan-file {args.plan_file}" if args.plan_file else "--stack", str(exc))
    logging.basicConfig(level=log_level(args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check = plan.config.get("throughput_check", {})
    cfg = DaemonConfig(
        metrics_url=args.proxy_metrics or plan.proxy_url + "/metrics", interval_s=args.interval, dry_run=args.dry_run,
        target_file=args.target_file, default_prompt_tokens=args.prompt_tokens or float(check.get("input_len", 2048)),
        default_output_tokens=float(check.get("output_len", 2048)), metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
    )
    if plan.flex_groups:
        return _run_pool(args, plan, cfg, pool)
    if not args.dry_run and not args.target_file:
        print("error: --target-file: give where targets are written, or --dry-run", file=sys.stderr)
        return 2
    planner = PlannerConfig(margin=args.margin, k_intervals=args.k, max_changes_per_hour=args.max_changes_per_hour)
    daemon = PDPlanner(cfg, pool, slo_from_plan(plan), planner, counts_from_plan(plan))
    prefill, decode = counts_from_plan(plan)
    _announce(args, plan, cfg.metrics_url, cfg.interval_s, f"{prefill} prefill + {decode} decode instances",
              f"writes a change to {args.target_file}")
    try:
        asyncio.run(daemon.run(max_cycles=args.max_cycles))
    except KeyboardInterrupt:
        pass
    _finished(args, daemon)
    return 0


def _announce(args: argparse.Namespace, plan, metrics_url: str, interval_s: float, split: str,  # type: ignore[no-untyped-def]
              acting: str) -> None:
    """One line on stdout saying what the planner reads, how often, and what it does with a decision."""
    stack = f"stack {plan.stack}" + (f" (from {args.plan_file})" if args.plan_file else "")
    does = "dry run: prints every decision, publishes nothing and moves nothing" if args.dry_run else acting
    cycles = f"; stops after {args.max_cycles} cycle(s)" if args.max_cycles else ""
    print(f"pd-planner: {stack}, {split}; reads {metrics_url} every {interval_s:g} s; {does}{cycles}", flush=True)


def _finished(args: argparse.Namespace, daemon) -> None:  # type: ignore[no-untyped-def]
    """The closing line: cycles run and changes decided (a dry run says nothing was applied)."""
    tail = " (dry run: none published or applied)" if args.dry_run else ""
    print(f"pd-planner: stopped after {daemon.cycles} decision(s), {daemon.changes} change(s){tail}", flush=True)


def _run_pool(args: argparse.Namespace, plan, cfg, pool) -> int:  # type: ignore[no-untyped-def]
    """pd_ratio auto: decide the split of the flexible groups and, unless --dry-run, move them."""
    import aiohttp  # noqa: PLC0415

    from ascend_runtime.pdplanner.actuate import ActuationError  # noqa: PLC0415
    from ascend_runtime.pdplanner.daemon import PDPlanner  # noqa: PLC0415
    from ascend_runtime.pdplanner.from_plan import (  # noqa: PLC0415
        group_pool_from_plan,
        planner_config_from_plan,
        slo_from_plan,
    )

    pd = plan.config["pd_ratio"]
    groups = group_pool_from_plan(plan)
    base = planner_config_from_plan(plan)
    # explicit options win over the stack's pd_ratio keys
    planner = type(base)(margin=args.margin if args.margin != 0.15 else base.margin,
                         k_intervals=args.k if args.k != 3 else base.k_intervals,
                         max_changes_per_hour=(args.max_changes_per_hour if args.max_changes_per_hour != 4
                                               else base.max_changes_per_hour))
    if args.interval == 30.0:
        cfg.interval_s = float(pd["interval_s"])
    fixed_prefill = [i for i in plan.by_role("prefill") if plan.flex_group_of(i.name) is None]

    async def main() -> int:
        async with aiohttp.ClientSession() as session:
            mover = None
            if not args.dry_run:
                try:
                    mover = await _mover(args, plan, session)
                except ActuationError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                    return 2
            layout = mover.layout if mover is not None else {g.name: g.initial for g in plan.flex_groups}

            def engine_urls() -> list[str]:
                names = [i.name for i in fixed_prefill] + [n for g in plan.flex_groups if layout[g.name] == "prefill"
                                                           for n in g.prefill]
                return [_engine_url(plan, n) for n in names]

            daemon = PDPlanner(cfg, pool, slo_from_plan(plan), planner, groups.counts(
                sum(1 for r in layout.values() if r == "prefill")), groups=groups, mover=mover, engine_urls=engine_urls)
            if mover is None:
                daemon.current_k = sum(1 for r in layout.values() if r == "prefill")
            in_prefill = sum(1 for r in layout.values() if r == "prefill")
            _announce(args, plan, cfg.metrics_url, cfg.interval_s,
                      f"{len(plan.flex_groups)} flexible group(s), {in_prefill} serving prefill",
                      "moves flexible groups between prefill and decode (drained first)")
            try:
                await daemon.run(max_cycles=args.max_cycles)
            finally:
                _finished(args, daemon)
        return 0

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return 0


def _engine_url(plan, name: str) -> str:  # type: ignore[no-untyped-def]
    """Where the planner reads an instance's /metrics: its API Service in a cluster, its address locally."""
    if plan.target == "local":
        return plan.instance(name).api_url
    from ascend_runtime.render.objects.common import Context  # noqa: PLC0415
    from ascend_runtime.render.objects.engine import api_service_url  # noqa: PLC0415

    return api_service_url(Context(plan, frozenset()), plan.instance(name))


async def _mover(args: argparse.Namespace, plan, session):  # type: ignore[no-untyped-def]
    """The GroupMover of the stack's target (local processes or Kubernetes replicas)."""
    import os  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from ascend_runtime.pdplanner.actuate import ActuationError, GroupMover, PlannerProxyAdmin  # noqa: PLC0415

    pd = plan.config["pd_ratio"]
    if plan.target == "local":
        from ascend_runtime.local.state import default_state_root  # noqa: PLC0415
        from ascend_runtime.pdplanner.actuate_local import LocalBackend, LocalMover  # noqa: PLC0415

        state_dir = Path(args.state_dir) if args.state_dir else default_state_root() / plan.stack
        backend = LocalBackend(plan, state_dir, getattr(args, "stacks_dir", None))
        return LocalMover(plan, backend, session, float(pd["drain_timeout_s"]), float(pd["ready_timeout_s"]))
    from ascend_runtime.faults.kube import KubeClient, from_environment  # noqa: PLC0415
    from ascend_runtime.faults.proxies import ProxyService  # noqa: PLC0415
    from ascend_runtime.pdplanner.actuate_k8s import KubeBackend  # noqa: PLC0415

    token = os.environ.get(args.token_env)
    if not token:
        raise ActuationError(f"--token-env {args.token_env}: the variable holding the proxy admin token is not set")
    namespace = plan.config["kubernetes"]["namespace"]
    kube = KubeClient(from_environment(), session, timeout_s=10.0)
    service = ProxyService.parse(args.proxy_admin or f"{namespace}/pd-proxy:{plan.proxy_port}")
    proxy = PlannerProxyAdmin(session, token, service=service, kube=kube, timeout_s=5.0)
    backend = KubeBackend(plan, kube, namespace)
    layout = await backend.read_layout()
    return GroupMover(plan, backend, proxy, layout, lambda n: _engine_url(plan, n), float(pd["drain_timeout_s"]),
                      float(pd["ready_timeout_s"]), poll_s=2.0)
