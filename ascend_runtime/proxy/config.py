"""Proxy settings: listen address, timeouts, health and routing weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ascend_runtime.proxy.instances import InstanceSpec


@dataclass(slots=True)
class RoutingWeights:
    """Weights of the load scores (lower score wins; scores are divided by instance weight).

    prefill score = prefill_token_weight * outstanding prompt tokens
                    + prefill_kv_weight * kv_cache_usage (0..1)
                    + prefill_waiting_weight * vllm:num_requests_waiting
    decode score  = decode_seq_weight * active sequences (proxied streams)
                    + decode_kv_weight * kv_cache_usage (0..1)
                    + decode_waiting_weight * vllm:num_requests_waiting
    The kv weights are in "tokens" (prefill) or "sequences" (decode) per unit of
    cache usage, so the defaults mean a full cache counts like 4096 queued
    prompt tokens, or like 64 running sequences.
    """

    prefill_token_weight: float = 1.0
    prefill_kv_weight: float = 4096.0
    prefill_waiting_weight: float = 0.0
    decode_seq_weight: float = 1.0
    decode_kv_weight: float = 64.0
    decode_waiting_weight: float = 1.0


@dataclass(slots=True)
class ProxyConfig:
    """Everything :func:`ascend_runtime.proxy.server.start_proxy` needs.

    Times are seconds. ``port=0`` picks a free port (read it from the handle).
    ``instances`` is the static list; ``instances_file`` (YAML/JSON) is watched
    for changes every ``file_poll_interval_s`` and re-read on SIGHUP.
    ``admin_token`` None disables the admin API (403).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    instances: list[InstanceSpec] = field(default_factory=list)
    instances_file: Path | None = None
    file_poll_interval_s: float = 1.0
    admin_token: str | None = None
    connect_timeout_s: float = 3.0
    prefill_timeout_s: float = 300.0
    first_token_timeout_s: float = 60.0
    stream_idle_timeout_s: float = 120.0
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    eject_after: int = 3
    eject_duration_s: float = 5.0
    max_attempts: int = 3
    weights: RoutingWeights = field(default_factory=RoutingWeights)
    install_sighup: bool = False
