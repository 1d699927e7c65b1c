"""How many proxy worker processes (cores) a token rate needs: the measured relay cost.

``RELAY_TOKENS_PER_CPU_S`` is what one proxy worker process relays per
CPU-second when every SSE event carries one token (the decode engine's
streaming granularity), doing the full PD flow (a prefill request, then the
decode stream relayed by ``ascend_runtime/proxy/relay.py``), at 256 tokens
per request. Measured with::

    python -m benchmarks.proxy_overhead --no-overhead --nginx --workers-scaling --repeats 5 --write

(docs/benchmarks.md, section "PD proxy relay cost vs nginx and worker
scaling": median 34,312 tokens per proxy CPU-second over 5 runs of 256
streams, 8,000 tokens/s offered, on the 2-core development machine; rounded
down). Shorter answers cost more per token (each request adds the prefill
round trip and the HTTP handling, about 0.4 ms of CPU), longer ones less.

Sizing keeps each worker at ``TARGET_UTILISATION`` of a core so that bursts,
health checks, metrics scrapes and prefill requests fit beside the relay.
The planner sizes the proxy's workers and replicas from it
(:mod:`ascend_runtime.planner.proxy_sizing`).
"""

from __future__ import annotations

import math

#: tokens per CPU-second of one proxy worker at one token per SSE event (see module docstring)
RELAY_TOKENS_PER_CPU_S: float = 34_000.0
#: share of a core a worker is planned to use (0..1]
TARGET_UTILISATION: float = 0.6


def tokens_per_worker(utilisation: float = TARGET_UTILISATION) -> float:
    """Tokens/s one worker is planned to relay: ``RELAY_TOKENS_PER_CPU_S * utilisation``."""
    if not 0.0 < utilisation <= 1.0:
        raise ValueError(f"utilisation must be in (0, 1], got {utilisation!r}")
    return RELAY_TOKENS_PER_CPU_S * utilisation


def workers_needed(tokens_per_s: float, utilisation: float = TARGET_UTILISATION) -> int:
    """Worker processes (each one core) that relay ``tokens_per_s`` streamed tokens per second.

    tokens_per_s: aggregate decode output of the instances behind the proxy
    (tokens/s, one token per SSE event). At least 1.
    """
    if not math.isfinite(tokens_per_s) or tokens_per_s < 0:
        raise ValueError(f"tokens_per_s must be a finite number >= 0, got {tokens_per_s!r}")
    return max(1, math.ceil(tokens_per_s / tokens_per_worker(utilisation)))


def replicas_needed(tokens_per_s: float, workers_per_replica: int,
                    utilisation: float = TARGET_UTILISATION) -> int:
    """Proxy replicas (pods) of ``workers_per_replica`` workers each for ``tokens_per_s`` tokens/s. At least 1."""
    if workers_per_replica < 1:
        raise ValueError(f"workers_per_replica must be >= 1, got {workers_per_replica!r}")
    return max(1, math.ceil(workers_needed(tokens_per_s, utilisation) / workers_per_replica))
