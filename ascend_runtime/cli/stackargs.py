"""Shared command-line options and error reporting for commands that read a stack."""

from __future__ import annotations

import argparse
import logging
import math
import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from ascend_runtime.config.errors import MAX_DURATION_S, MIN_INTERVAL_S, ConfigError
from ascend_runtime.planner import Plan, load_plan


#: Longest file name component and path the kernel accepts (Linux NAME_MAX and PATH_MAX, bytes).
NAME_MAX = 255
PATH_MAX = 4096


def path_problem(value: str) -> str | None:
    """Why ``value`` cannot name a file or directory on this machine, or None: empty, a NUL byte or another
    control character (a newline pasted into a path), a component over NAME_MAX or a path over PATH_MAX bytes."""
    if not value.strip():
        return "is empty; name the file or directory (or leave the option out)"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return f"{value[:60]!r} holds a control character (a newline, tab or NUL); write the path on one line"
    try:
        encoded = os.fsencode(value)
    except UnicodeError:
        return f"{value[:60]!r} cannot be encoded as a file name on this machine"
    if len(encoded) > PATH_MAX or any(len(part) > NAME_MAX for part in encoded.split(b"/")):
        return (f"{value[:40]!r}... is longer than a path can be ({NAME_MAX} bytes a name, {PATH_MAX} a path); "
                "check the value")
    return None


def path_arg(value: str) -> str:
    """argparse ``type=`` of an option naming a file or directory: the text itself, or a usage error (exit 2)."""
    problem = path_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def path_arg_or_dash(value: str) -> str:
    """:func:`path_arg`, also accepting ``-`` (standard output)."""
    return value if value == "-" else path_arg(value)


def path_type(value: str) -> Path:
    """:func:`path_arg` giving a :class:`~pathlib.Path`."""
    return Path(path_arg(value))


def add_stack_options(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add ``--stack NAME`` and ``--stacks-dir DIR``."""
    parser.add_argument("--stack", required=required, metavar="NAME", help="stack name (stacks/Pulumi.<NAME>.yaml)")
    parser.add_argument(
        "--stacks-dir", metavar="DIR", default=None, type=path_arg,
        help="stacks directory (default: $ASCEND_DEPLOY_STACKS or ./stacks of the project)"
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


def check_duration(flag: str, value: float | None, minimum: float = 0.0, strict: bool = True,
                   maximum: float = MAX_DURATION_S, unit: str = "seconds") -> int | None:
    """A timeout, delay or deadline (None: not given): finite, above ``minimum`` (``strict``) or at least it, and
    at most ``maximum`` (default :data:`~ascend_runtime.config.errors.MAX_DURATION_S` seconds, a day; give
    ``unit="milliseconds"`` with ``maximum=MAX_DURATION_S * 1000`` for an SLO): ``1e308`` would overflow a
    timer or wait forever."""
    if value is None:
        return None
    low_ok = value > minimum if strict else value >= minimum
    if not math.isfinite(value) or not low_ok or value > maximum:
        low = f"> {minimum:g}" if strict else f">= {minimum:g}"
        longest = "a day" if maximum in (MAX_DURATION_S, MAX_DURATION_S * 1000) else "the longest it may be"
        return input_error(flag, f"must be {low} and <= {maximum:g} {unit} ({longest}), a finite number "
                           f"(got {value!r})")
    return None


def check_interval(flag: str, value: float | None) -> int | None:
    """A polling interval in seconds (None: not given): from :data:`~ascend_runtime.config.errors.MIN_INTERVAL_S`
    (shorter polls a service as fast as the loop runs) to a day."""
    return check_duration(flag, value, MIN_INTERVAL_S, strict=False)


def check_count(flag: str, value: int | None, minimum: int = 1, maximum: int | None = None) -> int | None:
    """An integer option (None: not given) of at least ``minimum`` and, when given, at most ``maximum``."""
    if value is not None and value < minimum:
        return input_error(flag, f"must be {minimum} or more (got {value})")
    if value is not None and maximum is not None and value > maximum:
        return input_error(flag, f"must be {maximum} or less (got {value})")
    return None


#: Upper bound of counts a command sizes memory or threads by (requests, tokens, experts, cycles of work).
MAX_COUNT = 1 << 20


def check_env_name(flag: str, value: str | None) -> int | None:
    """An option naming an environment variable (None: not given): ``[A-Za-z_][A-Za-z0-9_]*``."""
    from ascend_runtime.config.errors import is_env_name  # noqa: PLC0415

    if value is not None and not is_env_name(value):
        return input_error(flag, f"{value[:60]!r} is not an environment variable name; e.g. ASCEND_PROXY_TOKEN")
    return None


def check_dns_label(flag: str, value: str | None, what: str = "a Kubernetes namespace") -> int | None:
    """An option naming a Kubernetes object or namespace (None: not given): a DNS-1123 label."""
    from ascend_runtime.config.errors import is_dns_label, suggest_label  # noqa: PLC0415

    if value is not None and not is_dns_label(value):
        return input_error(flag, f"{value[:60]!r} is not {what} (a DNS-1123 label: lowercase letters, digits and '-', "
                           f"at most 63 characters); e.g. {suggest_label(value)!r}")
    return None


def check_text(flag: str, value: str | None, what: str = "a name") -> int | None:
    """A free-text option that reaches headers, logs or URLs (None: not given): 1 to 256 characters without
    spaces or control characters."""
    if value is not None and (not value or len(value) > 256 or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F
                                                                    for c in value)):
        return input_error(flag, f"{value[:60]!r} is not {what}: 1 to 256 characters without spaces or control characters")
    return None


def check_input_file(flag: str, value: str | None, directory_ok: bool = False) -> int | None:
    """A file to read (None: not given): exists and is a regular file (or, ``directory_ok``, a directory);
    never a FIFO or device, which would block or never end."""
    code, path = _checked_path(flag, value)
    if path is None:
        return code
    try:
        info = path.stat()
    except FileNotFoundError:
        return input_error(flag, f"{value} does not exist; check the name")
    except OSError as exc:
        return input_error(flag, f"cannot read {value}: {exc.strerror or type(exc).__name__}; check the path")
    import stat  # noqa: PLC0415

    if stat.S_ISDIR(info.st_mode):
        return None if directory_ok else input_error(flag, f"{value} is a directory; name the file itself")
    if not stat.S_ISREG(info.st_mode):
        return input_error(flag, f"{value} is not a regular file (a device, FIFO or socket); name a file")
    if not os.access(path, os.R_OK):
        return input_error(flag, f"cannot read {value}: permission denied; make it readable by this user")
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
    if scheme not in ("http", "https") or not host or any(c.isspace() for c in value) or _port == 0:
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


def _checked_path(flag: str, value: str | None) -> tuple[int | None, Path | None]:
    """(None, None) when the flag was not given; (exit code 2, None) for a path no file can have
    (:func:`path_problem`, the error printed); else (None, the path) to check further."""
    if value is None:
        return None, None
    problem = path_problem(value)
    if problem:
        return input_error(flag, problem), None
    return None, Path(value)


def check_output_file(flag: str, value: str | None) -> int | None:
    """A file to write (None: not given): not a directory, in a directory that exists or can be created."""
    code, path = _checked_path(flag, value)
    if path is None:
        return code
    if path.is_dir():
        return input_error(flag, f"{value} is a directory; name the file to write")
    if path.exists() and not path.is_file():  # a device, FIFO or socket: an atomic write would replace it
        return input_error(flag, f"{value} exists and is not a regular file (a device, FIFO or socket); "
                           "name a regular file to write")
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
    code, path = _checked_path(flag, value)
    if path is None:
        return code
    if path.exists() and not path.is_dir():
        return input_error(flag, f"{value} exists and is not a directory; name a directory")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not _can_create_in(existing):
        return input_error(flag, f"cannot create or write {value}: {existing} is not a directory this user can write")
    return None


def check_input_dir(flag: str, value: str | None) -> int | None:
    """A directory to read (None: not given): exists and is a directory."""
    code, path = _checked_path(flag, value)
    if path is None:
        return code
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        return input_error(flag, f"{value} {what}; name an existing directory")
    return None


def read_json(flag: str, value: str, what: str = "JSON") -> tuple[object, int]:
    """The decoded JSON document of the file ``value``, or ``(None, 2)`` after an error naming ``flag``.

    Read through the kit's one reading door (:func:`ascend_runtime.files.jsondoc.read_json`, kind
    :data:`~ascend_runtime.files.read.JSON_INPUT`): refused, each with the fix, a path that is no regular file
    (a FIFO, a device, a directory), one over 64 MiB, text that is not UTF-8 (a leading byte-order mark is
    accepted), a syntax error (line and column), a key given twice in one object, nesting too deep for the
    decoder, a whole number too long to convert. ``what`` names the document for the hint."""
    from ascend_runtime.files.jsondoc import read_json as read_document  # noqa: PLC0415
    from ascend_runtime.files.read import JSON_INPUT, FileRefused  # noqa: PLC0415

    try:
        return read_document(value, JSON_INPUT, what), 0
    except FileRefused as exc:
        return None, input_error(flag, str(exc))


def write_output(flag: str, value: str, text: str) -> int | None:
    """Write ``text`` to the file ``value`` (checked with :func:`check_output_file`), creating its directory;
    exit code 2 naming ``flag`` when it cannot be written after all, else None."""
    from ascend_runtime.files.write import OutputRefused, write_file  # noqa: PLC0415

    try:  # temporary file and rename beside it: a link at the name is replaced, never written through
        write_file(Path(value), text)
    except OutputRefused as exc:
        return input_error(flag, str(exc))
    except OSError as exc:
        return input_error(flag, f"cannot write {value}: {exc.strerror or type(exc).__name__}; "
                           "name a file in a directory this user can write")
    return None


def first_error(*codes: int | None) -> int | None:
    """The first exit code of several checks (each already printed its error), or None when all passed."""
    return next((code for code in codes if code is not None), None)


def check_proxy_service(flag: str, value: str | None) -> int | None:
    """``NAMESPACE/NAME:PORT`` of a proxy Service (None: not given), as ``faults.proxies.ProxyService`` parses it."""
    from ascend_runtime.faults.proxies import ProxyService  # noqa: PLC0415

    if value is None:
        return None
    try:
        ProxyService.parse(value)
    except ValueError as exc:
        return input_error(flag, str(exc))
    return None


_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_REQUIREMENT = re.compile(r"\s*(!?)\s*([^\s=!(),]+)\s*(?:(==|=|!=)\s*([^\s=!(),]*)|\s(in|notin)\s*\(([^()]*)\))?\s*")


def _label_key_ok(key: str) -> bool:
    """A label key: ``[prefix/]name``, prefix a DNS subdomain of at most 253 characters, name at most 63."""
    prefix, _, name = key.rpartition("/")
    return bool(_LABEL_NAME.fullmatch(name)) and (not prefix or (len(prefix) <= 253 and bool(_LABEL_PREFIX.fullmatch(prefix))))


def _label_value_ok(value: str) -> bool:
    return value == "" or bool(_LABEL_NAME.fullmatch(value))


def label_selector_problem(selector: str) -> str | None:
    """Why ``selector`` is not a Kubernetes label selector, or None.

    The grammar of k8s.io/apimachinery ``labels.Parse``: comma-separated requirements, each ``key``,
    ``!key``, ``key=value``, ``key==value``, ``key!=value``, ``key in (v1,v2)`` or ``key notin (v1,v2)``.
    """
    if not selector.strip():
        return "is empty"
    parts, depth, start = [], 0, 0
    for i, c in enumerate(selector):  # split on commas outside parentheses
        depth += (c == "(") - (c == ")")
        if depth < 0:
            return "has an unmatched ')'"
        if c == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    if depth:
        return "has an unmatched '('"
    parts.append(selector[start:])
    for part in parts:
        m = _REQUIREMENT.fullmatch(part)
        if not m:
            return f"requirement {part.strip()!r} is not key, !key, key=value, key!=value, key in (...) or key notin (...)"
        bang, key, op, value, set_op, values = m.groups()
        if not _label_key_ok(key):
            return f"{key!r} is not a label key ([prefix/]name, name of at most 63 letters, digits, '-', '_', '.')"
        if bang and (op or set_op):
            return f"requirement {part.strip()!r}: '!' takes a key alone"
        if op and not _label_value_ok(value):
            return f"{value!r} is not a label value (at most 63 letters, digits, '-', '_', '.')"
        if set_op and not all(_label_value_ok(v.strip()) for v in values.split(",")):
            return f"requirement {part.strip()!r} lists a value that is not a label value"
    return None


def check_label_selector(flag: str, value: str | None) -> int | None:
    """A Kubernetes label selector (None: not given), by :func:`label_selector_problem`."""
    if value is None:
        return None
    problem = label_selector_problem(value)
    return input_error(flag, f"{problem}; e.g. app.kubernetes.io/component=decode") if problem else None
