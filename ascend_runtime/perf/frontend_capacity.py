"""How many output tokens one vLLM API server process carries: the measured front-end cost.

In vLLM 0.23.0 every stream's detokenisation and SSE framing run in an API server process (the engine
cores only send token ids: ``vllm/v1/engine/async_llm.py`` ``output_handler`` and
``vllm/v1/engine/output_processor.py``), so an instance's output token rate is bounded by its API server
processes (``--api-server-count``). ``API_SERVER_TOKENS_PER_CPU_S`` is what one such process emits per
CPU-second with one token per SSE event, measured against vLLM 0.23.0's own server (CPU build, the kit's
generated tiny model so the engine side is cheap) with::

    python -m benchmarks.frontend_capacity --write

(docs/benchmarks.md, section "One vLLM API server process": 62 us of the API server's CPU per output
token at 192 streams, 51 to 62 us from 32 streams up, on the 2-core development machine; 1e6 / 62 = 16,129
tokens per CPU-second, rounded down). Neither the API server nor the engine core had a whole core in that
run (the machine was shared; the API server used under a third of one), which is why the kit takes the
CPU cost per token, not the tokens/s of the run. It was measured on the development machine's x86 cores; the Atlas 800I A2 and A3 hosts run
Kunpeng 920 cores, whose single-thread speed on this interpreter-bound work is taken as
``HOST_CORE_FACTOR`` of it (a planning assumption of this kit, to be replaced by a measurement on the host).

Sizing keeps each process at ``TARGET_UTILISATION`` of a core, so that request handling, prompt
tokenisation of each new request and metrics scrapes fit beside the streams, and a burst does not queue
token events behind each other (the "before it adds latency" margin). The planner sizes decode's
``--api-server-count`` from it (:mod:`ascend_runtime.planner.frontend_sizing`).
"""

from __future__ import annotations

import math

#: output tokens per CPU-second of one vLLM 0.23.0 API server process, one token per SSE event
API_SERVER_TOKENS_PER_CPU_S: float = 16_000.0
#: single-thread speed of the NPU hosts' cores relative to the measuring machine's (assumption, see above)
HOST_CORE_FACTOR: float = 0.6
#: share of a core one API server process is planned to use (0..1]
TARGET_UTILISATION: float = 0.6


def tokens_per_server() -> float:
    """Output tokens/s one API server process is planned to carry on an NPU host."""
    return API_SERVER_TOKENS_PER_CPU_S * HOST_CORE_FACTOR * TARGET_UTILISATION


def servers_needed(tokens_per_s: float) -> int:
    """API server processes for ``tokens_per_s`` output tokens/s (one token per SSE event). At least 1."""
    if not math.isfinite(tokens_per_s) or tokens_per_s < 0:
        raise ValueError(f"tokens_per_s must be a finite number >= 0, got {tokens_per_s!r}")
    return max(1, math.ceil(tokens_per_s / tokens_per_server()))
