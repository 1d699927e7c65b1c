"""State of a running local stack: one JSON file and a logs/ directory per stack.

Default location: ``$ASCEND_DEPLOY_STATE_DIR/<stack>`` or
``~/.local/state/ascend-deploy/<stack>``. The file records, per process, its
name, kind, pid (also its process group id), argv, health URL and log path, and the start time and command
line that identify the process before `down` signals it (``local/identity.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit


def default_state_root() -> Path:
    """Where stacks keep their state unless --state-dir says otherwise."""
    env = os.environ.get("ASCEND_DEPLOY_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ascend-deploy"


@dataclass
class ProcessRecord:
    """One started process: its name and kind in the stack, its pid (also its process group id), the argv it
    was started with, the URL its health is proven on, its log; and what identifies it on this boot, read
    from /proc once it runs (``local/identity.py``): ``start_time`` in clock ticks since boot and ``cmdline``,
    its command line as the kernel holds it. A record without them (an older state file) is identified by its
    argv alone."""

    name: str
    kind: str
    pid: int
    argv: list[str]
    health_url: str
    log: str
    start_time: int | None = None
    cmdline: list[str] | None = None

    def expected_cmdline(self) -> list[str]:
        """The command line the process must show to be this record's: the one read at start, or for a record
        written before identities were, the argv it was started with."""
        return self.cmdline if self.cmdline is not None else self.argv

    def address(self) -> tuple[str, int]:
        """Host and port of the health URL: the socket the process serves on and its readiness is proven on."""
        url = urlsplit(self.health_url)
        return url.hostname or "127.0.0.1", url.port or 80


@dataclass
class StackState:
    """Everything `status` and `down` need about a running local stack."""

    stack: str
    proxy_url: str
    processes: list[ProcessRecord] = field(default_factory=list)
    started_at: float = 0.0
    speedup: float = 1.0

    def save(self, directory: Path) -> None:
        """Write state.json atomically (temporary file and rename; a link planted at the name is replaced, never
        followed), creating the directory (mode 0700) when missing."""
        from ascend_runtime.files.write import OutputDir  # noqa: PLC0415

        with OutputDir(directory, mode=0o700) as out:
            out.write("state.json", json.dumps(asdict(self), indent=2, sort_keys=True), 0o600)

    @classmethod
    def load(cls, directory: Path) -> StackState | None:
        """Read state.json (through the kit's reading door: a regular file of at most 8 MiB, never a FIFO or a
        device), or None when there is none or it is empty: the stack is not running from this directory, or
        its state was lost (``down`` and ``status`` then look at the stack's ports)."""
        from ascend_runtime.config.errors import ConfigError  # noqa: PLC0415
        from ascend_runtime.files.jsondoc import parse_json  # noqa: PLC0415
        from ascend_runtime.files.read import STATE_FILE, FileRefused, decode_utf8, read_bytes  # noqa: PLC0415

        path = directory / "state.json"
        try:
            raw = read_bytes(path, STATE_FILE)
            if not raw.strip():
                return None
            return cls._from_dict(parse_json(decode_utf8(raw, path), path, "state"))
        except FileRefused as exc:
            if exc.missing:
                return None
            why = exc.message
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            why = str(exc) or type(exc).__name__
        raise ConfigError.single("--state-dir", f"{path} is not a state file `ascend-deploy up` wrote ({why[:160]})",
                                 hint="if no process of that stack runs, remove the file; else name the stack's "
                                 "own state directory") from None

    @classmethod
    def _from_dict(cls, data: object) -> StackState:
        """The state of a decoded state.json; ValueError naming what is wrong (a pid it would signal is checked:
        a whole number above 1 that is not this process's own group, so `down` never signals init or its caller)."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        processes = data.get("processes", [])
        if not isinstance(processes, list) or not all(isinstance(p, dict) for p in processes):
            raise ValueError("processes must be a list of objects")
        records = [ProcessRecord(**p) for p in processes]
        for record in records:
            # PID_MAX_LIMIT (4194304, include/linux/threads.h) bounds every pid; a larger one overflows kill(2)
            if type(record.pid) is not int or not 1 < record.pid <= 4194304 or record.pid == os.getpgrp():
                raise ValueError(f"process {record.name!r} has pid {record.pid!r}, no process group `down` may signal")
            if record.start_time is not None and (type(record.start_time) is not int or record.start_time < 0):
                raise ValueError(f"process {record.name!r} has start_time {record.start_time!r}, not clock ticks")
            if record.cmdline is not None and (not isinstance(record.cmdline, list)
                                               or not all(isinstance(a, str) for a in record.cmdline)):
                raise ValueError(f"process {record.name!r} has a cmdline that is not a list of strings")
            if not isinstance(record.health_url, str):
                raise ValueError(f"process {record.name!r} has a health_url that is not text")
        state = cls(**{**data, "processes": records})
        if not isinstance(state.stack, str) or not isinstance(state.proxy_url, str):
            raise ValueError("stack and proxy_url must be text")
        return state

    @staticmethod
    def clear(directory: Path) -> None:
        """Forget the stack (logs are kept for post-mortems)."""
        (directory / "state.json").unlink(missing_ok=True)
