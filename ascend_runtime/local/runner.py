"""`up`, `status` and `down` of the local stack.

`up` first refuses ports that are taken (naming the port and the stack key
that sets it), then starts the Plan's processes (simulators, proxy, balancer)
in their own process groups, records each pid in the state file as soon as it
starts (so `down` always finds it), and waits with a progress display until
every process is ready: alive, its health URL answers 200, and the listening
socket behind that URL belongs to that very process (so another copy of the
stack on the same ports never passes for ours). Then it runs the smoke check
and a short throughput check. If any step before "ready" fails, everything
already started is stopped again: nothing is left half up.

Ctrl-C, SIGTERM and SIGHUP (terminal or SSH session closed) are handled alike
by :class:`SignalGuard`: they raise :class:`Interrupted` in the main thread, and
the caller stops every process it started. Starting a process and recording
its pid, and stopping processes, are :func:`signals_held` sections: a signal
arriving there takes effect when the section ends, so it never leaves a process
unrecorded or half stopped.

Each `up` writes fresh admin tokens to the state directory (owner-only, created
0600 in one step) and gives each process only the tokens it uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ascend_runtime.local.monitoring import write_monitoring_files
from ascend_runtime.local.processes import (
    http_ok,
    is_alive,
    listener_owner,
    owns_listener,
    port_taken,
    process_line,
    proxy_routes_all,
    start_process,
)
from ascend_runtime.config.errors import ConfigError
from ascend_runtime.files.read import FileRefused, read_tail
from ascend_runtime.files.write import OutputDir, OutputRefused
from ascend_runtime.local.identity import Verdict, identify, identity_after_start
from ascend_runtime.local.state import ProcessRecord, StackState
from ascend_runtime.local.stopping import StopOutcome, stop_recorded
from ascend_runtime.local.topology import (
    ENGINE_KINDS,
    TOKEN_FILES,
    ProcessSpec,
    listen_ports,
    local_processes,
    write_instances_file,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ascend_runtime.planner.plan import Plan

#: The signals `up` handles like Ctrl-C.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LocalStackError(RuntimeError):
    """The local stack could not be brought up (the message says which process and why)."""


class Interrupted(BaseException):
    """A stop signal arrived (SIGINT, SIGTERM or SIGHUP); like KeyboardInterrupt, not an Exception."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(self.signame)


#: Depth of :func:`signals_held` sections and the first stop signal that arrived inside one.
_held = {"depth": 0, "pending": 0}


class SignalGuard:
    """While entered, the first SIGINT, SIGTERM or SIGHUP raises :class:`Interrupted`; later ones are ignored
    (the caller is stopping by then).

    Inside :func:`signals_held` the first signal is remembered and raised when the section ends.
    ``received`` names the first signal. Previous handlers are restored on exit.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, object] = {}

    def _handler(self, signum: int, _frame: object) -> None:
        if self.received is not None:
            return
        self.received = signal.Signals(signum).name
        if _held["depth"]:
            _held["pending"] = signum
            return
        raise Interrupted(signum)

    def __enter__(self) -> SignalGuard:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        _held["pending"] = 0


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """A step a stop signal must not cut (start a process and record it; stop processes).

    Under a :class:`SignalGuard`, a signal arriving meanwhile raises :class:`Interrupted` when the
    outermost such section ends. (The signal mask is left alone: children would inherit it.)
    """
    _held["depth"] += 1
    try:
        yield
    finally:
        _held["depth"] -= 1
        if not _held["depth"] and _held["pending"]:
            signum, _held["pending"] = _held["pending"], 0
            raise Interrupted(signum)


@dataclass(frozen=True)
class UpOptions:
    """How `up` behaves; times in wall-clock seconds."""

    ready_timeout_s: float = 90.0


def log_tail(path: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file (for error messages); each run starts a fresh log."""
    try:  # the last MiB at most, whatever the log's size; never a FIFO or a device
        return "\n".join(read_tail(path).decode(errors="replace").splitlines()[-lines:])
    except FileRefused:
        return "(no log)"


def record_alive(record: ProcessRecord) -> bool:
    """True while the recorded process runs: its pid is the process `up` started (same start time and command
    line; :func:`~ascend_runtime.local.identity.identify`)."""
    return identify(record.pid, record.start_time, record.expected_cmdline())[0] is Verdict.SAME


def started_record(spec: ProcessSpec, pid: int, log: Path) -> ProcessRecord:
    """The record of a process just started from ``spec``, with its identity read from /proc (none when it
    exited at once: such a record is never signalled)."""
    now = identity_after_start(pid)
    return ProcessRecord(spec.name, spec.kind, pid, list(spec.argv), spec.health_url, str(log),
                         now.start_time if now else None, list(now.cmdline) if now else None)


def running_state(state_dir: Path) -> StackState | None:
    """The recorded state if any of its processes is still alive (:func:`record_alive`)."""
    state = StackState.load(state_dir)
    if state and any(record_alive(p) for p in state.processes):
        return state
    return None


def running_stacks(state_root: Path) -> dict[str, StackState]:
    """Stack name -> state of every stack under ``state_root`` with a live process."""
    found = {}
    try:
        entries = sorted(p for p in state_root.iterdir() if p.is_dir())
    except OSError:
        return {}
    for directory in entries:
        try:
            state = running_state(directory)
        except (OSError, ValueError, TypeError):
            continue
        if state:
            found[directory.name] = state
    return found


def taken_ports(plan: Plan) -> list[str]:
    """One line per address of the Plan's local processes that is already taken, naming its stack key."""
    problems = []
    for lp in listen_ports(plan):
        try:
            taken = port_taken(lp.host, lp.port)
        except OSError as exc:
            problems.append(f"{lp.describe()}: cannot bind: {exc.strerror or exc}")
            continue
        if taken:
            owner = listener_owner(lp.host, lp.port)
            holder = f"held by {process_line(owner)}" if owner else "in use"
            problems.append(f"{lp.describe()} is {holder}")
    return problems


def write_secret_file(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only, from the start (never visible with a wider mode).

    An existing file is replaced, never reused: a token that sat in a file with a wider mode
    may have been read.
    """
    with OutputDir(path.parent) as folder:  # a link at the name is removed, never followed
        fd = folder.create(path.name, 0o600, exclusive=True)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def write_tokens(state_dir: Path) -> dict[str, str]:
    """Fresh admin tokens, one file each in ``state_dir`` (:data:`TOKEN_FILES`); variable -> token."""
    tokens = {}
    for env, name in TOKEN_FILES.items():
        tokens[env] = secrets.token_hex(32)
        write_secret_file(state_dir / name, tokens[env] + "\n")
    return tokens


def start_spec(spec: ProcessSpec, log: Path, tokens: dict[str, str]) -> int:
    """Start one process of the stack: its tokens and its own variables (``spec.env``) on top of this
    environment, without the token variables and ``spec.unset``; returns the pid."""
    env = {name: tokens[name] for name in spec.tokens} | dict(spec.env)
    return start_process(spec.argv, log, env, unset=(*TOKEN_FILES, *spec.unset))


def start_all(plan: Plan, state_dir: Path, stacks_dir: str | None = None) -> StackState:
    """Start every process of the Plan, recording each pid immediately.

    On any failure or signal, the processes already started are stopped before the exception propagates.
    """
    specs = local_processes(plan, state_dir, stacks_dir)
    try:  # the state directory's files, before anything starts; never through a link planted there
        with OutputDir(state_dir, mode=0o700) as folder:
            folder.ensure_dir("logs")
        write_instances_file(plan, state_dir)
        tokens = write_tokens(state_dir)
        write_monitoring_files(plan, specs, state_dir)
    except OutputRefused as exc:
        raise LocalStackError(f"state directory: {exc}") from None
    state = StackState(stack=plan.stack, proxy_url=plan.proxy_url, started_at=time.time(),
                       speedup=float(plan.config["simulator"]["speedup"]))
    try:
        for spec in specs:
            log = state_dir / "logs" / f"{spec.name}.log"
            with signals_held():  # a signal here must not leave a started process unrecorded
                # only the tokens this process uses, none inherited from the caller's environment
                pid = start_spec(spec, log, tokens)
                state.processes.append(started_record(spec, pid, log))
                state.save(state_dir)
    except BaseException:
        stop_and_forget(state, state_dir)
        raise
    return state


def ownership(record: ProcessRecord) -> tuple[bool | None, int | None]:
    """(does the process own the listener of its health URL, and if not, which pid does)."""
    host, port = record.address()
    owned = owns_listener(record.pid, host, port)
    other = listener_owner(host, port) if owned is False else None
    return owned, other


async def wait_ready(state: StackState, timeout_s: float, console: Console) -> None:
    """Poll until every process is alive, answers 200 and owns its listening socket; LocalStackError otherwise."""
    import aiohttp  # noqa: PLC0415 - kept off the CLI's start-up path
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

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
                    # the proxy's /health turns 200 before it has probed the engines (it starts optimistic,
                    # then ejects those not up yet): it is ready once every engine is and it routes to all
                    if record.kind == "proxy" and any(p.kind in ENGINE_KINDS for p in pending.values()):
                        continue
                    if not await http_ok(session, record.health_url):
                        continue
                    owned, other = ownership(record)
                    if owned is False and other is not None and other != record.pid:
                        host, port = record.address()
                        raise LocalStackError(
                            f"{name}: {host}:{port} answers, but the listening socket belongs to {process_line(other)}, "
                            f"not to our {name} (pid {record.pid}); another process took the port. "
                            f"Last lines of {record.log}:\n{log_tail(record.log)}")
                    if owned is False:
                        continue  # answered through a socket we cannot attribute yet; look again
                    if record.kind == "proxy" and not await proxy_routes_all(session, record.health_url):
                        continue
                    del pending[name]
                    progress.advance(task)
                    progress.update(task, description=f"ready: {name}")
                if not pending:
                    break
                if time.monotonic() > deadline:
                    names = ", ".join(sorted(pending))
                    raise LocalStackError(f"not ready after {timeout_s:g} s: {names} (logs under {Path(state.processes[0].log).parent})")
                await asyncio.sleep(0.2)


def stop_all(state: StackState) -> list[StopOutcome]:
    """Stop every recorded process group in reverse start order, each only if its pid is still the process
    `up` started (:func:`~ascend_runtime.local.stopping.stop_recorded`); one outcome per record.

    Stop signals are held back meanwhile (:func:`signals_held`), so Ctrl-C cannot cut the stopping short.
    """
    with signals_held():
        return [stop_recorded(record) for record in reversed(state.processes)]


def stop_and_forget(state: StackState, state_dir: Path) -> list[str]:
    """Stop every process of ``state`` and remove the state file; names of the processes that may still run."""
    with signals_held():
        stuck = [outcome.name for outcome in stop_all(state) if not outcome.down]
        StackState.clear(state_dir)
    return stuck


def bring_up(plan: Plan, state_dir: Path, options: UpOptions, console: Console, stacks_dir: str | None = None) -> StackState:
    """Start the stack and wait until it is ready; on failure (or a signal) stop what was started and raise."""
    if running_state(state_dir):
        raise LocalStackError(f"stack {plan.stack} is already running (state in {state_dir}); run `ascend-deploy down --stack {plan.stack}` first")
    taken = taken_ports(plan)
    if taken:
        lines = "\n  - ".join(taken)
        raise LocalStackError(
            f"stack {plan.stack}: {len(taken)} of its ports are taken, nothing was started:\n  - {lines}\n"
            f"Stop whatever holds them (another copy of this stack: `ascend-deploy status`, `ascend-deploy down`), "
            f"or give this stack other ports under ascend-deepseek:ports in its stack file.")
    state = start_all(plan, state_dir, stacks_dir)
    try:
        asyncio.run(wait_ready(state, options.ready_timeout_s, console))
    except BaseException:
        stop_and_forget(state, state_dir)
        raise
    return state


def wait_while_serving(state: StackState, poll_s: float = 0.5, state_dir: Path | None = None,
                       replace_grace_s: float = 10.0) -> str:
    """Block until a process dies; returns which. Stop signals arrive as :class:`Interrupted` (a SignalGuard).

    With ``state_dir`` the processes are re-read from its state.json on every poll (``state.processes`` is
    updated), so a process that ``rollout`` replaced (lifecycle.stop_one, then start_one, each recording the
    change) is followed to its new pid instead of counting as an exit. A recorded pid that is dead counts as
    an exit once it has stayed recorded for ``replace_grace_s`` seconds (a replacement drops the record right
    after the process stops); state.json removed (``down`` from another shell) ends the wait at once.
    """
    dead_since: dict[tuple[str, int], float] = {}
    while True:
        if state_dir is not None:
            try:
                current = StackState.load(state_dir)
            except ConfigError:
                current = state  # unreadable for a moment: keep what we had
            if current is None:  # whoever removed it stopped the processes: nothing of ours is left to stop
                state.processes = []
                return f"the stack's state was removed from {state_dir} (`ascend-deploy down`?)"
            state.processes = current.processes
        now = time.monotonic()
        recorded = {(r.name, r.pid) for r in state.processes}
        dead_since = {k: t for k, t in dead_since.items() if k in recorded}
        for record in state.processes:
            if is_alive(record.pid):
                continue
            first = dead_since.setdefault((record.name, record.pid), now)
            if state_dir is None or now - first >= replace_grace_s:
                return f"{record.name} exited (log: {record.log})"
        time.sleep(poll_s)


def status_rows(state: StackState) -> list[dict[str, object]]:
    """Per process: name, kind, pid, alive, health 200, and whether the listener behind its health URL is its own."""

    async def probe() -> list[bool]:
        import aiohttp  # noqa: PLC0415

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as session:
            return [await http_ok(session, p.health_url) if record_alive(p) else False for p in state.processes]

    healthy = asyncio.run(probe())
    rows = []
    for record, ok in zip(state.processes, healthy):
        alive = record_alive(record)
        owned, other = ownership(record) if alive else (False, None)
        rows.append({"name": record.name, "kind": record.kind, "pid": record.pid, "alive": alive, "http": ok,
                     "owned": owned, "other": other, "log": record.log,
                     "healthy": alive and ok and owned is not False})
    return rows


def status_table(state: StackState) -> tuple[Table, bool]:
    """Per process: kind, pid, alive, healthy (200 from its own socket); and whether all are healthy."""
    from rich.table import Table  # noqa: PLC0415

    table = Table(title=f"local stack {state.stack} (proxy {state.proxy_url}, simulator speedup {state.speedup:g}x)")
    for column in ("process", "kind", "pid", "alive", "health", "log"):
        table.add_column(column)
    rows = status_rows(state)
    for row in rows:
        if not row["http"]:
            health = "DOWN"
        elif row["owned"] is False:
            health = f"NOT OURS ({process_line(row['other'])})" if row["other"] else "NOT OURS"  # type: ignore[arg-type]
        else:
            health = "200"
        table.add_row(str(row["name"]), str(row["kind"]), str(row["pid"]), "yes" if row["alive"] else "NO", health, str(row["log"]))
    return table, all(bool(r["healthy"]) for r in rows)
