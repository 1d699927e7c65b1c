"""`ascend-deploy up | status | down`: the local stack (simulated NPUs, real processes, real HTTP).

`status` and `down` without ``--stack`` act on the local stack that is
running (the one stack with live processes under the state root); with none
running they say so, with several they ask for ``--stack``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ascend_runtime.local.state import StackState


def _say(text: str, err: bool = False) -> None:
    """Print, ignoring a terminal that has gone away (SIGHUP: the SSH session or window was closed)."""
    try:
        print(text, file=sys.stderr if err else sys.stdout, flush=True)
    except (OSError, ValueError):
        pass


def _add_common(parser: argparse.ArgumentParser, stack_required: bool) -> None:
    from ascend_runtime.cli.stackargs import add_stack_options, path_arg  # noqa: PLC0415 - only when this command runs

    add_stack_options(parser, required=stack_required)
    parser.add_argument("--state-dir", metavar="DIR", type=path_arg,
                        help="state and logs (default $ASCEND_DEPLOY_STATE_DIR/<stack> or ~/.local/state/ascend-deploy/<stack>)")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `up`, `status` and `down`."""
    up = subparsers.add_parser("up", help="start a local stack: simulators, proxy, balancer; check it; serve",
                               description="Start the stack's Plan as local processes on loopback with simulated NPUs, "
                               "wait until ready, run the smoke and a short throughput check, print a report, keep serving. "
                               "Ctrl-C, SIGTERM and SIGHUP stop every process it started. Exit 0 ready and checks passed "
                               "(or stopped by a signal while serving), 1 a port taken, a process failed, a check failed "
                               "or was inconclusive, or interrupted before serving; 2 invalid input.")
    _add_common(up, stack_required=True)
    up.add_argument("--detach", action="store_true", help="return once ready and checked; manage with status/down")
    up.add_argument("--no-checks", action="store_true", help="skip the smoke and throughput checks")
    up.add_argument("--num-prompts", type=int, help="throughput check prompts (default: the stack's throughput_check)")
    up.add_argument("--ready-timeout-s", type=float, default=None,
                    help="seconds to wait for every process (default 90; 900 with local_engine.kind vllm-cpu)")
    up.set_defaults(func=cmd_up)
    status = subparsers.add_parser("status", help="show the processes of a running local stack",
                                   description="Per process: pid, alive, /health from its own socket. Without --stack: "
                                   "the local stack that is running. Exit 0 all healthy, 1 not running, not healthy, or "
                                   "its state lost while its ports answer; 2 unknown stack or several running.")
    _add_common(status, stack_required=False)
    status.set_defaults(func=cmd_status)
    down = subparsers.add_parser("down", help="stop a local stack and every process it started",
                                 description="Without --stack: the local stack that is running. A recorded process "
                                 "is signalled only while its pid is still the process `up` started (same start time "
                                 "and command line). Exit 0 stopped or not running; 1 something of the stack may still "
                                 "run (a process would not stop, a recorded pid is gone or another process while its "
                                 "port answers, or the state is lost while the stack's ports answer); 2 unknown stack "
                                 "or several running.")
    _add_common(down, stack_required=False)
    down.set_defaults(func=cmd_down)


def _stack_names(args: argparse.Namespace) -> tuple[Path | None, list[str]]:
    from ascend_runtime.config.loader import available_stacks, stacks_dir  # noqa: PLC0415

    try:
        directory = stacks_dir(args.stacks_dir)
        return directory, available_stacks(directory)
    except OSError:
        return None, []


def resolve_stack(args: argparse.Namespace, not_running_code: int) -> tuple[str, Path] | int:
    """(stack, state dir) that `status`/`down` act on, or the exit code after saying why there is none."""
    from ascend_runtime.local.runner import running_stacks  # noqa: PLC0415
    from ascend_runtime.local.state import StackState, default_state_root  # noqa: PLC0415

    if args.stack == "":
        _say("error: --stack: is empty; name a stack, or leave --stack out for the one that is running", err=True)
        return 2
    if args.state_dir:
        state_dir = Path(args.state_dir)
        if state_dir.exists() and not state_dir.is_dir():
            _say(f"error: --state-dir: {state_dir} is not a directory; name the stack's state directory", err=True)
            return 2
        state = StackState.load(state_dir)
        return (args.stack or (state.stack if state else state_dir.name)), state_dir
    root = default_state_root()
    if args.stack:
        state_dir = root / args.stack
        if (state_dir / "state.json").exists():
            return args.stack, state_dir
        directory, names = _stack_names(args)
        if args.stack not in names:
            running = ", ".join(running_stacks(root)) or "none"
            _say(f"error: --stack {args.stack}: no such stack in {directory} (stacks: {', '.join(names) or 'none'}; "
                 f"local stacks running: {running})", err=True)
            return 2
        return args.stack, state_dir
    running = running_stacks(root)
    if len(running) == 1:
        name = next(iter(running))
        return name, root / name
    if not running:
        _say(f"no local stack is running (state under {root}); start one with `ascend-deploy up --stack local`")
        return not_running_code
    _say(f"error: several local stacks are running: {', '.join(running)}; give --stack NAME", err=True)
    return 2


def _not_running(args: argparse.Namespace, stack: str, state_dir: Path, command: str) -> str:
    """``stack NAME is not running ...``; for a stack whose target is not local, what `status`/`down` see
    instead: its processes run on a cluster, which `pulumi` reports and `pulumi destroy` takes down."""
    from ascend_runtime.config.errors import ConfigError  # noqa: PLC0415
    from ascend_runtime.config.loader import load_stack  # noqa: PLC0415

    line = f"stack {stack} is not running (no state in {state_dir})"
    try:
        target = load_stack(stack, args.stacks_dir).config.target
    except (ConfigError, OSError):
        return line  # an unreadable stack file: the local state is all there is to report
    if target == "local":
        return line
    where = (f"stack {stack} is not running locally (no state in {state_dir}): `up`, `status` and `down` run the "
             f"local target only, and stack {stack} targets {target}")
    if command == "down":
        return f"{where}; its objects come down with `pulumi destroy -s {stack}`"
    return f"{where}; see its objects with `pulumi stack -s {stack}` and kubectl"


def _note(state_dir: Path, text: str) -> None:
    """Append a line to <state>/logs/up.log (read it when the terminal that ran `up` is gone)."""
    from ascend_runtime.files.write import OutputDir, OutputRefused  # noqa: PLC0415

    try:
        with OutputDir(state_dir) as folder:  # never through a link planted in the state directory
            fd = folder.create("logs/up.log", append=True)
        with os.fdopen(fd, "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
    except (OSError, OutputRefused):
        pass


def cmd_up(args: argparse.Namespace) -> int:
    """Bring the stack up; exit 0 when ready and checks pass, 1 when something failed, 2 on invalid input."""
    from rich.console import Console  # noqa: PLC0415

    from ascend_runtime.cli.stackargs import plan_or_exit  # noqa: PLC0415
    from ascend_runtime.local.runner import (  # noqa: PLC0415
        Interrupted,
        LocalStackError,
        SignalGuard,
        UpOptions,
        bring_up,
        stop_and_forget,
        wait_while_serving,
    )
    from ascend_runtime.local.state import default_state_root  # noqa: PLC0415
    from ascend_runtime.local.topology import engine_kind  # noqa: PLC0415

    from ascend_runtime.cli.stackargs import (  # noqa: PLC0415
        MAX_COUNT,
        check_count,
        check_duration,
        check_output_dir,
        first_error,
    )

    bad = first_error(check_duration("--ready-timeout-s", args.ready_timeout_s) if args.ready_timeout_s is not None else None,
                      check_count("--num-prompts", args.num_prompts, maximum=MAX_COUNT),
                      check_output_dir("--state-dir", args.state_dir))
    if bad is not None:  # before anything starts
        return bad
    console = Console(stderr=True)
    plan = plan_or_exit(args)
    if plan is None:
        return 2
    if plan.target != "local":
        _say(f"error: stack {plan.stack}: target is {plan.target!r}; `up` runs stacks whose target is 'local' "
             "(use `pulumi up` for kubernetes and kind)", err=True)
        return 2
    real_engine = engine_kind(plan) == "vllm-cpu"
    if real_engine:
        from ascend_runtime.local.vllm_engine import EngineNotReady, prepare  # noqa: PLC0415

        try:
            _say(f"stack {plan.stack}: real engine (vLLM CPU build); preparing the generated model")
            prepare(int(plan.config["local_engine"]["model_seed"]))
        except EngineNotReady as exc:
            _say(f"error: stack {plan.stack} (local_engine.kind: vllm-cpu): {exc}", err=True)
            return 1
    ready_timeout_s = args.ready_timeout_s or (900.0 if real_engine else 90.0)
    state_dir = Path(args.state_dir) if args.state_dir else default_state_root() / plan.stack
    if not args.state_dir and check_output_dir("--state-dir (default $ASCEND_DEPLOY_STATE_DIR/<stack>)", str(state_dir)):
        return 2
    state: StackState | None = None
    serving = died = False
    ok = True
    with SignalGuard() as guard:
        try:
            state = bring_up(plan, state_dir, UpOptions(ready_timeout_s=ready_timeout_s), console, args.stacks_dir)
            _say(f"local stack {plan.stack} is up: proxy {plan.proxy_url} ({len(state.processes)} processes, state in {state_dir})")
            if not args.no_checks:
                from ascend_runtime.local.report import run_checks  # noqa: PLC0415

                report = run_checks(plan, state_dir, args.num_prompts)
                for line in report.lines:
                    _say(line)
                _say(report.verdict_line())
                ok = report.passed
            if args.detach:
                _say(f"detached; `ascend-deploy status --stack {plan.stack}` and `ascend-deploy down --stack {plan.stack}`")
                return 0 if ok else 1
            serving = True
            _say("serving until interrupted (Ctrl-C, SIGTERM or SIGHUP stop every process)")
            why = wait_while_serving(state, state_dir=state_dir)
            died = True
            _say(f"stopping: {why}")
            stuck = stop_and_forget(state, state_dir)
            _note(state_dir, f"up: {why}; stopped {len(state.processes) - len(stuck)} processes")
            return 1
        except LocalStackError as exc:
            _say(f"error: {exc}", err=True)
            return 1
        except BaseException as exc:
            if guard.received is None and not isinstance(exc, Interrupted):
                if state is not None:
                    stop_and_forget(state, state_dir)
                raise
            name = guard.received or exc.signame  # type: ignore[attr-defined]
            stuck = stop_and_forget(state, state_dir) if state is not None else []
            when = "while serving" if serving else "before the stack was serving"
            message = (f"received {name} {when}: stopped every process this `up` started"
                       + (f" except {', '.join(stuck)}" if stuck else ""))
            _note(state_dir, f"up: {message}")
            _say(message, err=True)
            return 0 if serving and ok and not died and not stuck else 1


def _lost_state(args: argparse.Namespace, stack: str, state_dir: Path) -> str | None:
    """When no state records ``stack`` (no file, or an empty one) but addresses of its Plan answer: the
    message saying so, naming each address and its holder; None when nothing answers or the stack is no
    local stack that can be planned."""
    from ascend_runtime.config.errors import ConfigError  # noqa: PLC0415
    from ascend_runtime.config.loader import load_stack  # noqa: PLC0415
    from ascend_runtime.local.stopping import stack_ports_answering  # noqa: PLC0415
    from ascend_runtime.planner import build_plan  # noqa: PLC0415

    try:
        plan = build_plan(load_stack(stack, args.stacks_dir))
    except (ConfigError, OSError, ValueError):
        return None  # no Plan, no ports to look at: the local state is all there is to report
    if plan.target != "local":
        return None
    answering = stack_ports_answering(plan)
    if not answering:
        return None
    lines = "\n  - ".join(answering)
    return (f"stack {stack}: state lost (no state recorded in {state_dir}); processes may still run on ports "
            f"of the stack:\n  - {lines}\nNothing was signalled: `down` signals only the processes a state file "
            f"records, checked by start time and command line. Stop those processes yourself, then "
            f"`ascend-deploy up --stack {stack}` starts the stack afresh")


def cmd_status(args: argparse.Namespace) -> int:
    """Exit 0 when every process is alive and healthy from its own socket, 1 otherwise, not running, or its state
    lost while its ports answer; 2 unknown stack."""
    from rich.console import Console  # noqa: PLC0415

    from ascend_runtime.local.runner import status_table  # noqa: PLC0415
    from ascend_runtime.local.state import StackState  # noqa: PLC0415

    resolved = resolve_stack(args, not_running_code=1)
    if isinstance(resolved, int):
        return resolved
    stack, state_dir = resolved
    state = StackState.load(state_dir)
    if state is None:
        lost = _lost_state(args, stack, state_dir)
        _say(lost or _not_running(args, stack, state_dir, "status"), err=lost is not None)
        return 1
    table, healthy = status_table(state)
    Console(width=200).print(table)
    return 0 if healthy else 1


def cmd_down(args: argparse.Namespace) -> int:
    """Stop every recorded process group whose pid is still the process `up` started.

    Exit 0: nothing of the stack runs any more (stopped now, already gone, or never running). Exit 1: something
    of it may still run: a process would not stop, a recorded process is gone or replaced while its port still
    answers, or the state is lost while the stack's ports answer; the operator has to look, so the state file
    keeps what is unresolved. Exit 2: invalid input (an unknown stack, an unreadable state file)."""
    from ascend_runtime.local.runner import stop_all  # noqa: PLC0415
    from ascend_runtime.local.state import StackState  # noqa: PLC0415

    resolved = resolve_stack(args, not_running_code=0)
    if isinstance(resolved, int):
        return resolved
    stack, state_dir = resolved
    state = StackState.load(state_dir)
    if state is None:
        lost = _lost_state(args, stack, state_dir)
        if lost:
            _say(f"error: {lost}", err=True)
            return 1
        _say(_not_running(args, stack, state_dir, "down"))
        return 0
    outcomes = stop_all(state)
    for outcome in outcomes:
        if outcome.note != "stopped":
            _say(f"{'error: ' if not outcome.down else ''}{outcome.name}: {outcome.note}", err=not outcome.down)
    left = {o.name for o in outcomes if not o.down}
    if left:
        state.processes = [r for r in state.processes if r.name in left]
        state.save(state_dir)
        _say(f"error: stack {stack} is not down: {', '.join(sorted(left))} may still run (above); {state_dir}/state.json "
             "keeps them", err=True)
        return 1
    StackState.clear(state_dir)
    stopped = sum(o.note == "stopped" for o in outcomes)
    gone = f", {len(outcomes) - stopped} already gone" if stopped < len(outcomes) else ""
    _say(f"stack {stack} is down ({stopped} processes stopped{gone})")
    return 0
