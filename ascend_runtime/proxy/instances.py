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

Role = Literal["prefill", "decode"]
ROLES: tuple[Role, Role] = ("prefill", "decode")


class InstanceSpecError(ValueError):
    """An instance description is malformed (bad role, URL, duplicate name)."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One routable engine instance.

    name: unique across both roles; reported in ``x-prefill-instance`` /
    ``x-decode-instance`` headers and metric labels.
    role: ``prefill`` or ``decode``.
    url: base URL without trailing slash and without ``/v1`` (``http://h:p``).
    weight: relative capacity (> 0); load scores are divided by it.
    """

    name: str
    role: Role
    url: str
    weight: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, the inverse of :func:`spec_from_mapping`."""
        return {"name": self.name, "role": self.role, "url": self.url, "weight": self.weight}


def _has_space_or_control(text: str) -> bool:
    """Whether ``text`` holds whitespace or a control character (which would split a header or a log line)."""
    return any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def normalize_url(url: str) -> str:
    """Return ``scheme://host:port`` for ``url``; accept ``host:port`` without scheme.

    A trailing ``/`` or ``/v1`` is dropped. Raises InstanceSpecError if no host.
    """
    raw = url.strip()
    if _has_space_or_control(raw):
        raise InstanceSpecError(f"invalid instance URL {url!r}: spaces or control characters; expected http://host:port")
    if "://" not in raw:
        raw = "http://" + raw
    parts = urlsplit(raw)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or port == 0:
        raise InstanceSpecError(f"invalid instance URL {url!r}: expected http://host:port (port 1..65535)")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return f"{parts.scheme}://{parts.netloc}{path}"


def default_name(role: str, url: str) -> str:
    """Name used when none is given: ``<role>-<host>:<port>``."""
    parts = urlsplit(url)
    return f"{role}-{parts.netloc}"


def spec_from_mapping(data: Mapping[str, Any]) -> InstanceSpec:
    """Build a spec from ``{name?, role, url, weight?}`` (the Plan/file/admin shape)."""
    role = str(data.get("role", "")).strip().lower()
    if role not in ROLES:
        raise InstanceSpecError(f"instance {dict(data)!r}: role must be 'prefill' or 'decode'")
    if not data.get("url"):
        raise InstanceSpecError(f"instance {dict(data)!r}: missing 'url'")
    url = normalize_url(str(data["url"]))
    if "name" in data and not str(data["name"] or "").strip():
        raise InstanceSpecError(f"instance {url!r}: name is empty; give a name or leave the key out")
    name = str(data.get("name") or default_name(role, url))
    if len(name) > 253 or _has_space_or_control(name):
        # names reach response headers (x-prefill-instance), metric labels and logs
        raise InstanceSpecError(f"instance name {name[:80]!r}: 1 to 253 characters without spaces or control "
                                "characters")
    try:
        weight = float(data.get("weight", 1.0))
    except (TypeError, ValueError):
        raise InstanceSpecError(f"instance {name!r}: weight must be a number > 0, got {data.get('weight')!r}") from None
    if not 0 < weight < float("inf"):
        raise InstanceSpecError(f"instance {name!r}: weight must be a finite number > 0, got {weight}")
    return InstanceSpec(name=name, role=role, url=url, weight=weight)  # type: ignore[arg-type]


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
            raise InstanceSpecError(f"bad option {opt!r} in {text!r}: use URL[,name=NAME][,weight=W]")
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
            raise InstanceSpecError(f"instance [{i}]: expected a mapping {{name, role, url, weight?}}, got {item!r:.80}")
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
    except (ValueError, yaml.YAMLError) as exc:
        raise InstanceSpecError(f"{path}: cannot parse: {exc}") from None
    if data is None:
        return []
    if isinstance(data, Mapping) and "instances" in data:
        data = data["instances"]
    if isinstance(data, Mapping):
        items: list[Mapping[str, Any]] = []
        for role in ROLES:
            for entry in data.get(role) or []:
                if not isinstance(entry, (str, Mapping)):
                    raise InstanceSpecError(f"{path}: {role} entries are URLs or mappings, got {entry!r:.80}")
                items.append({"role": role, "url": entry} if isinstance(entry, str) else {"role": role, **entry})
        data = items
    if not isinstance(data, list):
        raise InstanceSpecError(f"{path}: expected a list of instances or a prefill/decode mapping")
    return specs_from_data(data)
