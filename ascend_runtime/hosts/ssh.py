"""SSH connections to Atlas hosts (paramiko): strict about host keys, bounded in time and memory.

Host keys (:class:`KnownHosts`, read once per run by a :class:`Connector`):

- A key not in the known_hosts file is refused (:class:`HostKeyUnknown`) unless
  ``accept_new`` is set, which records it (trust on first use, explicit only).
  A changed key is always refused (:class:`HostKeyChanged`). Both errors print
  the SHA256 fingerprint and the exact commands to trust the key.
- Markers as OpenSSH reads them: a key on a ``@revoked`` line is refused for the
  hosts the line matches (:class:`HostKeyRevoked`), even with ``accept_new``.
  ``@cert-authority`` lines are ignored with a warning naming the line: paramiko
  does not verify host certificates (it takes the plain key out of a
  certificate and checks no CA signature), so such hosts need plain key lines.
- A line that cannot be parsed is skipped with a warning naming the file and
  line number; the other lines still count. Warnings are collected once per run.

Connections:

- An optional jump host carries every target connection on ``direct-tcpip``
  channels of one shared transport (one bastion connection per run, however
  many hosts and forks). It is opened on first use under a lock and reopened if
  it drops; paramiko's ``Transport.open_channel`` is safe to call from several
  threads at once. A jump host that cannot be reached fails every host behind
  it with the same message, without retrying again per host.
- Connecting is retried with exponential backoff, except for host-key and
  authentication failures, which retrying cannot fix.

Commands (:meth:`Session.run`):

- Each command runs in its own process group: a small ``sh`` wrapper starts it
  under ``setsid`` and reports the group id on stderr (a random token marks
  that line, which is removed from the output). After ``timeout_s`` the group
  gets SIGTERM, then SIGKILL after :data:`KILL_GRACE_S`, over a second channel
  (through ``sudo -n`` where the command ran through it) before the result is
  returned; the result says what happened.
- Captured stdout and stderr are capped at :data:`MAX_OUTPUT_BYTES` each; the
  rest is read and dropped, counted in ``stdout_dropped`` / ``stderr_dropped``
  and described in ``notes``.
- ``become`` with ``sudo`` set runs the command through ``sudo -n`` unless the
  remote user is uid 0. When sudo refuses, nothing ran: ``become_refused`` is
  set and stderr holds sudo's message.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
import secrets
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field

import paramiko

from ascend_runtime.files.read import KNOWN_HOSTS, FileRefused, read_bytes

#: Captured bytes kept per stream (stdout, stderr) and command; the rest is dropped and counted.
MAX_OUTPUT_BYTES = 1 << 20

#: Seconds between SIGTERM and SIGKILL for the process group of a timed-out command.
KILL_GRACE_S = 2.0

#: Whether paramiko verifies host certificates against a CA; it does not (it keeps only the plain key).
HOST_CERTIFICATES_VERIFIED = False


class SshError(RuntimeError):
    """A host could not be reached or used."""


class HostKeyError(SshError):
    """The host key is not trusted; nothing is run on the host."""


class HostKeyUnknown(HostKeyError):
    """The host offered a key that is not in known_hosts."""


class HostKeyChanged(HostKeyError):
    """The host offered a key different from the one in known_hosts."""


class HostKeyRevoked(HostKeyError):
    """The host offered a key that a ``@revoked`` line of known_hosts refuses."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The name a known_hosts line uses for ``host:port``."""
    return host if port == 22 else f"[{host}]:{port}"


def _split_name(name: str) -> tuple[str, int]:
    if name.startswith("[") and "]:" in name:
        host, _, port = name[1:].partition("]:")
        return host, int(port)
    return name, 22


def _trust_hint(host: str, port: int, key: paramiko.PKey, known_hosts: str, changed: bool) -> str:
    name = known_hosts_name(host, port)
    kh = shlex.quote(known_hosts)
    lines = []
    if changed:
        lines.append(f"  if the change is expected, remove the old key: ssh-keygen -R {shlex.quote(name)} -f {kh}")
    lines.append(
        f"  check the fingerprint on the host's console (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then record it:\n"
        f"    ssh-keyscan -p {port} -t {key.get_name()} {shlex.quote(host)} >> {kh}\n"
        f"  or re-run with --accept-new-host-keys to record keys of hosts not yet in {known_hosts}"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------- known_hosts
def _glob(pattern: str, name: str) -> bool:
    """OpenSSH pattern match: ``*`` and ``?`` only (brackets are literal), case-insensitive."""
    rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(rx, name, re.IGNORECASE) is not None


def _host_matches(patterns: str, name: str) -> bool:
    """True when the comma-separated ``patterns`` of a line match ``name`` (negation with ``!`` wins)."""
    matched = False
    for pat in patterns.split(","):
        negated = pat.startswith("!")
        pat = pat[1:] if negated else pat
        if pat.startswith("|1|"):
            try:
                hit = paramiko.HostKeys.hash_host(name, pat) == pat
            except (binascii.Error, AssertionError, ValueError, IndexError):
                hit = False
        else:
            hit = _glob(pat, name)
        if hit:
            if negated:
                return False
            matched = True
    return matched


@dataclass(frozen=True)
class KnownHostLine:
    """One usable line of a known_hosts file."""

    lineno: int  # 0 for keys recorded during this run
    marker: str  # "", "@revoked" or "@cert-authority"
    patterns: str
    key: paramiko.PKey


_RSA_ALGORITHMS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")


class KnownHosts:
    """A known_hosts file read once: its usable lines, and warnings about the others.

    Thread-safe: checks and trust-on-first-use additions hold one lock.
    """

    _append_lock = threading.Lock()  # appends to any known_hosts file, across instances

    def __init__(self, path: str) -> None:
        self.path = os.path.expanduser(path)
        self.lines: list[KnownHostLine] = []
        self.warnings: list[str] = []
        self.error: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: str) -> KnownHosts:
        """Read ``path`` (a missing file is empty; an unreadable one, or one that is no regular file or over
        16 MiB, sets ``error``)."""
        kh = cls(path)
        try:  # the kit's reading door: a regular file of at most 16 MiB, never a FIFO or a device
            text = read_bytes(kh.path, KNOWN_HOSTS).decode("utf-8", errors="replace")
        except FileRefused as exc:
            if not exc.missing:
                kh.error = f"cannot read known_hosts: {exc}"
            return kh
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if line and not line.startswith("#"):
                kh._parse(lineno, line)
        return kh

    def _skip(self, lineno: int, why: str) -> None:
        self.warnings.append(f"{self.path} line {lineno}: skipped: {why}; fix or delete the line")

    def _parse(self, lineno: int, line: str) -> None:
        fields = line.split()
        marker = ""
        if fields[0].startswith("@"):
            marker = fields.pop(0)
            if marker not in ("@revoked", "@cert-authority"):
                self._skip(lineno, f"unknown marker {marker!r} (OpenSSH knows @revoked and @cert-authority)")
                return
        if len(fields) < 3:
            self._skip(lineno, "expected [marker] host-patterns key-type base64-key")
            return
        patterns, key_type, blob = fields[:3]
        try:
            data = base64.b64decode(blob, validate=True)
        except (binascii.Error, ValueError):
            self._skip(lineno, f"the {key_type} key is not valid base64")
            return
        try:
            key = paramiko.PKey.from_type_string(key_type, data)
        except Exception as exc:  # noqa: BLE001 - paramiko raises many types for a bad key blob
            self._skip(lineno, f"cannot load the {key_type} key ({type(exc).__name__}: {exc})")
            return
        if marker == "@cert-authority" and not HOST_CERTIFICATES_VERIFIED:
            self.warnings.append(
                f"{self.path} line {lineno}: @cert-authority line ignored: host certificates are not verified "
                f"(paramiko cannot check them); hosts matching {patterns} need their plain host keys in "
                f"{self.path} (ssh-keyscan)"
            )
        self.lines.append(KnownHostLine(lineno, marker, patterns, key))

    def _where(self, line: KnownHostLine) -> str:
        return f"{self.path} line {line.lineno}" if line.lineno else f"{self.path} (recorded during this run)"

    def key_algorithms(self, name: str) -> list[str]:
        """Host key algorithms of the plain keys known for ``name`` (empty when the host is unknown)."""
        algs: list[str] = []
        with self._lock:
            for line in self.lines:
                if not line.marker and _host_matches(line.patterns, name):
                    kind = line.key.get_name()
                    algs.extend(_RSA_ALGORITHMS if kind == "ssh-rsa" else (kind,))
        return algs

    def verify(self, name: str, key: paramiko.PKey, accept_new: bool) -> None:
        """Accept ``key`` for ``name`` or raise a :class:`HostKeyError` saying why and how to fix it."""
        host, port = _split_name(name)
        if self.error:
            raise HostKeyError(f"{self.error}; fix its permissions or pass --known-hosts FILE")
        with self._lock:
            matching = [ln for ln in self.lines if _host_matches(ln.patterns, name)]
            for line in matching:
                if line.marker == "@revoked" and line.key == key:
                    raise HostKeyRevoked(
                        f"host key of {name} is REVOKED by {self._where(line)} (@revoked): {key.get_name()} "
                        f"{fingerprint(key)}; refusing to connect\n"
                        f"  the host needs a new host key (on its console: ssh-keygen -A after removing the old "
                        f"/etc/ssh/ssh_host_* keys, then restart sshd); check the new fingerprint there and record it:\n"
                        f"    ssh-keyscan -p {port} -t {key.get_name()} {shlex.quote(host)} >> {shlex.quote(self.path)}"
                    )
            plain = [ln for ln in matching if not ln.marker]
            if any(ln.key == key for ln in plain):
                return
            if plain:
                same_type = [ln for ln in plain if ln.key.get_name() == key.get_name()] or plain
                old = same_type[0]
                raise HostKeyChanged(
                    f"HOST KEY CHANGED for {name}: offered {key.get_name()} {fingerprint(key)}, "
                    f"{self._where(old)} has {fingerprint(old.key)}; refusing to connect\n"
                    + _trust_hint(host, port, key, self.path, changed=True)
                )
            if accept_new:
                self._record(name, key)
                return
            cas = [ln for ln in matching if ln.marker == "@cert-authority"]
            note = "".join(
                f"\n  ({self._where(ca)} is a @cert-authority line for this host; it is ignored because host "
                f"certificates are not verified: record the host's plain key)" for ca in cas[:1])
            raise HostKeyUnknown(
                f"host key of {name} is not in {self.path}: {key.get_name()} {fingerprint(key)}{note}\n"
                + _trust_hint(host, port, key, self.path, changed=False)
            )

    def _record(self, name: str, key: paramiko.PKey) -> None:
        with KnownHosts._append_lock:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(f"{name} {key.get_name()} {key.get_base64()}\n")
        self.lines.append(KnownHostLine(0, "", name, key))


class _Policy(paramiko.MissingHostKeyPolicy):
    """Every host key goes through :meth:`KnownHosts.verify` (the client itself holds no keys)."""

    def __init__(self, known: KnownHosts, accept_new: bool) -> None:
        self.known = known
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.known.verify(hostname, key, self.accept_new)


# ------------------------------------------------------------------- options
@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to connect."""

    host: str
    port: int = 22
    user: str = "root"

    @classmethod
    def parse(cls, spec: str, default_user: str, default_port: int = 22) -> Endpoint:
        """Parse ``[user@]host[:port]``."""
        user, _, rest = spec.rpartition("@")
        host, port = rest, default_port
        if rest.count(":") == 1:
            host, port_text = rest.split(":")
            port = int(port_text)
        return cls(host=host, port=port, user=user or default_user)

    @property
    def name(self) -> str:
        """``user@host`` or ``user@[host]:port``."""
        return f"{self.user}@{known_hosts_name(self.host, self.port)}"


@dataclass
class ConnectOptions:
    """Everything needed to open a session to one host."""

    known_hosts: str
    accept_new: bool = False
    key_file: str | None = None
    jump: Endpoint | None = None
    connect_timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.5
    sudo: bool = False
    max_output_bytes: int = MAX_OUTPUT_BYTES
    kill_grace_s: float = KILL_GRACE_S


@dataclass
class CommandResult:
    """What a command did; ``rc`` is None when it timed out (or never ran)."""

    command: str
    rc: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)  # truncation, what the kill did, why it did not run
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    become_refused: bool = False  # sudo -n refused: the command did not run
    not_run: bool = False  # never started (the step's deadline had passed)

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.rc == 0

    @property
    def truncated(self) -> bool:
        """True when output beyond the cap was dropped."""
        return bool(self.stdout_dropped or self.stderr_dropped)


def _retrying(opts: ConnectOptions, what: str, attempt_once, log: list[str]) -> int:
    """Call ``attempt_once`` up to ``opts.retries`` times with backoff; return the attempts made."""
    last: Exception | None = None
    tries = max(1, opts.retries)
    for attempt in range(tries):
        try:
            attempt_once()
            return attempt + 1
        except (HostKeyError, paramiko.AuthenticationException):
            raise
        except (OSError, paramiko.SSHException, EOFError) as exc:
            last = exc
            log.append(f"attempt {attempt + 1}: {exc}")
            if attempt + 1 < tries:
                time.sleep(opts.backoff_s * (2**attempt))
    raise SshError(f"cannot connect to {what} after {tries} attempt(s): {last}")


class Connector:
    """What the sessions of one run share: the known_hosts file (read once) and one jump-host transport."""

    def __init__(self, opts: ConnectOptions) -> None:
        self.opts = opts
        self._lock = threading.Lock()  # the jump-host transport
        self._known_lock = threading.Lock()
        self._known: KnownHosts | None = None
        self._jump: paramiko.SSHClient | None = None
        self._jump_error: SshError | None = None
        self.jump_connects = 0  # bastion connections opened (one per run unless it dropped)

    @property
    def known_hosts(self) -> KnownHosts:
        """The known_hosts file, read on first use."""
        with self._known_lock:
            if self._known is None:
                self._known = KnownHosts.load(self.opts.known_hosts)
            return self._known

    def client(self, ep: Endpoint, sock: object | None = None) -> paramiko.SSHClient:
        """A connected, authenticated client for ``ep`` (over ``sock`` when given); host key checked first."""
        known = self.known_hosts
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_Policy(known, self.opts.accept_new))
        name = known_hosts_name(ep.host, ep.port)
        allowed = set(known.key_algorithms(name))
        preferred = paramiko.Transport._preferred_keys  # paramiko's host key algorithms, in its order
        disabled = None
        if allowed & set(preferred):  # negotiate a key type known_hosts has for the host, as OpenSSH does
            disabled = {"keys": [k for k in preferred if k not in allowed]}
        key_file = os.path.expanduser(self.opts.key_file) if self.opts.key_file else None
        try:
            client.connect(
                ep.host,
                port=ep.port,
                username=ep.user,
                key_filename=key_file,
                allow_agent=key_file is None,
                look_for_keys=key_file is None,
                timeout=self.opts.connect_timeout_s,
                banner_timeout=self.opts.connect_timeout_s,
                auth_timeout=self.opts.connect_timeout_s,
                sock=sock,  # type: ignore[arg-type]
                disabled_algorithms=disabled,
            )
        except BaseException:
            client.close()
            raise
        return client

    def jump_channel(self, target: Endpoint) -> paramiko.Channel:
        """A ``direct-tcpip`` channel to ``target`` through the shared jump-host transport."""
        jump = self.opts.jump
        assert jump is not None
        with self._lock:
            if self._jump_error is not None:
                raise self._jump_error
            transport = self._jump.get_transport() if self._jump is not None else None
            if transport is None or not transport.is_active():
                transport = self._connect_jump(jump)
        # outside the lock: a slow or refused target must not hold up the other hosts' channels
        return transport.open_channel("direct-tcpip", (target.host, target.port), ("127.0.0.1", 0),
                                      timeout=self.opts.connect_timeout_s)

    def _connect_jump(self, jump: Endpoint) -> paramiko.Transport:
        if self._jump is not None:
            self._jump.close()
            self._jump = None
        log: list[str] = []

        def once() -> None:
            self._jump = self.client(jump)

        try:
            _retrying(self.opts, f"jump host {jump.name}", once, log)
        except HostKeyError as exc:
            self._jump_error = type(exc)(f"jump host {jump.name}: {exc}")
            raise self._jump_error from None
        except paramiko.AuthenticationException as exc:
            self._jump_error = SshError(f"jump host {jump.name}: authentication failed: {exc}")
            raise self._jump_error from None
        except SshError as exc:
            self._jump_error = exc
            raise
        self.jump_connects += 1
        assert self._jump is not None
        transport = self._jump.get_transport()
        assert transport is not None
        transport.set_keepalive(30)
        return transport

    def close(self) -> None:
        """Close the jump-host connection."""
        with self._lock:
            if self._jump is not None:
                try:
                    self._jump.close()
                except Exception:  # noqa: BLE001 - closing must never raise
                    pass
                self._jump = None


# ------------------------------------------------------------------ commands
# Runs "$2" in a new process group and prints "@@<token $1> pgid <id>@@" on stderr
# first. The background child of a non-interactive sh is not a group leader, so
# setsid(1) does not fork and the group id is the pid the inner sh prints.
_GROUP_WRAPPER = (
    'if command -v setsid >/dev/null 2>&1; then '
    'setsid sh -c \'printf "@@%s pgid %s@@\\n" "$1" "$$" >&2; exec sh -c "$2"\' sh "$1" "$2" & wait $!; exit $?; '
    'fi; printf "@@%s pid %s@@\\n" "$1" "$$" >&2; exec sh -c "$2"'
)

# Args: id, "pgid"|"pid", grace ticks of 0.1 s. Prints what happened. "kill -SIG -PGID"
# without "--": dash's kill refuses "--", and dash, bash and busybox all read
# "-PGID" after the signal as a process group.
_KILLER = (
    't=$1; [ "$2" = pgid ] && t=-$1; '
    'kill -TERM "$t" 2>/dev/null || { echo gone; exit 0; }; '
    'i=0; while kill -0 "$t" 2>/dev/null; do '
    'if [ "$i" -ge "$3" ]; then kill -KILL "$t" 2>/dev/null; echo killed; exit 0; fi; '
    'sleep 0.1; i=$((i + 1)); done; echo terminated'
)


def _privileged(script: str, sudo: bool) -> str:
    if not sudo:
        return f"exec {script}"
    return f'if [ "$(id -u)" = 0 ]; then exec {script}; else exec sudo -n -- {script}; fi'


class _Capped:
    """A byte buffer that keeps the first ``cap`` bytes and counts the rest."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.cap - len(self.buf)
        if room >= len(data):
            self.buf += data
        else:
            if room > 0:
                self.buf += data[:room]
            self.dropped += len(data) - max(room, 0)


class _GroupMarker:
    """Takes the wrapper's ``@@token pgid N@@`` line out of the start of stderr."""

    def __init__(self, token: str) -> None:
        self._rx = re.compile(rb"@@" + token.encode() + rb" (pgid|pid) (\d+)@@\n")
        self._head = bytearray()
        self.done = False
        self.kind: str | None = None
        self.pid: int | None = None

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return data
        self._head += data
        m = self._rx.search(self._head)
        if m:
            self.kind, self.pid = m.group(1).decode(), int(m.group(2))
            rest = bytes(self._head[: m.start()] + self._head[m.end():])
        elif len(self._head) > 4096:  # not coming (sudo refused, or no sh): pass everything on
            rest = bytes(self._head)
        else:
            return b""
        self.done, self._head = True, bytearray()
        return rest

    def flush(self) -> bytes:
        rest, self._head, self.done = bytes(self._head), bytearray(), True
        return rest


@dataclass
class Session:
    """An open SSH session to one host; use as a context manager.

    Sessions of one run share a :class:`Connector`; without one a session has its own.
    """

    target: Endpoint
    opts: ConnectOptions
    connector: Connector | None = None
    attempts: int = 0
    log: list[str] = field(default_factory=list)
    _client: paramiko.SSHClient | None = None
    _own_connector: bool = False

    def connect(self) -> Session:
        """Connect (through the jump host if any), retrying transient failures with backoff."""
        if self.connector is None:
            self.connector, self._own_connector = Connector(self.opts), True
        counter = {"n": 0}

        def once() -> None:
            counter["n"] += 1
            self.attempts = counter["n"]
            self.close(keep_connector=True)
            self._connect_once()

        try:
            _retrying(self.opts, self.target.name, once, self.log)
        except BaseException:
            self.close()
            raise
        return self

    def _connect_once(self) -> None:
        assert self.connector is not None
        sock = self.connector.jump_channel(self.target) if self.opts.jump is not None else None
        try:
            self._client = self.connector.client(self.target, sock)
        except BaseException:
            if sock is not None:
                sock.close()
            raise

    def run(self, command: str, timeout_s: float = 60.0, become: bool = False) -> CommandResult:
        """Run ``command`` in its own process group; after ``timeout_s`` kill the group, then return."""
        if self._client is None:
            raise SshError("session is not connected")
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise SshError("connection lost")
        sudo = become and self.opts.sudo
        token = secrets.token_hex(8)
        script = _privileged(f"sh -c {shlex.quote(_GROUP_WRAPPER)} sh {token} {shlex.quote(command)}", sudo)
        start = time.monotonic()
        deadline = start + timeout_s
        chan = transport.open_session(timeout=self.opts.connect_timeout_s)
        out, err = _Capped(self.opts.max_output_bytes), _Capped(self.opts.max_output_bytes)
        marker = _GroupMarker(token)
        timed_out = False
        try:
            chan.exec_command(script)
            chan.shutdown_write()
            while True:
                got = False
                while chan.recv_ready():
                    out.add(chan.recv(65536))
                    got = True
                while chan.recv_stderr_ready():
                    err.add(marker.feed(chan.recv_stderr(65536)))
                    got = True
                if chan.closed or (chan.exit_status_ready() and chan.eof_received):
                    while chan.recv_ready():
                        out.add(chan.recv(65536))
                    while chan.recv_stderr_ready():
                        err.add(marker.feed(chan.recv_stderr(65536)))
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                if not transport.is_active():
                    raise SshError("connection lost while a command ran")
                if not got:
                    chan.status_event.wait(0.005)  # set on exit; data arrival is polled
            err.add(marker.flush())
            notes: list[str] = []
            rc: int | None = None
            if timed_out:
                notes.append(f"timed out after {timeout_s:g}s")
                notes.append(self._kill(transport, marker, sudo))
            else:
                rc = chan.recv_exit_status()
        finally:
            chan.close()
        for name, buf in (("stdout", out), ("stderr", err)):
            if buf.dropped:
                notes.append(f"{name} truncated: kept the first {len(buf.buf)} of {len(buf.buf) + buf.dropped} bytes "
                             f"(cap {self.opts.max_output_bytes} bytes per stream)")
        stderr = err.buf.decode("utf-8", "replace")
        return CommandResult(
            command=command,
            rc=rc,
            stdout=out.buf.decode("utf-8", "replace"),
            stderr=stderr,
            duration_s=time.monotonic() - start,
            timed_out=timed_out,
            notes=notes,
            stdout_dropped=out.dropped,
            stderr_dropped=err.dropped,
            become_refused=sudo and marker.pid is None and rc not in (None, 0) and "sudo" in stderr,
        )

    def _kill(self, transport: paramiko.Transport, marker: _GroupMarker, sudo: bool) -> str:
        """Stop a timed-out command: SIGTERM to its process group, SIGKILL after the grace time."""
        if marker.pid is None:
            return "could not stop it: it never reported its process group (it may still be running on the host)"
        what = f"process group {marker.pid}" if marker.kind == "pgid" else f"process {marker.pid} (no setsid on the host)"
        ticks = max(1, int(self.opts.kill_grace_s * 10))
        script = _privileged(f"sh -c {shlex.quote(_KILLER)} sh {marker.pid} {marker.kind} {ticks}", sudo)
        try:
            chan = transport.open_session(timeout=self.opts.connect_timeout_s)
            try:
                chan.settimeout(self.opts.kill_grace_s + self.opts.connect_timeout_s + 5)
                chan.exec_command(script)
                chan.shutdown_write()
                said = b""
                while chunk := chan.recv(4096):
                    said += chunk
            finally:
                chan.close()
        except (OSError, paramiko.SSHException, EOFError) as exc:
            return f"could not stop {what}: {exc or type(exc).__name__}; it may still be running on the host"
        return {
            "gone": f"{what} had already exited",
            "terminated": f"{what} stopped with SIGTERM",
            "killed": f"{what} killed with SIGKILL ({self.opts.kill_grace_s:g}s after SIGTERM)",
        }.get(said.decode(errors="replace").strip(), f"could not stop {what}: kill said {said[:200]!r}")

    def close(self, keep_connector: bool = False) -> None:
        """Close the session (and the connector, when it is the session's own)."""
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - closing must never raise
                pass
        self._client = None
        if self._own_connector and not keep_connector and self.connector is not None:
            self.connector.close()
            self.connector, self._own_connector = None, False

    def __enter__(self) -> Session:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()


def probe_port(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when something accepts TCP connections on host:port (used by tests and diagnostics)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
