"""SSH connections to Atlas hosts (paramiko), strict about host keys.

- Host keys are checked against a known_hosts file. An unknown key is refused
  (:class:`HostKeyUnknown`) unless ``accept_new`` is set, which records it in
  that file (trust on first use, explicit only). A changed key is always
  refused (:class:`HostKeyChanged`). Both errors print the SHA256 fingerprint
  and the exact commands to trust the key.
- An optional jump host is reached first; the target connection rides a
  ``direct-tcpip`` channel through it.
- Connecting is retried with exponential backoff, except for host-key and
  authentication failures, which retrying cannot fix.
- Every command has a timeout; ``sudo -n`` is added when asked.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import socket
import threading
import time
from dataclasses import dataclass, field

import paramiko

_KNOWN_HOSTS_LOCK = threading.Lock()


class SshError(RuntimeError):
    """A host could not be reached or used."""


class HostKeyError(SshError):
    """The host key is not trusted; nothing is run on the host."""


class HostKeyUnknown(HostKeyError):
    """The host offered a key that is not in known_hosts."""


class HostKeyChanged(HostKeyError):
    """The host offered a key different from the one in known_hosts."""


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style ``SHA256:...`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    """The name a known_hosts line uses for ``host:port``."""
    return host if port == 22 else f"[{host}]:{port}"


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


class _StrictPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or (accept_new) append them to the known_hosts file."""

    def __init__(self, known_hosts: str, port: int, accept_new: bool) -> None:
        self.known_hosts = known_hosts
        self.port = port
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        host = hostname[1:].split("]:", 1)[0] if hostname.startswith("[") else hostname
        if not self.accept_new:
            raise HostKeyUnknown(
                f"host key of {hostname} is not in {self.known_hosts}: {key.get_name()} {fingerprint(key)}\n"
                + _trust_hint(host, self.port, key, self.known_hosts, changed=False)
            )
        client.get_host_keys().add(hostname, key.get_name(), key)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _KNOWN_HOSTS_LOCK:
            os.makedirs(os.path.dirname(os.path.abspath(self.known_hosts)), exist_ok=True)
            with open(self.known_hosts, "a", encoding="utf-8") as fh:
                fh.write(line)


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


@dataclass
class CommandResult:
    """What a command did; ``rc`` is None when it timed out."""

    command: str
    rc: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited 0."""
        return self.rc == 0


def _client(opts: ConnectOptions, port: int) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    path = os.path.expanduser(opts.known_hosts)
    if os.path.exists(path):
        client.load_host_keys(path)
    client.set_missing_host_key_policy(_StrictPolicy(path, port, opts.accept_new))
    return client


def _open(client: paramiko.SSHClient, ep: Endpoint, opts: ConnectOptions, sock: object | None) -> None:
    key_file = os.path.expanduser(opts.key_file) if opts.key_file else None
    try:
        client.connect(
            ep.host,
            port=ep.port,
            username=ep.user,
            key_filename=key_file,
            allow_agent=key_file is None,
            look_for_keys=key_file is None,
            timeout=opts.connect_timeout_s,
            banner_timeout=opts.connect_timeout_s,
            auth_timeout=opts.connect_timeout_s,
            sock=sock,  # type: ignore[arg-type]
        )
    except paramiko.BadHostKeyException as exc:
        path = os.path.expanduser(opts.known_hosts)
        raise HostKeyChanged(
            f"HOST KEY CHANGED for {known_hosts_name(ep.host, ep.port)}: offered {exc.key.get_name()} "
            f"{fingerprint(exc.key)}, {path} has {fingerprint(exc.expected_key)}; refusing to connect\n"
            + _trust_hint(ep.host, ep.port, exc.key, path, changed=True)
        ) from None


@dataclass
class Session:
    """An open SSH session to one host; use as a context manager."""

    target: Endpoint
    opts: ConnectOptions
    _client: paramiko.SSHClient | None = None
    _jump: paramiko.SSHClient | None = None
    attempts: int = 0
    log: list[str] = field(default_factory=list)

    def connect(self) -> Session:
        """Connect (through the jump host if any), retrying transient failures with backoff."""
        last: Exception | None = None
        for attempt in range(max(1, self.opts.retries)):
            self.attempts = attempt + 1
            try:
                self._connect_once()
                return self
            except (HostKeyError, paramiko.AuthenticationException):
                self.close()
                raise
            except (OSError, paramiko.SSHException, EOFError) as exc:
                self.close()
                last = exc
                self.log.append(f"attempt {attempt + 1}: {exc}")
                if attempt + 1 < self.opts.retries:
                    time.sleep(self.opts.backoff_s * (2**attempt))
        raise SshError(
            f"cannot connect to {self.target.user}@{known_hosts_name(self.target.host, self.target.port)} "
            f"after {self.attempts} attempt(s): {last}"
        )

    def _connect_once(self) -> None:
        sock = None
        if self.opts.jump is not None:
            self._jump = _client(self.opts, self.opts.jump.port)
            _open(self._jump, self.opts.jump, self.opts, None)
            transport = self._jump.get_transport()
            assert transport is not None
            sock = transport.open_channel(
                "direct-tcpip", (self.target.host, self.target.port), ("127.0.0.1", 0),
                timeout=self.opts.connect_timeout_s,
            )
        self._client = _client(self.opts, self.target.port)
        _open(self._client, self.target, self.opts, sock)

    def run(self, command: str, timeout_s: float = 60.0, become: bool = False) -> CommandResult:
        """Run ``command`` through the login shell; kill the channel after ``timeout_s``."""
        if self._client is None:
            raise SshError("session is not connected")
        if become and self.opts.sudo and self.target.user != "root":
            command = "sudo -n -- sh -c " + shlex.quote(command)
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise SshError("connection lost")
        start = time.monotonic()
        chan = transport.open_session(timeout=self.opts.connect_timeout_s)
        chan.exec_command(command)
        chan.shutdown_write()
        out, err = bytearray(), bytearray()
        deadline = start + timeout_s
        timed_out = False
        while not (chan.exit_status_ready() and chan.eof_received):
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if time.monotonic() > deadline:
                timed_out = True
                break
            chan.status_event.wait(0.002)  # set on exit; data arrival is polled
        if not timed_out:  # drain what arrived with or after the exit status, up to EOF
            chan.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                while chunk := chan.recv(65536):
                    out += chunk
                while chunk := chan.recv_stderr(65536):
                    err += chunk
            except socket.timeout:
                timed_out = True
        rc = None if timed_out else chan.recv_exit_status()
        chan.close()
        return CommandResult(
            command=command,
            rc=rc,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace") + (f"\ntimed out after {timeout_s:g}s" if timed_out else ""),
            duration_s=time.monotonic() - start,
            timed_out=timed_out,
        )

    def close(self) -> None:
        """Close the session and the jump connection."""
        for c in (self._client, self._jump):
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - closing must never raise
                    pass
        self._client = self._jump = None

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
