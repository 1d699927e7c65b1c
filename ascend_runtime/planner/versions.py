"""vLLM-Ascend versions and the KV connector dialect each one speaks (facts file, section 2).

- LLMDataDist (``LLMDataDistCMgrConnector``): 0.9.1 up to 0.11.x, removed in 0.13;
  needs a rank table file; its RPC port env is ``VLLM_LLMDD_RPC_PORT`` before
  0.10.1 and ``VLLM_ASCEND_LLMDD_RPC_PORT`` from 0.10.1.
- Mooncake (``MooncakeConnectorV1``): from 0.11; no rank table.
"""

from __future__ import annotations

import re

from ascend_runtime.config.errors import ConfigError

Version = tuple[int, int, int]

MIN_SUPPORTED: Version = (0, 9, 1)
LLMDD_LAST: Version = (0, 12, 99)
MOONCAKE_FIRST: Version = (0, 11, 0)


def parse_version(text: str) -> Version:
    """'0.9.1', 'v0.10.0rc1', '0.11.0-dev' -> (major, minor, patch); ValueError if unreadable."""
    match = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not match:
        raise ValueError(f"not a version: {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def connector_dialect(version_text: str, requested: str) -> str:
    """Pick ``llmdatadist`` or ``mooncake`` for a version; ConfigError naming engine.* keys."""
    try:
        version = parse_version(version_text)
    except ValueError:
        raise ConfigError.single(
            "engine.vllm_ascend_version", "not a version", version_text, "write it like 0.9.1 or 0.11.0"
        ) from None
    if version < MIN_SUPPORTED:
        raise ConfigError.single(
            "engine.vllm_ascend_version", "PD separation needs vLLM-Ascend 0.9.1 or newer", version_text
        )
    if requested == "auto":
        return "mooncake" if version >= MOONCAKE_FIRST else "llmdatadist"
    if requested == "llmdatadist" and version > LLMDD_LAST:
        raise ConfigError.single(
            "engine.kv_connector", "LLMDataDist was removed in vLLM-Ascend 0.13", requested, "use mooncake or auto"
        )
    if requested == "mooncake" and version < MOONCAKE_FIRST:
        raise ConfigError.single(
            "engine.kv_connector", "Mooncake needs vLLM-Ascend 0.11 or newer", requested, "use llmdatadist or auto"
        )
    return requested


def llmdd_rpc_port_env(version_text: str) -> str:
    """Name of the LLMDataDist RPC port variable for a version."""
    return "VLLM_ASCEND_LLMDD_RPC_PORT" if parse_version(version_text) >= (0, 10, 1) else "VLLM_LLMDD_RPC_PORT"
