"""Start, probe and stop local processes, each in its own process group.

Readiness is proven for our own process, not for whatever answers on a port:
:func:`listener_owner` reads the kernel's socket table (``/proc/net/tcp``,
``tcp6``) and the socket inodes under ``/proc/<pid>/fd`` to tell which process
holds a listening socket. :func:`port_taken` tries to bind a port the way the
servers will (``SO_REUSEADDR``, as asyncio does), so a port held by anything
else is refused before start.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ascend_runtime.files.write import OutputDir

if TYPE_CHECKING:
    import aiohttp

#: Suffix of the previous run's log, kept beside the current one.
PREVIOUS_LOG_SUFFIX = ".1"


def rotate_log(log_path: Path) -> None:
    """Keep the previous run's log as ``<log>.1`` so the current log holds this run only (a link is renamed
    as the name it is, never followed)."""
    with OutputDir(log_path.parent) as folder:
        folder.rename(log_path.name, log_path.name + PREVIOUS_LOG_SUFFIX)


def start_process(argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                  unset: Iterable[str] = ()) -> int:
    """Start ``argv`` detached in a new session, stdout+stderr to a fresh ``log_path``; returns the pid.

    The previous run's log is kept as ``<log_path>.1``. The process inherits this environment
    without the variables in ``unset``, plus ``env``.
    """
    rotate_log(log_path)
    inherited = {k: v for k, v in os.environ.items() if k not in set(unset)}
    with OutputDir(log_path.parent) as folder:  # created fresh: a link at the name is removed, never followed
        fd = folder.create(log_path.name)
    with os.fdopen(fd, "wb") as log:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**inherited, **(env or {})},
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


#: seconds a SIGKILLed process may take to go: it dies once it leaves the kernel, which a process in
#: uninterruptible I/O on a loaded machine (a vLLM server unmapping its shared memory) did only after 2 s
KILL_WAIT_S = 20.0


def stop_process_group(pid: int, grace_s: float = 5.0, still_ours: Callable[[], bool] | None = None) -> bool:
    """SIGTERM the process group led by ``pid``, SIGKILL after ``grace_s``; True when it is gone.

    ``still_ours``, when given, is asked before each signal: False (the pid now names another process) ends
    the stopping without a signal, the process that was ours being gone."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if still_ours is not None and not still_ours():
            return True
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
    import aiohttp  # noqa: PLC0415 - kept off the CLI's start-up path

    try:
        async with session.get(url) as resp:
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False


async def proxy_routes_all(session: aiohttp.ClientSession, url: str) -> bool:
    """True when the proxy's ``/health`` at ``url`` answers 200 with every instance of both roles routable
    (its JSON: ``{"prefill": {"total": N, "routable": N, ...}, "decode": {...}}``, docs/proxy.md)."""
    import aiohttp  # noqa: PLC0415 - kept off the CLI's start-up path

    try:
        async with session.get(url) as resp:
            if resp.status != 200:
                return False
            health = await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return False
    except ValueError:  # a 200 that is not JSON: nothing to wait for
        return True
    roles = [health.get(role) for role in ("prefill", "decode")] if isinstance(health, dict) else []
    counts = [r for r in roles if isinstance(r, dict) and "routable" in r and "total" in r]
    return all(r["routable"] == r["total"] for r in counts)  # a 200 without role counts: nothing to wait for


# --- who listens where ------------------------------------------------------------------------

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_WILDCARDS = {"0.0.0.0", "::"}


def _decode_address(hex_addr: str) -> tuple[str, int]:
    """``0100007F:4A38`` -> ('127.0.0.1', 19000); IPv6 words are in host byte order like IPv4."""
    ip_hex, port_hex = hex_addr.split(":")
    raw = bytes.fromhex(ip_hex)
    words = b"".join(int.from_bytes(raw[i:i + 4], "big").to_bytes(4, sys.byteorder) for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    host = socket.inet_ntop(family, words)
    if host.startswith("::ffff:") and "." in host:
        host = host[len("::ffff:"):]
    return host, int(port_hex, 16)


def listening_sockets(proc_net: Path = Path("/proc/net")) -> dict[int, tuple[str, int]] | None:
    """Inode -> (host, port) of every listening TCP socket; None where /proc/net/tcp does not exist."""
    found: dict[int, tuple[str, int]] = {}
    seen_table = False
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_net / name).read_text().splitlines()[1:]
        except OSError:
            continue
        seen_table = True
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == _LISTEN:
                found[int(fields[9])] = _decode_address(fields[1])
    return found if seen_table else None


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets ``pid`` holds open (empty when /proc/<pid>/fd cannot be read)."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _all_pids() -> list[int]:
    try:
        return [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return []


def _group_members(pgid: int) -> list[int]:
    members = []
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[2]) == pgid:
                    members.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return members


def _matches(bound: tuple[str, int], host: str, port: int) -> bool:
    return bound[1] == port and (bound[0] == host or bound[0] in _WILDCARDS)


def listener_inodes(host: str, port: int) -> set[int] | None:
    """Inodes of the listening sockets that accept connections to host:port; None without /proc."""
    table = listening_sockets()
    if table is None:
        return None
    return {inode for inode, bound in table.items() if _matches(bound, host, port)}


def listener_owner(host: str, port: int, candidates: Iterable[int] | None = None) -> int | None:
    """The pid holding the listening socket of host:port (among ``candidates``, else any process we can see)."""
    inodes = listener_inodes(host, port)
    if not inodes:
        return None
    for pid in (candidates if candidates is not None else _all_pids()):
        if socket_inodes(pid) & inodes:
            return pid
    return None


def owns_listener(pid: int, host: str, port: int) -> bool | None:
    """True when ``pid`` (or a process of its group) holds the listening socket of host:port.

    False when another socket holds it or nothing listens; None where /proc cannot tell (not Linux).
    """
    inodes = listener_inodes(host, port)
    if inodes is None:
        return None
    if not inodes:
        return False
    if socket_inodes(pid) & inodes:
        return True
    return any(socket_inodes(member) & inodes for member in _group_members(pid) if member != pid)


def process_line(pid: int) -> str:
    """``pid N (command line)`` for messages; the command line only when /proc shows it."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}"


def port_taken(host: str, port: int) -> bool:
    """True when binding host:port the way our servers do (SO_REUSEADDR) fails with EADDRINUSE."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False
