"""The engine release a stack targets, and the KV connector dialect it speaks.

A release is supported when it has an engine surface (extracted from its
released sources, :mod:`ascend_runtime.engine.surface`) and a rule row
(:data:`ascend_runtime.engine.releases.RELEASES`). Anything else is refused
naming ``engine.vllm_ascend_version`` and listing the supported releases.
"""

from __future__ import annotations

import re

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.engine.releases import RELEASES, EngineRelease
from ascend_runtime.engine.surface import supported_releases

Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    """'0.9.1', 'v0.10.0rc1', '0.11.0-dev' -> (major, minor, patch); ValueError if unreadable."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise ValueError(f"not a version: {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def supported() -> tuple[str, ...]:
    """Releases with both a surface and a rule row, oldest first."""
    return tuple(v for v in supported_releases() if v in RELEASES)


def target_release(version_text: str) -> EngineRelease:
    """The rule row of a stack's release; ConfigError naming engine.vllm_ascend_version otherwise."""
    text = version_text.strip().lstrip("v")
    if text not in supported():
        raise ConfigError.single(
            "engine.vllm_ascend_version",
            "no engine surface for this release (the kit renders only what a release's released code reads)",
            version_text,
            f"use one of {', '.join(supported())}",
        )
    return RELEASES[text]


def connector_dialect(version_text: str, requested: str) -> str:
    """``llmdatadist`` or ``mooncake`` for a release; ConfigError naming engine.* keys."""
    row = target_release(version_text)
    if requested == "auto":
        return row.default_dialect
    if requested not in row.connectors:
        raise ConfigError.single(
            "engine.kv_connector",
            f"vLLM-Ascend {row.version} has no {requested} connector",
            requested,
            f"use {' or '.join(sorted(row.connectors))} or auto",
        )
    return requested
