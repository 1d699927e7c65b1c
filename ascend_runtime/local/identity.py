"""Who a recorded pid is now: the process `up` started, or another one that reuses its number.

A pid is a number the kernel hands out again once its process has gone; ``state.json`` can also be edited
or left behind. So `up` records, for every process it starts, what identifies that very process on this
boot: its start time (``/proc/<pid>/stat`` field 22, clock ticks since boot) and its command line
(``/proc/<pid>/cmdline``, read once the process runs, as the kernel saw the exec: a script's interpreter
included). Before any signal, :func:`identify` reads both again and compares:

- ``same``: both match; the process group may be signalled;
- ``gone``: no such process (or a zombie);
- ``other``: the pid exists with another start time or command line; it is never signalled;
- ``unrecorded``: there is no command line to compare; never signalled either.

A record without a start time (``state.json`` of a kit before this check) is compared by its command line
alone, against the argv it was started with: weaker than the start time, it still never matches an unrelated
process, whose command line differs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

#: Index of the start time among the fields after the command name of /proc/<pid>/stat (field 22 of the whole
#: line; fields 1 and 2 are the pid and "(comm)", so field 3, the state, is index 0).
_START_TIME_INDEX = 22 - 3


class Verdict(Enum):
    """What a recorded pid is now (the module docstring says each)."""

    SAME = "same"
    GONE = "gone"
    OTHER = "other"
    UNRECORDED = "unrecorded"


@dataclass(frozen=True)
class ProcessIdentity:
    """What tells one process from any later one with its pid on this boot."""

    #: clock ticks since boot when the process started (/proc/<pid>/stat field 22)
    start_time: int
    #: the arguments the process runs with, as /proc/<pid>/cmdline holds them (NUL-separated)
    cmdline: tuple[str, ...]


def read_identity(pid: int, proc: Path = Path("/proc")) -> ProcessIdentity | None:
    """The identity of the live process ``pid``; None when there is none, it is a zombie, or /proc cannot
    tell (not Linux, or another user's process hidden from us)."""
    try:
        stat = (proc / str(pid) / "stat").read_bytes()
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(b")", 1)[-1].split()
    if len(fields) <= _START_TIME_INDEX or fields[0] == b"Z" or not fields[_START_TIME_INDEX].isdigit():
        return None
    args = raw.split(b"\0")
    if args and args[-1] == b"":
        args = args[:-1]
    return ProcessIdentity(int(fields[_START_TIME_INDEX]), tuple(a.decode(errors="replace") for a in args))


def identity_after_start(pid: int, timeout_s: float = 1.0, proc: Path = Path("/proc")) -> ProcessIdentity | None:
    """The identity of a process just started, once its command line shows: right after ``Popen`` returns it
    can still read empty (the parent of a ``vfork`` goes on when the child gives up the parent's memory, before
    ``execve`` has laid out the new program's arguments). Polled every 5 ms for at most ``timeout_s`` seconds;
    None when the process is gone by then, or shows no command line."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = read_identity(pid, proc)
        if now is None or now.cmdline or time.monotonic() > deadline:
            return now if now is not None and now.cmdline else None
        time.sleep(0.005)


def identify(pid: int, start_time: int | None, cmdline: list[str] | tuple[str, ...] | None,
             proc: Path = Path("/proc")) -> tuple[Verdict, ProcessIdentity | None]:
    """The :class:`Verdict` for a record of ``pid`` started at ``start_time`` (None: not recorded, the command
    line alone decides) with ``cmdline``, and what runs as ``pid`` now (None when nothing does)."""
    now = read_identity(pid, proc)
    if now is None:
        return Verdict.GONE, None
    if cmdline is None:
        return Verdict.UNRECORDED, now
    if (start_time is not None and now.start_time != start_time) or now.cmdline != tuple(cmdline):
        return Verdict.OTHER, now
    return Verdict.SAME, now


def describe(identity: ProcessIdentity, limit: int = 120) -> str:
    """``started at tick N: cmd args`` for messages (the command line cut to ``limit`` characters)."""
    line = " ".join(identity.cmdline)
    return f"started at tick {identity.start_time}: {line if len(line) <= limit else line[: limit - 3] + '...'}"
