"""Start, probe and stop local processes, each in its own process group."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp


def start_process(argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start ``argv`` detached in a new session, stdout+stderr appended to ``log_path``; returns the pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return proc.pid


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_process_group(pid: int, grace_s: float = 5.0) -> bool:
    """SIGTERM the process group led by ``pid``, SIGKILL after ``grace_s``; True when it is gone."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            _reap(pid)
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not is_alive(pid):
                return True
            time.sleep(0.05)
    _reap(pid)
    return not is_alive(pid)


async def http_ok(session: aiohttp.ClientSession, url: str) -> bool:
    """True when GET ``url`` answers 200 within the session's timeout."""
    try:
        async with session.get(url) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False
