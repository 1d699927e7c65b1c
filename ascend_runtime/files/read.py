"""The one way the kit reads a file an operator, a tool or another process could have put there.

:func:`read_bytes` opens the path without blocking (``O_NONBLOCK``: a FIFO's ``open`` would wait for a
writer) and refuses, naming the path, anything that is not a regular file once opened (``fstat`` of the
open descriptor, so the check and the read are of the same file): a directory, a FIFO, a socket, a
character device such as ``/dev/zero``, a block device. The size is checked against the kind's cap before
anything is read, and the read itself stops one byte past the cap (a file growing meanwhile, or a
``/proc`` file that reports size 0, cannot make it read more). :func:`read_text` adds UTF-8 with the line
of the first bad byte.

Caps, one per kind of file (:class:`FileKind`; docs/validation.md, files, lists them):

======================  =========  ==============================================================
kind                    cap        why
======================  =========  ==============================================================
stack, inventory, vars  32 MiB     a 16-pod CM384 inventory is about 2 MB
playbook                4 MiB      the shipped playbooks are a few KB
JSON input              64 MiB     a Plan of a 16-pod CM384 stack is a few MB
state file              8 MiB      ``state.json`` of a local stack is a few KB
known_hosts             16 MiB     some 100,000 host keys
expert-load dump        64 MiB     one rank's cumulative counts, layers x experts numbers
expert map              64 MiB     the published expert map the balancer replaces
``.npy`` load history   1 GiB      windows x layers x experts counts (:mod:`ascend_runtime.files.npy`)
rendered file           64 MiB     a file of a render, ``.ascend-render.json`` and ``plan.json``
token                   4 KiB      a 64-hex-digit admin token and a newline
log tail                1 MiB      the end of a process's log, read from its end
======================  =========  ==============================================================
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MiB = 1024 * 1024


@dataclass(frozen=True)
class FileKind:
    """A kind of file the kit reads: its name in messages, its size cap (bytes) and the fix for a wrong file."""

    name: str
    max_bytes: int
    fix: str


STACK_FILE = FileKind("stack file", 32 * MiB, "name the YAML file itself")
INVENTORY = FileKind("inventory", 32 * MiB, "name the YAML file itself")
VARS_FILE = FileKind("vars file", 32 * MiB, "name the YAML file itself")
PLAYBOOK = FileKind("playbook", 4 * MiB, "name the playbook's YAML file")
JSON_INPUT = FileKind("JSON input", 64 * MiB, "name the JSON file itself")
STATE_FILE = FileKind("state file", 8 * MiB, "name the stack's own state directory")
KNOWN_HOSTS = FileKind("known_hosts file", 16 * MiB, "name an OpenSSH known_hosts file")
EXPERT_DUMP = FileKind("expert-load dump", 64 * MiB, "the dumper writes one JSON file per rank")
EXPERT_MAP = FileKind("expert map", 64 * MiB, "name the engine's expert map file")
NPY_LOAD = FileKind(".npy load history", 1024 * MiB, "give a file numpy.save wrote")
RENDER_OUTPUT = FileKind("rendered file", 64 * MiB, "render into a new or empty folder")
TOKEN = FileKind("token file", 4096, "restart the stack to write fresh tokens")
LOG_TAIL = FileKind("log", MiB, "")

#: File types other than regular files, as an error names them.
_TYPES = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link"))


class FileRefused(ValueError):
    """A file the kit will not read: ``message`` names the path and what is wrong, ``hint`` the fix;
    ``missing`` when the path does not exist at all."""

    def __init__(self, message: str, hint: str = "", missing: bool = False) -> None:
        super().__init__(f"{message}; {hint}" if hint else message)
        self.message = message
        self.hint = hint
        self.missing = missing


def file_type(mode: int) -> str:
    """``a directory``, ``a FIFO (named pipe)``, ... for a non-regular ``st_mode``; ``a regular file`` else."""
    return next((name for test, name in _TYPES if test(mode)), "a regular file" if stat.S_ISREG(mode) else
                "not a regular file")


def _refuse_type(path: Path | str, mode: int, kind: FileKind) -> FileRefused:
    return FileRefused(f"{path} is {file_type(mode)}, not a regular file", kind.fix)


def open_regular(path: Path | str, kind: FileKind) -> tuple[int, os.stat_result]:
    """An open read-only descriptor of the regular file ``path`` (symlinks followed) and its ``fstat``;
    :class:`FileRefused` for a missing or unreadable path, any other file type, or a size over ``kind``'s cap.

    The type is checked with ``stat`` before opening (opening a device can act on it) and again with
    ``fstat`` on the descriptor (the path could have been replaced in between)."""
    try:
        before = os.stat(path)
    except FileNotFoundError:
        raise FileRefused(f"{path} does not exist", "check the name", missing=True) from None
    except OSError as exc:
        raise FileRefused(f"cannot read {path}: {exc.strerror or type(exc).__name__}", "check the path") from None
    if not stat.S_ISREG(before.st_mode):
        raise _refuse_type(path, before.st_mode, kind)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except PermissionError:
        raise FileRefused(f"cannot read {path}: permission denied", "make it readable by this user") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket (or a FIFO) put there after the stat
            raise FileRefused(f"{path} is not a regular file", kind.fix) from None
        raise FileRefused(f"cannot read {path}: {exc.strerror or type(exc).__name__}", "check the path") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse_type(path, info.st_mode, kind)
        if info.st_size > kind.max_bytes:
            raise FileRefused(f"{path} is {info.st_size} bytes, more than the {kind.max_bytes} a {kind.name} may have",
                              kind.fix)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_fd(fd: int, path: Path | str, kind: FileKind, limit: int | None = None) -> bytes:
    """At most ``limit`` (default the kind's cap) bytes from ``fd``; :class:`FileRefused` when the file holds
    more (it grew after the size check, or reported no size)."""
    cap = kind.max_bytes if limit is None else limit
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = os.read(fd, min(cap + 1 - total, MiB))
        except OSError as exc:
            raise FileRefused(f"cannot read {path}: {exc.strerror or type(exc).__name__}", "check the file") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > cap:
            raise FileRefused(f"{path} holds more than the {cap} bytes a {kind.name} may have", kind.fix)


def read_bytes(path: Path | str, kind: FileKind) -> bytes:
    """The whole content of the regular file ``path``, at most ``kind.max_bytes``; :class:`FileRefused` else."""
    fd, _ = open_regular(path, kind)
    try:
        return read_fd(fd, path, kind)
    finally:
        os.close(fd)


def decode_utf8(data: bytes, path: Path | str, bom: bool = False) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped when ``bom``); :class:`FileRefused` naming
    the line of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise FileRefused(f"{path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line})",
                          "save the file as UTF-8") from None


def read_text(path: Path | str, kind: FileKind, bom: bool = False) -> str:
    """The UTF-8 text of the regular file ``path`` (:func:`read_bytes`, :func:`decode_utf8`)."""
    return decode_utf8(read_bytes(path, kind), path, bom)


def read_head(path: Path | str, kind: FileKind, size: int) -> bytes:
    """The first ``size`` bytes (fewer when the file is shorter) of the regular file ``path``."""
    fd, _ = open_regular(path, kind)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def read_tail(path: Path | str, size: int = LOG_TAIL.max_bytes) -> bytes:
    """The last ``size`` bytes of the regular file ``path`` of any length (a log): never more is read."""
    fd, info = open_regular(path, FileKind(LOG_TAIL.name, 1 << 62, ""))
    try:
        os.lseek(fd, max(0, info.st_size - size), os.SEEK_SET)
        data = b""
        while len(data) < size:  # a log still being written: what is there now, at most ``size`` bytes
            chunk = os.read(fd, size - len(data))
            if not chunk:
                break
            data += chunk
        return data
    finally:
        os.close(fd)
