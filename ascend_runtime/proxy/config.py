"""Proxy settings: listen address, timeouts, health and routing weights."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ascend_runtime.proxy.instances import MAX_WEIGHT, InstanceSpec

#: Most blocks the affinity router uses per prompt block or remembers per instance (its memory grows with it).
MAX_AFFINITY_BLOCKS = 1 << 20


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
    #: KV-cache affinity of prefill (proxy/affinity.py): queued prompt tokens one expected cached prompt token is
    #: worth (0 = load-only routing), the share of a conversation's previous prompt expected at its rendezvous
    #: home when the routing history does not locate it (0 = history only), the proxy's block size
    #: in words and the blocks it remembers per instance (about an A2 prefill instance's KV cache: 2 DP ranks x
    #: 313,680 tokens / 128 = 4901 blocks).
    prefill_affinity_weight: float = 1.0
    prefill_affinity_home_weight: float = 1.0
    prefill_affinity_block_tokens: float = 128.0
    prefill_affinity_capacity_blocks: float = 4096.0

    def __post_init__(self) -> None:
        problem = weight_problem({name: getattr(self, name) for name in self.__slots__})  # type: ignore[attr-defined]
        if problem is not None:
            raise ValueError(" ".join(problem))


#: fields of :class:`RoutingWeights` that count blocks (whole numbers) and their least values; the rest are weights
_BLOCK_FIELDS = {"prefill_affinity_block_tokens": 1, "prefill_affinity_capacity_blocks": 0}


def weight_problem(values: dict[str, float]) -> tuple[str, str] | None:
    """(flag, what is wrong) for the first invalid :class:`RoutingWeights` field in ``values``, or None.

    Weights are finite, 0 to :data:`MAX_WEIGHT`; the block fields whole numbers up to :data:`MAX_AFFINITY_BLOCKS`.
    """
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        low = _BLOCK_FIELDS.get(name)
        if low is not None:
            if not (math.isfinite(value) and low <= value <= MAX_AFFINITY_BLOCKS and value == int(value)):
                return flag, f"must be a whole number from {low} to {MAX_AFFINITY_BLOCKS}, got {value!r}"
        elif not (math.isfinite(value) and 0 <= value <= MAX_WEIGHT):
            return flag, f"must be a finite number from 0 to {MAX_WEIGHT:g}, got {value!r}"
    return None


@dataclass(slots=True)
class OutlierPolicy:
    """When an instance is taken out of rotation (ejected), and for how long.

    Passive evidence from real traffic ejects: ``consecutive_errors`` answers in
    a row that are 5xx, timeouts or unusable; ``consecutive_connect_failures``
    refused/reset connections or broken streams in a row; a success rate over
    the last ``window`` requests (at least ``min_requests`` of them) below
    ``mean - stdev_factor * stdev`` of the role's instances (needs
    ``success_rate_min_hosts`` instances with enough requests), or below
    ``100 - failure_percent`` percent (0 = off). Active checks eject only after
    ``health_failures`` consecutive failed checks (a refused connection or a
    non-200 answer); a check that times out is *slow*, not failed, unless the
    instance's last real request failed too.

    The n-th ejection in a row lasts ``base_s * n``, at most ``max_s``; the
    count starts again once the instance stayed in rotation for ``max_s``.
    Re-admission needs the ejection time to be over and, when active checks
    run, a passing check after that. At most ``max_percent`` percent of the
    instances of a role that are up (rounded down) are ejected on outlier
    evidence at a time, so by default the last one of a role is never ejected;
    an instance kept in rotation that way, or an ejected one used because
    nothing else is left, is routed to only when no other instance is
    available (panic routing). Refused connections and failed active checks
    mean the instance is down: not capped, never used for panic routing.
    """

    consecutive_errors: int = 3
    consecutive_connect_failures: int = 1
    health_failures: int = 3
    window: int = 100
    min_requests: int = 20
    success_rate_min_hosts: int = 3
    stdev_factor: float = 1.9
    failure_percent: float = 0.0
    base_s: float = 5.0
    max_s: float = 300.0
    max_percent: float = 50.0


@dataclass(slots=True)
class Limits:
    """Client connection and body limits of the proxy's HTTP server.

    ``header_timeout_s``: the request line and headers must arrive within this
    time of the connection being opened (or, on a kept-alive connection, of the
    previous answer), else the connection is closed; it is also how long an idle
    kept-alive connection stays open. ``body_timeout_s``: each read of the body must make
    progress within this time (idle gap), and the whole body must arrive within
    ``body_total_timeout_s``. ``max_body_bytes``: a larger Content-Length is
    refused with 413 before the body is read; a chunked body is cut off with
    413 once it passes the limit.
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    body_total_timeout_s: float = 120.0
    max_body_bytes: int = 64 * 1024 * 1024


@dataclass(slots=True)
class ProxyConfig:
    """Everything :func:`ascend_runtime.proxy.server.start_proxy` needs.

    Times are seconds. ``port=0`` picks a free port (read it from the handle).
    ``instances`` is the static list; ``instances_file`` (YAML/JSON) is watched
    for changes every ``file_poll_interval_s`` and re-read on SIGHUP.
    ``admin_token`` None disables the admin API (403). ``outlier`` None builds
    an :class:`OutlierPolicy` from ``eject_after`` (consecutive errors) and
    ``eject_duration_s`` (base ejection time); see :meth:`outlier_policy`.
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
    outlier: OutlierPolicy | None = None
    limits: Limits = field(default_factory=Limits)
    max_attempts: int = 3
    weights: RoutingWeights = field(default_factory=RoutingWeights)
    install_sighup: bool = False
    #: listen with SO_REUSEPORT (set for each worker process by ``--workers N``, proxy/workers.py)
    reuse_port: bool = False
    #: seconds an idle connection to an engine is reused (relay.py's and aiohttp's client alike); below the
    #: engines' own keep-alive, uvicorn's ``timeout_keep_alive`` = ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` (5 s,
    #: vllm/envs.py, passed by vllm/entrypoints/openai/api_server.py, v0.23.0), so that no request is sent on
    #: a connection the engine is closing
    engine_keepalive_s: float = 4.0

    def outlier_policy(self) -> OutlierPolicy:
        """The ejection policy: ``outlier`` if given, else the defaults with ``eject_after`` / ``eject_duration_s``."""
        if self.outlier is not None:
            return self.outlier
        return OutlierPolicy(consecutive_errors=self.eject_after, base_s=self.eject_duration_s)
