"""Load the engine surface of a supported vLLM-Ascend release.

A surface is what one vLLM-Ascend release, together with the vLLM it pairs with, actually reads:
``vllm serve`` flags, environment variables, ``--additional-config`` keys, the KV connector
registry, expert-map file keys, EPLB policies and the Prometheus metrics it registers. The data
files in ``ascend_runtime/engine/surfaces/`` are generated from the released sources by
``tools/engine_surface.py`` (see docs/engine-surfaces.md); this module only reads them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any

__all__ = ["EngineSurface", "UnknownRelease", "load_surface", "supported_releases"]

_PACKAGE = "ascend_runtime.engine.surfaces"
_PREFIX = "vllm-ascend-"
_SUFFIX = ".json"


@dataclass(frozen=True)
class EngineSurface:
    """What one vLLM-Ascend release (plus its paired vLLM) reads; see docs/engine-surfaces.md."""

    release: str
    vllm_version: str
    sources: Mapping[str, str]
    serve_flags: frozenset[str]
    env_vars: frozenset[str]
    additional_config: Mapping[str, frozenset[str]]
    kv_connectors: Mapping[str, str]
    connector_modules: frozenset[str]
    expert_map_keys: frozenset[str]
    eplb_policies: Mapping[int, str]
    metrics: Mapping[str, str]
    #: JSON-valued option ("--kv-transfer-config", ...) -> the keys its vLLM config dataclass accepts.
    json_option_fields: Mapping[str, frozenset[str]] = field(default_factory=lambda: MappingProxyType({}))
    #: ``CUDAGraphMode`` member names (``--compilation-config`` ``cudagraph_mode``).
    cudagraph_modes: frozenset[str] = frozenset()
    #: values ``--speculative-config`` ``method`` accepts, and the deprecated ones vLLM rewrites (old -> new).
    speculative_methods: frozenset[str] = frozenset()
    speculative_method_rewrites: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: registry name -> the class it registers (``KVConnectorFactory.register_connector(name, module, class)``).
    kv_connector_classes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def exposed_metric_names(self) -> frozenset[str]:
        """Sample names that appear on ``/metrics``: a gauge's own name, ``_total`` of a counter,
        ``_bucket``/``_sum``/``_count`` of a histogram (``_sum``/``_count`` of a summary), as
        prometheus_client exposes them (a counter's bare name is never a sample). ``_created``
        samples are not included."""
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
        names: set[str] = set()
        for name, kind in self.metrics.items():
            names.update(name + s for s in suffixes.get(kind, ("",)))
        return frozenset(names)

    def has_flag(self, flag: str) -> bool:
        """Whether ``vllm serve`` accepts the long option ``flag``.

        Like vLLM's argument parser, underscores in the option name count as dashes
        (``--max_num_seqs`` == ``--max-num-seqs``); a ``=value`` part and a dotted JSON sub-key
        (``--compilation-config.mode``) are ignored. Single-dash aliases (``-tp``) are not covered.
        """
        if not flag.startswith("--"):
            return False
        name = flag[2:].split("=", 1)[0].split(".", 1)[0]
        return "--" + name.replace("_", "-") in self.serve_flags


class UnknownRelease(ValueError):
    """No engine surface exists for the requested vLLM-Ascend release."""

    def __init__(self, release: str, supported: tuple[str, ...]) -> None:
        self.release = release
        self.supported = supported
        listed = ", ".join(supported) if supported else "none"
        super().__init__(f"no engine surface for vLLM-Ascend release {release!r}; supported releases: {listed}")


def _version_key(version: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in version.split("."))


@functools.lru_cache(maxsize=1)
def _available() -> dict[str, str]:
    """release -> data file name, for every surface file shipped in the package."""
    found = {}
    for entry in resources.files(_PACKAGE).iterdir():
        name = entry.name
        if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
            found[name[len(_PREFIX) : -len(_SUFFIX)]] = name
    return found


def supported_releases() -> tuple[str, ...]:
    """Releases with a surface data file, sorted by version."""
    return tuple(sorted(_available(), key=_version_key))


def _frozen_map(data: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(data))


def _from_json(data: Mapping[str, Any]) -> EngineSurface:
    env = data["env_vars"]
    expert_map = data["expert_map"]
    return EngineSurface(
        release=data["release"],
        vllm_version=data["vllm_version"],
        sources=_frozen_map(data["sources"]),
        serve_flags=frozenset(data["serve_flags"]),
        env_vars=frozenset(name for names in env.values() for name in names),
        additional_config=_frozen_map({k: frozenset(v) for k, v in data["additional_config"].items()}),
        kv_connectors=_frozen_map(data["kv_connectors"]),
        connector_modules=frozenset(data["connector_modules"]),
        expert_map_keys=frozenset(expert_map["read"]) | frozenset(expert_map["written"]),
        eplb_policies=_frozen_map({int(k): v for k, v in data["eplb_policies"].items()}),
        metrics=_frozen_map(data["metrics"]),
        json_option_fields=_frozen_map({k: frozenset(v) for k, v in data["json_option_fields"].items()}),
        cudagraph_modes=frozenset(data["cudagraph_modes"]),
        speculative_methods=frozenset(data["speculative_methods"]),
        speculative_method_rewrites=_frozen_map(data["speculative_method_rewrites"]),
        kv_connector_classes=_frozen_map({k: v["class"] for k, v in data.get("kv_connector_details", {}).items()}),
    )


@functools.cache
def load_surface(release: str) -> EngineSurface:
    """The engine surface of vLLM-Ascend ``release`` (``"0.23.0"``; a leading ``v`` is accepted).

    Raises :class:`UnknownRelease` (listing the supported releases) when there is no data file.
    """
    available = _available()
    key = release.removeprefix("v")
    if key not in available:
        raise UnknownRelease(release, supported_releases())
    text = resources.files(_PACKAGE).joinpath(available[key]).read_text(encoding="utf-8")
    return _from_json(json.loads(text))
