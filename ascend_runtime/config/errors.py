"""One error type for every invalid stack, inventory or plan, and the value types that produce it.

A :class:`ConfigError` names the key path (``decode.tp``), the bad value and
what would be valid, so the CLI can print it and exit 2 and the Pulumi program
can raise before registering any resource. A value is shown cut to
:data:`VALUE_LIMIT` characters, so an error never carries a file's contents.

The annotated types below are what the stack and inventory models use for
values that become something else (docs/validation.md lists them by class):

- names that become Kubernetes names: :data:`DnsLabel` (namespaces, RuntimeClass
  handlers, the stack name), :data:`DnsSubdomain` (PVC, RuntimeClass),
  :data:`NodeName` (a DNS-1123 subdomain of at most 63 characters: node names
  are also label values, ``kubernetes.io/hostname``);
- paths that become mounts or host directories: :data:`AbsolutePath` (absolute,
  normalised, not ``/`` nor a system directory such as ``/etc`` or ``/usr``);
- IPv4 addresses by use: :data:`HostIPv4` (no unspecified, multicast, broadcast,
  reserved or link-local address; loopback is decided per target by the loader),
  :data:`DeviceIPv4` (the same, and never loopback), :data:`Netmask` (contiguous,
  /8 to /31);
- container images (:data:`ImageRef`), interface names (:data:`InterfaceName`).

A failed check raises :func:`invalid`, a pydantic error of type
:data:`VALUE_ERROR` whose context carries the message, the fix and optionally
the field inside the validated object (``at``); the loader turns it into a
:class:`Problem`.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator
from pydantic_core import PydanticCustomError

#: Longest value an error shows; longer ones are cut (never a file's contents).
VALUE_LIMIT = 60
#: Longest key path a problem shows: a longer one (a key of a megabyte) keeps its start and end around "...".
PATH_LIMIT = 200
#: Longest message or fix a problem shows (the kit's own are far shorter; a quoted key could be a megabyte).
TEXT_LIMIT = 1000
#: Most problems an error message lists (one wrong value can fail many peers: a whole inventory of them is no help).
MAX_PROBLEMS_SHOWN = 30
#: pydantic error type of the checks below; ``ctx``: message, hint and optionally ``at`` (a sub-key).
VALUE_ERROR = "config_value"
#: Longest duration any timeout, interval, delay, deadline or probe may be, in the stack, the inventory or
#: a flag (one day, in seconds): a longer one is a typo (``1e308``) that would overflow a timer or wait forever.
MAX_DURATION_S = 86_400
#: Shortest interval a polling loop may wait between rounds (seconds); below it, it would poll as fast as it can.
MIN_INTERVAL_S = 0.01
#: Upper bound of counts that size memory, threads or requests (tokens, prompts, requests in flight, cycles).
MAX_COUNT = 1 << 20
#: Highest request rate (requests/s) a stack may be sized or checked for: far above any deployment's.
MAX_REQUEST_RATE = 1_000_000.0
#: Highest simulator speedup a stack or ``sim --speedup`` may ask for. The simulator divides every modelled
#: time by it, the time a prefill holds KV for its decode (``kv_timeout_s``, 120 modelled s) too, while the
#: proxy's and the HTTP stack's own time does not shrink: at 10,000 that hold is 12 ms of wall time and a
#: local PD stack fails requests (KV freed before the decode pulls it); at 1,000 (120 ms) it serves them.
MAX_SIM_SPEEDUP = 1000.0


def shorten(value: Any, limit: int = VALUE_LIMIT) -> Any:
    """``value`` as an error may show it: strings and long reprs cut to ``limit`` characters."""
    if value is None or isinstance(value, (bool, float)) or (isinstance(value, int) and -10 ** 18 < value < 10 ** 18):
        return value
    text = value if isinstance(value, str) else repr(value)  # a 400-digit number is cut like a long string
    if len(text) <= limit:
        return value
    return text[: limit - 3] + "..."


@dataclass(frozen=True)
class Problem:
    """One invalid value: where it is, what it is, and how to fix it."""

    path: str
    message: str
    value: Any = None
    hint: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", shorten(self.value))
        if len(self.path) > PATH_LIMIT:
            object.__setattr__(self, "path", f"{self.path[: PATH_LIMIT - 63]}...{self.path[-60:]}")
        object.__setattr__(self, "message", shorten(self.message, TEXT_LIMIT))
        object.__setattr__(self, "hint", shorten(self.hint, TEXT_LIMIT))

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}"
        if self.value is not None:
            text += f" (got {self.value!r})"
        if self.hint:
            text += f"; {self.hint}"
        return text


class ConfigError(ValueError):
    """A stack, inventory or plan is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"invalid configuration in {source}" if source else "invalid configuration"
        shown = [f"  - {p}" for p in problems[:MAX_PROBLEMS_SHOWN]]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            shown.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more problems (fix these and run again)")
        super().__init__(head + ":\n" + "\n".join(shown))

    @classmethod
    def single(cls, path: str, message: str, value: Any = None, hint: str = "", source: str = "") -> ConfigError:
        """Build an error with one problem."""
        return cls([Problem(path, message, value, hint)], source)


def invalid(message: str, hint: str = "", at: str = "") -> PydanticCustomError:
    """The error a value check raises: ``raise invalid("...", "set ...")``; ``at`` names a sub-key."""
    return PydanticCustomError(VALUE_ERROR, "{message}", {"message": message, "hint": hint, "at": at})


# --- names --------------------------------------------------------------------------------------

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def suggest_label(value: str, limit: int = 63) -> str:
    """A DNS-1123 label close to ``value`` (``A2_Node`` -> ``a2-node``), for hints."""
    text = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    return re.sub(r"-{2,}", "-", text)[:limit].strip("-") or "name"


def is_dns_label(value: str) -> bool:
    """A DNS-1123 label: lowercase letters, digits and '-', alphanumeric at both ends, at most 63 characters."""
    return len(value) <= 63 and bool(_LABEL.match(value))


def is_dns_subdomain(value: str, limit: int = 253) -> bool:
    """A DNS-1123 subdomain: dot-separated labels, at most ``limit`` characters."""
    return len(value) <= limit and bool(_SUBDOMAIN.match(value))


def _label(value: str) -> str:
    if not is_dns_label(value):
        raise invalid(
            "not a DNS-1123 label (lowercase letters, digits and '-', starting and ending with a letter or digit, "
            "at most 63 characters)",
            f"e.g. {suggest_label(value)!r}",
        )
    return value


def _subdomain(value: str) -> str:
    if not is_dns_subdomain(value):
        raise invalid(
            "not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253 characters)",
            f"e.g. {suggest_label(value)!r}",
        )
    return value


def _node_name(value: str) -> str:
    if not is_dns_subdomain(value, 63):
        raise invalid(
            "not a Kubernetes node name: a DNS-1123 subdomain (lowercase letters, digits, '-' and '.') of at most "
            "63 characters, as the node name is also the kubernetes.io/hostname label",
            f"use the node's name as `kubectl get nodes` shows it, e.g. {suggest_label(value)!r}",
        )
    return value


def is_env_name(value: str) -> bool:
    """An environment variable name: ``[A-Za-z_][A-Za-z0-9_]*``."""
    return bool(_ENV_NAME.match(value))


_QUALIFIED = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")


def _resource_name(value: str) -> str:
    prefix, sep, name = value.partition("/")
    if not sep or not is_dns_subdomain(prefix) or len(name) > 63 or not _QUALIFIED.match(name):
        raise invalid("not an extended resource name (<domain>/<name>)", "e.g. 'huawei.com/Ascend910'")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        raise invalid("extended resources cannot be in the kubernetes.io domain", "use the device plugin's, e.g. 'huawei.com/Ascend910'")
    return value


# container image reference: [host[:port]/]path[:tag][@digest] (the distribution reference grammar)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"
_IMAGE = re.compile(
    rf"(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{{32,}})?\Z"
)


def is_image_ref(value: str) -> bool:
    """A container image reference, ``[registry/]repository[:tag][@digest]`` (at most 255 characters)."""
    return len(value) <= 255 and bool(_IMAGE.match(value))


def _image(value: str) -> str:
    if not is_image_ref(value):
        raise invalid(
            "not a container image reference ([registry/]repository[:tag][@digest], repository in lowercase)",
            "e.g. 'quay.io/ascend/vllm-ascend:v0.23.0'",
        )
    return value


_IFNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}\Z")


def _interface(value: str) -> str:
    if not _IFNAME.match(value):
        raise invalid("not a network interface name (at most 15 of letters, digits, '_', '.', ':', '-')", "e.g. 'enp189s0f0'")
    return value


_TOKEN = re.compile(r"[^\s\x00-\x1f\x7f]+\Z")


def _token(value: str) -> str:
    if not value or len(value) > 256 or not _TOKEN.match(value):
        raise invalid("must be 1 to 256 characters without spaces or control characters")
    return value


# --- paths --------------------------------------------------------------------------------------

#: Directories a mount (in the container or from the host) must never be, nor a host directory the kit reads.
SYSTEM_DIRS = frozenset(
    {"/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/opt", "/proc", "/root", "/run",
     "/sbin", "/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local", "/usr/sbin", "/var",
     "/var/lib", "/var/run"}
)
_PATH_COMPONENT = re.compile(r"[A-Za-z0-9._+@=,%~-]+\Z")


def path_problem(value: str) -> tuple[str, str] | None:
    """Why ``value`` is not an absolute, normalised path of safe characters (message, fix), or None."""
    if not value.startswith("/"):
        return "must be an absolute path", f"write it from the root, e.g. '/data/models/{value.strip('/') or 'model'}'"
    if value == "/":
        return "must not be the root directory", "name the directory itself, e.g. '/data/models'"
    normal = posixpath.normpath(value)
    if normal.startswith("//"):
        normal = normal[1:]
    if value != normal or "//" in value:
        return "must be a normalised path (no '//', '.', '..' or trailing '/')", f"write {normal!r}"
    for part in value.strip("/").split("/"):
        if not _PATH_COMPONENT.match(part):
            return ("has characters other than ASCII letters, digits and ._+@=,%~- in a path component",
                    "rename the directory or use a path without spaces, quotes or shell characters")
    return None


def _absolute_path(value: str) -> str:
    problem = path_problem(value)
    if problem:
        raise invalid(*problem)
    if value in SYSTEM_DIRS:
        raise invalid(f"{value} is a system directory; mounting it would shadow or expose the system",
                      "use a directory of its own, e.g. '/data/models'")
    return value


def relative_path_problem(value: str) -> tuple[str, str] | None:
    """Why ``value`` is not a normalised relative path that stays below its directory, or None."""
    if not value or value.startswith("/"):
        return "must be a path relative to its directory", "drop the leading '/'"
    parts = value.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "must be a normalised relative path (no '//', '.' or '..')", f"write {posixpath.normpath(value).lstrip('./')!r}"
    if not all(_PATH_COMPONENT.match(p) for p in parts):
        return "has characters other than ASCII letters, digits and ._+@=,%~- in a path component", "rename the file"
    return None


# --- addresses ----------------------------------------------------------------------------------

_LINK_LOCAL = IPv4Network("169.254.0.0/16")
_THIS_NETWORK = IPv4Network("0.0.0.0/8")


def _ipv4_text(value: Any) -> Any:
    """Accept an IPv4 address only as text (YAML would read ``10`` as a number)."""
    if isinstance(value, IPv4Address):
        return value
    if not isinstance(value, str):
        raise invalid("an IPv4 address must be written as text", "e.g. '192.0.2.11'")
    try:
        return IPv4Address(value)
    except ValueError:
        raise invalid("not an IPv4 address (four decimal numbers 0-255, e.g. 192.0.2.11)") from None


def address_problem(ip: IPv4Address, loopback_ok: bool) -> tuple[str, str] | None:
    """Why ``ip`` cannot be a host or device address (message, fix), or None."""
    if ip.is_unspecified or ip in _THIS_NETWORK:
        return "is the unspecified / this-network address, not an address of a host", "write the interface's own address"
    if ip == IPv4Address("255.255.255.255"):
        return "is the limited broadcast address", "write the interface's own address"
    if ip.is_multicast:
        return "is a multicast address", "write the interface's unicast address"
    if ip in _LINK_LOCAL:
        return "is a link-local address (169.254.0.0/16), not routable between nodes", "configure a routable address"
    if ip.is_loopback and not loopback_ok:
        return "is a loopback address", "write the interface's own address (loopback only on the local target's hosts)"
    if ip.is_reserved:
        return "is a reserved address (240.0.0.0/4)", "write the interface's own address"
    return None


def _host_ip(ip: IPv4Address) -> IPv4Address:
    problem = address_problem(ip, loopback_ok=True)
    if problem:
        raise invalid(*problem)
    return ip


def _device_ip(ip: IPv4Address) -> IPv4Address:
    problem = address_problem(ip, loopback_ok=False)
    if problem:
        raise invalid(*problem)
    return ip


def _netmask(mask: IPv4Address) -> IPv4Address:
    bits = int(mask)
    inverted = ~bits & 0xFFFFFFFF
    if inverted & (inverted + 1):
        raise invalid("not a netmask: the one bits must be contiguous from the left", "e.g. '255.255.255.0'")
    prefix = 32 - inverted.bit_length()
    if not 8 <= prefix <= 31:
        raise invalid(f"a /{prefix} netmask cannot be a RoCE port's subnet", "use /8 to /31, e.g. '255.255.255.0'")
    return mask


DnsLabel = Annotated[str, AfterValidator(_label)]
DnsSubdomain = Annotated[str, AfterValidator(_subdomain)]
NodeName = Annotated[str, AfterValidator(_node_name)]
ResourceName = Annotated[str, AfterValidator(_resource_name)]
ImageRef = Annotated[str, AfterValidator(_image)]
InterfaceName = Annotated[str, AfterValidator(_interface)]
Token = Annotated[str, AfterValidator(_token)]
AbsolutePath = Annotated[str, AfterValidator(_absolute_path)]
HostIPv4 = Annotated[IPv4Address, BeforeValidator(_ipv4_text), AfterValidator(_host_ip)]
DeviceIPv4 = Annotated[IPv4Address, BeforeValidator(_ipv4_text), AfterValidator(_device_ip)]
Netmask = Annotated[IPv4Address, BeforeValidator(_ipv4_text), AfterValidator(_netmask)]
