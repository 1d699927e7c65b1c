"""Post-deploy checks: a smoke check and a vLLM-bench-compatible throughput check.

Both work against any OpenAI-compatible endpoint (vLLM, vLLM-Ascend, the
simulator, the PD proxy).  Python API:

- :func:`ascend_runtime.checks.smoke.run_smoke` -> :class:`SmokeReport`
- :func:`ascend_runtime.checks.loadgen.run_throughput` -> :class:`ThroughputResult`
"""

from ascend_runtime.checks.loadgen import (
    ThroughputConfig,
    run_throughput,
    run_throughput_sync,
)
from ascend_runtime.checks.metrics import SLO, RequestResult, ThroughputResult
from ascend_runtime.checks.smoke import (
    CheckItem,
    ItemResult,
    SmokeReport,
    run_smoke,
    run_smoke_sync,
)

__all__ = [
    "CheckItem",
    "ItemResult",
    "RequestResult",
    "SLO",
    "SmokeReport",
    "ThroughputConfig",
    "ThroughputResult",
    "run_smoke",
    "run_smoke_sync",
    "run_throughput",
    "run_throughput_sync",
]
