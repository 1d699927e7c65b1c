"""`up`, `status` and `down` of the local stack.

`up` starts the Plan's processes (simulators, proxy, balancer) in their own
process groups, records each pid in the state file as soon as it starts (so
`down` always finds it), waits with a progress display until every health URL
answers 200, then runs the smoke check and a short throughput check. If any
step before "ready" fails, everything already started is stopped again:
nothing is left half up.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ascend_runtime.local.processes import http_ok, is_alive, start_process, stop_process_group
from ascend_runtime.local.state import ProcessRecord, StackState
from ascend_runtime.local.topology import PROXY_TOKEN_ENV, local_processes, write_instances_file
from ascend_runtime.planner.plan import Plan


class LocalStackError(RuntimeError):
    """The local stack could not be brought up (the message says which process and why)."""


@dataclass(frozen=True)
class UpOptions:
    """How `up` behaves; times in wall-clock seconds."""

    ready_timeout_s: float = 90.0


def log_tail(path: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file (for error messages)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def running_state(state_dir: Path) -> StackState | None:
    """The recorded state if any of its processes is still alive."""
    state = StackState.load(state_dir)
    if state and any(is_alive(p.pid) for p in state.processes):
        return state
    return None


def start_all(plan: Plan, state_dir: Path, stacks_dir: str | None = None) -> StackState:
    """Start every process of the Plan, recording each pid immediately."""
    state_dir.mkdir(parents=True, exist_ok=True)
    write_instances_file(plan, state_dir)
    token_file = state_dir / "admin-token"
    if not token_file.exists():
        token_file.write_text(secrets.token_hex(16))
        token_file.chmod(0o600)
    env = {PROXY_TOKEN_ENV: token_file.read_text().strip()}
    state = StackState(stack=plan.stack, proxy_url=plan.proxy_url, started_at=time.time(),
                       speedup=float(plan.config["simulator"]["speedup"]))
    for spec in local_processes(plan, state_dir, stacks_dir):
        log = state_dir / "logs" / f"{spec.name}.log"
        pid = start_process(spec.argv, log, env)
        state.processes.append(ProcessRecord(spec.name, spec.kind, pid, list(spec.argv), spec.health_url, str(log)))
        state.save(state_dir)
    return state


async def wait_ready(state: StackState, timeout_s: float, console: Console) -> None:
    """Poll every health URL until all answer 200; raise LocalStackError on a dead process or timeout."""
    pending = {p.name: p for p in state.processes}
    deadline = time.monotonic() + timeout_s
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} ready"), TimeElapsedColumn())
    timeout = aiohttp.ClientTimeout(total=2.0)
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"starting {len(pending)} processes", total=len(pending))
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while pending:
                for name, record in list(pending.items()):
                    if not is_alive(record.pid):
                        raise LocalStackError(f"{name} exited during start-up; last lines of {record.log}:\n{log_tail(record.log)}")
                    if await http_ok(session, record.health_url):
                        del pending[name]
                        progress.advance(task)
                        progress.update(task, description=f"ready: {name}")
                if not pending:
                    break
                if time.monotonic() > deadline:
                    names = ", ".join(sorted(pending))
                    raise LocalStackError(f"not ready after {timeout_s:g} s: {names} (logs under {Path(state.processes[0].log).parent})")
                await asyncio.sleep(0.2)


def stop_all(state: StackState) -> list[str]:
    """Stop every process group in reverse start order; returns names of processes that would not stop."""
    stuck = []
    for record in reversed(state.processes):
        if not stop_process_group(record.pid):
            stuck.append(record.name)
    return stuck


def bring_up(plan: Plan, state_dir: Path, options: UpOptions, console: Console, stacks_dir: str | None = None) -> StackState:
    """Start the stack and wait until it is ready; on failure stop what was started and raise."""
    if running_state(state_dir):
        raise LocalStackError(f"stack {plan.stack} is already running (state in {state_dir}); run `ascend-deploy down --stack {plan.stack}` first")
    state = start_all(plan, state_dir, stacks_dir)
    try:
        asyncio.run(wait_ready(state, options.ready_timeout_s, console))
    except BaseException:
        stop_all(state)
        StackState.clear(state_dir)
        raise
    return state


def wait_until_interrupted(state: StackState, console: Console) -> str:
    """Block until SIGINT/SIGTERM or a process dies; returns why."""
    stop = {"why": ""}

    def handler(signum: int, _frame: object) -> None:
        stop["why"] = signal.Signals(signum).name

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop["why"]:
            for record in state.processes:
                if not is_alive(record.pid):
                    stop["why"] = f"{record.name} exited (log: {record.log})"
                    break
            time.sleep(0.5)
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return stop["why"]


def status_table(state: StackState) -> tuple[Table, bool]:
    """Per process: kind, pid, alive, healthy; and whether all are healthy."""
    table = Table(title=f"local stack {state.stack} (proxy {state.proxy_url}, simulator speedup {state.speedup:g}x)")
    for column in ("process", "kind", "pid", "alive", "health", "log"):
        table.add_column(column)

    async def probe() -> list[bool]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            return [await http_ok(session, p.health_url) if is_alive(p.pid) else False for p in state.processes]

    healthy = asyncio.run(probe())
    for record, ok in zip(state.processes, healthy):
        alive = is_alive(record.pid)
        table.add_row(record.name, record.kind, str(record.pid), "yes" if alive else "NO",
                      "200" if ok else "DOWN", record.log)
    return table, all(healthy)
