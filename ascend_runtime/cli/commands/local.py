"""`ascend-deploy up | status | down`: the local stack (simulated NPUs, real processes, real HTTP)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from ascend_runtime.cli.stackargs import add_stack_options, plan_or_exit
from ascend_runtime.local.report import run_checks
from ascend_runtime.local.runner import (
    LocalStackError,
    UpOptions,
    bring_up,
    status_table,
    stop_all,
    wait_until_interrupted,
)
from ascend_runtime.local.state import StackState, default_state_root


def _state_dir(args: argparse.Namespace) -> Path:
    return Path(args.state_dir) if args.state_dir else default_state_root() / args.stack


def _add_common(parser: argparse.ArgumentParser) -> None:
    add_stack_options(parser)
    parser.add_argument("--state-dir", metavar="DIR", help="state and logs (default ~/.local/state/ascend-deploy/<stack>)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `up`, `status` and `down`."""
    up = subparsers.add_parser("up", help="start a local stack: simulators, proxy, balancer; check it; serve",
                               description="Start the stack's Plan as local processes on loopback with simulated NPUs, "
                               "wait until ready, run the smoke and a short throughput check, print a report, keep serving.")
    _add_common(up)
    up.add_argument("--detach", action="store_true", help="return once ready and checked; manage with status/down")
    up.add_argument("--no-checks", action="store_true", help="skip the smoke and throughput checks")
    up.add_argument("--num-prompts", type=int, help="throughput check prompts (default: the stack's throughput_check)")
    up.add_argument("--ready-timeout-s", type=float, default=90.0, help="seconds to wait for every process (default 90)")
    up.set_defaults(func=cmd_up)
    status = subparsers.add_parser("status", help="show the processes of a running local stack")
    _add_common(status)
    status.set_defaults(func=cmd_status)
    down = subparsers.add_parser("down", help="stop a local stack and every process it started")
    _add_common(down)
    down.set_defaults(func=cmd_down)


def cmd_up(args: argparse.Namespace) -> int:
    """Bring the stack up; exit 0 when ready and checks pass, 1 when a check fails, 2 on invalid input."""
    console = Console(stderr=True)
    plan = plan_or_exit(args)
    if plan is None:
        return 2
    if plan.target != "local":
        print(f"error: stack {plan.stack}: target is {plan.target!r}; `up` runs stacks whose target is 'local' "
              "(use `pulumi up` for kubernetes and kind)", file=sys.stderr)
        return 2
    state_dir = _state_dir(args)
    try:
        state = bring_up(plan, state_dir, UpOptions(ready_timeout_s=args.ready_timeout_s), console, args.stacks_dir)
    except LocalStackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"local stack {plan.stack} is up: proxy {plan.proxy_url} ({len(state.processes)} processes, state in {state_dir})")
    ok = True
    if not args.no_checks:
        report = run_checks(plan, state_dir, args.num_prompts)
        for line in report.lines:
            print(line)
        ok = report.passed
        print("checks: PASS" if ok else "checks: FAIL")
    if args.detach:
        print(f"detached; `ascend-deploy status --stack {plan.stack}` and `ascend-deploy down --stack {plan.stack}`")
        return 0 if ok else 1
    print("serving until interrupted (Ctrl-C)")
    why = wait_until_interrupted(state, console)
    print(f"stopping ({why})")
    stuck = stop_all(state)
    StackState.clear(state_dir)
    return 0 if ok and not stuck else 1


def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0 when every process is alive and healthy, 1 otherwise, 3 when the stack is not running."""
    state = StackState.load(_state_dir(args))
    if state is None:
        print(f"stack {args.stack} is not running (no state in {_state_dir(args)})")
        return 3
    table, healthy = status_table(state)
    Console(width=200).print(table)
    return 0 if healthy else 1


def cmd_down(args: argparse.Namespace) -> int:
    """Stop every recorded process group; exit 1 if one would not stop."""
    state_dir = _state_dir(args)
    state = StackState.load(state_dir)
    if state is None:
        print(f"stack {args.stack} is not running (no state in {state_dir})")
        return 0
    stuck = stop_all(state)
    if stuck:
        print(f"error: would not stop: {', '.join(stuck)}", file=sys.stderr)
        return 1
    StackState.clear(state_dir)
    print(f"stack {args.stack} is down ({len(state.processes)} processes stopped)")
    return 0
