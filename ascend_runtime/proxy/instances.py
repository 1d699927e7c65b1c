"""Instance descriptions: what the proxy routes to, built from plain data.

An instance is one engine API server (one vLLM-Ascend instance, or a simulator)
with a role (``prefill`` or ``decode``), a unique name and a base URL such as
``http://10.0.0.5:8000``. Every discovery source (command line, file, Plan,
Kubernetes, admin API) reduces to a list of :class:`InstanceSpec`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from ascend_runtime.proxy.urls import instance_url_problem, redact

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")
#: Largest routing weight, and largest instance weight: a weight multiplies loads of up to millions of tokens,
#: and one near the float limit turns every score into infinity (all instances tie, so the first one listed
#: takes every request). An instance weight divides its scores, so it is at least 1 / MAX_WEIGHT.
MAX_WEIGHT = 1e6


class InstanceSpecError(ValueError):
    """An instance description is malformed (bad role, URL, duplicate name)."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One routable engine instance.

    name: unique across both roles; reported in ``x-prefill-instance`` /
    ``x-decode-instance`` headers and metric labels.
    role: ``prefill`` or ``decode``.
    url: base URL without trailing slash and without ``/v1`` (``http://h:p``); no credentials and no
    link-local, multicast or unspecified address (urls.py ``instance_url_problem``, checked here whatever
    built the spec).
    weight: relative capacity, 1 / MAX_WEIGHT to MAX_WEIGHT; load scores are divided by it.
    instance: the engine instance this endpoint is one DP rank of (rank serving: one API server per DP
    rank, ``--data-parallel-rank``), or None when the endpoint is a whole instance. Draining an instance
    drains every endpoint it has.
    """

    name: str
    role: Role
    url: str
    weight: float = 1.0
    instance: str | None = None

    @property
    def group(self) -> str:
        """The engine instance the endpoint serves: ``instance``, or its own name."""
        return self.instance or self.name

    def __post_init__(self) -> None:
        problem = instance_url_problem(self.url)
        if problem is not None:
            raise InstanceSpecError(f"instance {self.name!r}: invalid URL {redact(self.url)!r}: {problem}")

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, the inverse of :func:`spec_from_mapping`."""
        out: dict[str, Any] = {"name": self.name, "role": self.role, "url": self.url, "weight": self.weight}
        if self.instance is not None:
            out["instance"] = self.instance
        return out


def _has_space_or_control(text: str) -> bool:
    """Whether ``text`` holds whitespace or a control character (which would split a header or a log line)."""
    return any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def normalize_url(url: str) -> str:
    """Return ``scheme://host:port`` for ``url``; accept ``host:port`` without scheme.

    A trailing ``/`` or ``/v1`` is dropped. Raises InstanceSpecError if no host, or for a URL no instance may
    have (urls.py ``instance_url_problem``: credentials, a link-local, multicast or unspecified address);
    the message never quotes credentials.
    """
    raw = url.strip()
    if _has_space_or_control(raw):
        raise InstanceSpecError(f"invalid instance URL {redact(url)!r}: spaces or control characters; expected "
                                "http://host:port")
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or port == 0:
        raise InstanceSpecError(f"invalid instance URL {redact(url)!r}: expected http://host:port (port 1..65535)")
    problem = instance_url_problem(raw)
    if problem is not None:
        raise InstanceSpecError(f"invalid instance URL {redact(url)!r}: {problem}")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def default_name(role: str, url: str) -> str:
    """Name used when none is given: ``<role>-<host>:<port>``."""
    parts = urlsplit(url)
    return f"{role}-{parts.netloc}"


def _shown(data: Mapping[str, Any]) -> str:
    """An instance mapping as error messages quote it: at most 120 characters, credentials redacted."""
    text = redact(repr(dict(data)))
    return text if len(text) <= 120 else text[:120] + "..."


def weight_of(value: Any, name: str) -> float:
    """An instance weight from the flag, file or admin value ``value`` (a number, or a string of one):
    finite, 1 / MAX_WEIGHT to MAX_WEIGHT; InstanceSpecError naming instance ``name`` otherwise."""
    try:
        if isinstance(value, bool):
            raise TypeError
        weight = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InstanceSpecError(f"instance {name!r}: weight must be a number from {1 / MAX_WEIGHT:g} to "
                                f"{MAX_WEIGHT:g}, got {str(value)[:40]!r}") from None
    if not 1 / MAX_WEIGHT <= weight <= MAX_WEIGHT:  # NaN and infinities fail too
        raise InstanceSpecError(f"instance {name!r}: weight must be a number from {1 / MAX_WEIGHT:g} to "
                                f"{MAX_WEIGHT:g} (relative capacity), got {weight!r}")
    return weight


def spec_from_mapping(data: Mapping[str, Any]) -> InstanceSpec:
    """Build a spec from ``{name?, role, url, weight?, instance?}`` (the Plan/file/admin shape)."""
    role = str(data.get("role", "")).strip().lower()
    if role not in ROLES:
        raise InstanceSpecError(f"instance {_shown(data)}: role must be 'prefill' or 'decode'")
    if not data.get("url"):
        raise InstanceSpecError(f"instance {_shown(data)}: missing 'url'")
    if not isinstance(data["url"], str):
        raise InstanceSpecError(f"instance {_shown(data)}: url must be a string (http://host:port)")
    url = normalize_url(str(data["url"]))
    if "name" in data and not str(data["name"] or "").strip():
        raise InstanceSpecError(f"instance {url!r}: name is empty; give a name or leave the key out")
    name = str(data.get("name") or default_name(role, url))
    if len(name) > 253 or _has_space_or_control(name):
        # names reach response headers (x-prefill-instance), metric labels and logs
        raise InstanceSpecError(f"instance name {name[:80]!r}: 1 to 253 characters without spaces or control "
                                "characters")
    weight = weight_of(data.get("weight", 1.0), name)
    instance = data.get("instance")
    if instance is not None and (not isinstance(instance, str) or not instance.strip() or len(instance) > 253
                                 or _has_space_or_control(instance)):
        raise InstanceSpecError(f"instance {name!r}: 'instance' (the engine instance this DP rank belongs to) must "
                                "be a name of 1 to 253 characters without spaces, or left out")
    return InstanceSpec(name=name, role=role, url=url, weight=weight, instance=instance)  # type: ignore[arg-type]


def parse_cli_instance(role: Role, text: str) -> InstanceSpec:
    """Parse a ``--prefill``/``--decode`` value: ``URL[,name=NAME][,weight=W]``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise InstanceSpecError(f"empty {role} instance: use URL[,name=NAME][,weight=W]")
    url, *opts = parts
    data: dict[str, Any] = {"role": role, "url": url}
    for opt in opts:
        key, sep, value = opt.partition("=")
        if not sep or key not in ("name", "weight"):
            raise InstanceSpecError(f"bad option {redact(opt)!r} in {redact(text)!r}: use URL[,name=NAME][,weight=W]")
        data[key] = value
    return spec_from_mapping(data)


def specs_from_data(items: Iterable[Mapping[str, Any]]) -> list[InstanceSpec]:
    """Build and validate a list of specs from plain data (names must be unique).

    This is the seam the deployment Plan (``--stack NAME``) feeds: a list of
    ``{name, role, url}`` dicts.
    """
    specs = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InstanceSpecError(f"instance [{i}]: expected a mapping {{name, role, url, weight?}}, got "
                                    f"{redact(repr(item))[:80]}")
        specs.append(spec_from_mapping(item))
    check_unique(specs)
    return specs


def check_unique(specs: Iterable[InstanceSpec]) -> None:
    """Raise InstanceSpecError if two specs share a name."""
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            raise InstanceSpecError(f"duplicate instance name {spec.name!r}")
        seen.add(spec.name)


def load_instances_file(path: str | Path) -> list[InstanceSpec]:
    """Read a YAML or JSON instances file.

    Accepted shapes: a list of ``{name, role, url, weight?}``; or a mapping with
    ``instances: [...]``; or a mapping ``{prefill: [url | {...}], decode: [...]}``.
    """
    text = Path(path).read_text()
    try:
        data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:  # a YAML error quotes the line, which may hold a URL
        raise InstanceSpecError(f"{path}: cannot parse: {redact(str(exc))}") from None
    if data is None:
        return []
    if isinstance(data, Mapping) and "instances" in data:
        data = data["instances"]
    if isinstance(data, Mapping):
        items: list[Mapping[str, Any]] = []
        for role in ROLES:
            for entry in data.get(role) or []:
                if not isinstance(entry, (str, Mapping)):
                    raise InstanceSpecError(f"{path}: {role} entries are URLs or mappings, got {redact(repr(entry))[:80]}")
                items.append({"role": role, "url": entry} if isinstance(entry, str) else {"role": role, **entry})
        data = items
    if not isinstance(data, list):
        raise InstanceSpecError(f"{path}: expected a list of instances or a prefill/decode mapping")
    return specs_from_data(data)
