"""Shared command-line options and error reporting for commands that read a stack."""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner import Plan, load_plan


def add_stack_options(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add ``--stack NAME`` and ``--stacks-dir DIR``."""
    parser.add_argument("--stack", required=required, metavar="NAME", help="stack name (stacks/Pulumi.<NAME>.yaml)")
    parser.add_argument(
        "--stacks-dir", metavar="DIR", default=None, help="stacks directory (default: $ASCEND_DEPLOY_STACKS or ./stacks of the project)"
    )


def plan_or_exit(args: argparse.Namespace) -> Plan | None:
    """Build the stack's Plan, or print the configuration problems to stderr and return None (exit 2)."""
    try:
        return load_plan(args.stack, args.stacks_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def input_error(field: str, message: str) -> int:
    """Report invalid input naming the option or field; returns exit code 2."""
    print(f"error: {field}: {message}", file=sys.stderr)
    return 2


def env_secret(flag: str, variable: str | None, what: str = "") -> tuple[str | None, int]:
    """The value of the environment variable an option names (``--token-env VAR``), or exit code 2.

    ``variable`` None (the option not given) gives ``(None, 0)``; a variable that is unset or empty
    is an input error naming ``flag``. ``what`` says what the value is, for the message.
    """
    if not variable:
        return None, 0
    value = os.environ.get(variable)
    if not value:
        return None, input_error(flag, f"variable {variable} is not set or empty{f' ({what})' if what else ''}")
    return value, 0


# --- argument checks shared by the commands (each returns exit code 2 after naming the flag, or None) ---

#: Levels ``--log-level`` accepts (the standard library's names; case ignored).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL", "NOTSET")


def check_number(flag: str, value: float | None, minimum: float = 0.0, strict: bool = True,
                 maximum: float | None = None) -> int | None:
    """``value`` (None: not given) finite and above ``minimum`` (``strict``) or at least it, at most ``maximum``."""
    if value is None:
        return None
    low_ok = value > minimum if strict else value >= minimum
    if not math.isfinite(value) or not low_ok or (maximum is not None and value > maximum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        if maximum is not None:
            bound += f" and <= {maximum:g}"
        return input_error(flag, f"must be a finite number {bound} (got {value!r})")
    return None


def check_count(flag: str, value: int | None, minimum: int = 1) -> int | None:
    """An integer option (None: not given) of at least ``minimum``."""
    if value is not None and value < minimum:
        return input_error(flag, f"must be {minimum} or more (got {value})")
    return None


def check_port(flag: str, value: int | None) -> int | None:
    """A TCP port to listen on or connect to (None: not given): 1..65535."""
    if value is not None and not 1 <= value <= 65535:
        return input_error(flag, f"must be a TCP port 1..65535 (got {value})")
    return None


def check_log_level(flag: str, value: str) -> int | None:
    """``--log-level``: one of :data:`LOG_LEVELS` (case ignored)."""
    if str(value).upper() not in LOG_LEVELS:
        return input_error(flag, f"unknown level {value!r}; use one of {', '.join(LOG_LEVELS)}")
    return None


def log_level(value: str) -> int:
    """The logging level of a checked ``--log-level`` value."""
    return getattr(logging, str(value).upper())


def check_http_url(flag: str, value: str | None) -> int | None:
    """An ``http://`` or ``https://`` URL with a host (None: not given)."""
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        scheme, host, _port = parts.scheme, parts.hostname, parts.port  # .port raises ValueError on a bad port
    except ValueError:
        scheme, host = "", None
    if scheme not in ("http", "https") or not host or any(c.isspace() for c in value):
        return input_error(flag, f"not an http(s) URL with a host: {value!r}; e.g. http://127.0.0.1:9000")
    return None


def check_bind_host(flag: str, value: str) -> int | None:
    """A listen address this machine can resolve (an IP address or a host name)."""
    try:
        socket.getaddrinfo(value, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        return input_error(flag, f"cannot listen on {value!r}: not an address or a host name this machine resolves; "
                           "e.g. 127.0.0.1 or 0.0.0.0")
    return None


def check_output_file(flag: str, value: str | None) -> int | None:
    """A file to write (None: not given): not a directory, in a directory that exists or can be created."""
    if value is None:
        return None
    path = Path(value)
    if path.is_dir():
        return input_error(flag, f"{value} is a directory; name the file to write")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not _can_create_in(parent):
        return input_error(flag, f"cannot write {value}: {parent} is not a directory this user can write; "
                           "name a file in a writable directory")
    return None


def _can_create_in(directory: Path) -> bool:
    """A file can be created in ``directory`` (tried with a temporary file, removed at once: root passes
    permission checks, yet /proc or a read-only mount still refuse)."""
    import tempfile  # noqa: PLC0415

    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def check_output_dir(flag: str, value: str | None) -> int | None:
    """A directory to create or write into (None: not given): not a file, under a writable existing directory."""
    if value is None:
        return None
    path = Path(value)
    if path.exists() and not path.is_dir():
        return input_error(flag, f"{value} exists and is not a directory; name a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not _can_create_in(existing):
        return input_error(flag, f"cannot create or write {value}: {existing} is not a directory this user can write")
    return None


def first_error(*codes: int | None) -> int | None:
    """The first exit code of several checks (each already printed its error), or None when all passed."""
    return next((code for code in codes if code is not None), None)
