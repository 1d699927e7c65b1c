"""Stop, start and replace one process of a running local stack, keeping state.json true.

The whole-stack launcher (``runner.start_all`` / ``stop_all``) starts and stops
everything; rollouts and the P:D planner change one simulator instance at a
time while the rest keep serving. Every change is recorded in ``state.json``
before this module returns, so ``status`` and ``down`` see what runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import aiohttp

from ascend_runtime.files.read import TOKEN, FileRefused, read_text
from ascend_runtime.local.processes import is_alive
from ascend_runtime.local.runner import LocalStackError, log_tail, ownership, signals_held, start_spec, started_record
from ascend_runtime.local.state import ProcessRecord, StackState
from ascend_runtime.local.stopping import stop_recorded
from ascend_runtime.local.topology import TOKEN_FILES, ProcessSpec, local_processes
from ascend_runtime.planner.plan import Plan


def read_tokens(state_dir: Path) -> dict[str, str]:
    """The admin tokens the running stack was started with (variable -> token), from their files; a missing file
    is a missing token, one that is no regular file of at most 4 KiB is a LocalStackError."""
    tokens = {}
    for env, name in TOKEN_FILES.items():
        try:  # the kit's reading door: a regular file of at most 4 KiB, never a FIFO or a device
            tokens[env] = read_text(state_dir / name, TOKEN).strip()
        except FileRefused as exc:
            if not exc.missing:
                raise LocalStackError(f"token file {exc}") from None
    return tokens


def process_spec(plan: Plan, state_dir: Path, name: str, stacks_dir: str | None = None,
                 extra_argv: Sequence[str] = ()) -> ProcessSpec:
    """The spec the launcher uses for process ``name`` (an instance name, ``proxy`` or ``balancer``).

    ``extra_argv`` is appended to its argv (for example simulator options of a new version).
    Raises KeyError naming the known processes when ``name`` is not one of them.
    """
    specs = {s.name: s for s in local_processes(plan, state_dir, stacks_dir)}
    if name not in specs:
        raise KeyError(f"no process {name!r} in stack {plan.stack}; known: {', '.join(sorted(specs))}")
    spec = specs[name]
    return replace(spec, argv=(*spec.argv, *extra_argv)) if extra_argv else spec


def record_of(state: StackState, name: str) -> ProcessRecord | None:
    """The running record called ``name``, or None."""
    return next((p for p in state.processes if p.name == name), None)


def stop_one(state: StackState, state_dir: Path, name: str, grace_s: float = 5.0) -> bool:
    """Stop process ``name`` (SIGTERM, then SIGKILL after ``grace_s`` s) and drop it from state.json.

    Returns False when it would not stop (its record is kept, so ``down`` tries again).
    A name that is not running is not an error: there is nothing to stop.
    """
    record = record_of(state, name)
    if record is None:
        return True
    with signals_held():  # signalled only while its pid is still the process that was started
        if not stop_recorded(record, grace_s=grace_s).down:
            return False
        state.processes = [p for p in state.processes if p.name != name]
        state.save(state_dir)
    return True


def start_one(state: StackState, state_dir: Path, spec: ProcessSpec) -> ProcessRecord:
    """Start ``spec`` with only the tokens it reads, and record it in state.json before returning."""
    if record_of(state, spec.name) is not None:
        raise LocalStackError(f"{spec.name} is already running in stack {state.stack}; stop it first")
    tokens = read_tokens(state_dir)
    missing = [t for t in spec.tokens if t not in tokens]
    if missing:
        raise LocalStackError(f"token files for {', '.join(missing)} are missing under {state_dir}; restart the stack")
    log = state_dir / "logs" / f"{spec.name}.log"
    with signals_held():
        pid = start_spec(spec, log, tokens)  # as the launcher starts it: its tokens and its own variables
        record = started_record(spec, pid, log)
        state.processes.append(record)
        state.save(state_dir)
    return record


async def wait_one_ready(record: ProcessRecord, timeout_s: float, poll_s: float = 0.2) -> None:
    """Wait until ``record`` is alive, answers 200 on its health URL and owns the listener.

    Raises LocalStackError with the log tail when it exits, or when ``timeout_s`` (s) passes.
    """
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
        while True:
            if not is_alive(record.pid):
                raise LocalStackError(f"{record.name} exited during start-up; last lines of {record.log}:\n"
                                      f"{log_tail(record.log)}")
            try:
                async with session.get(record.health_url) as resp:
                    healthy = resp.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                healthy = False
            if healthy and ownership(record)[0] is not False:
                return
            if time.monotonic() > deadline:
                raise LocalStackError(f"{record.name} not ready after {timeout_s:g} s; last lines of {record.log}:\n"
                                      f"{log_tail(record.log)}")
            await asyncio.sleep(poll_s)


async def replace_one(state: StackState, state_dir: Path, spec: ProcessSpec, ready_timeout_s: float = 60.0,
                      grace_s: float = 5.0) -> ProcessRecord:
    """Stop the process called ``spec.name``, start ``spec`` in its place and wait until it is ready."""
    if not stop_one(state, state_dir, spec.name, grace_s=grace_s):
        raise LocalStackError(f"{spec.name} would not stop; it is still recorded, `down` will retry")
    record = start_one(state, state_dir, spec)
    await wait_one_ready(record, ready_timeout_s)
    return record
