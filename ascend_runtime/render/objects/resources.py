"""CPU and memory of the NPU engine pods: their sizes (stack keys or the hardware's defaults) and the checks.

What the engine containers get (docs/kubernetes.md, "Engine resources"):

* ``requests``: the NPUs, ``cpu: <engine_cpu>`` and ``memory: <engine_memory_gib>Gi``;
* ``limits``: the NPUs and the same ``memory``, **no CPU limit**.

Memory request = limit: the kubelet ranks pods for eviction under node memory pressure by how far their
usage exceeds their request, and the OOM killer's ``oom_score_adj`` of a Burstable pod falls with its
memory request, so an engine that can never use more than it requested is neither the first evicted nor
the first killed. No CPU limit: a limit is a CFS quota, and the engine's busy-polling threads (HCCL, the
ACL and release threads vLLM-Ascend binds per NPU, the DP coordinator) would be throttled for the rest of
each 100 ms period once the quota is spent. vLLM-Ascend binds those threads itself from the container's
cpuset (``vllm_ascend/cpu_binding.py``, v0.23.0, ``enable_cpu_binding`` on by default), so the shared
cpuset of a pod without exclusive CPUs is what it is written for; vLLM-Ascend's own A3 pods request CPU
without a CPU limit the same way (``tests/e2e/nightly/multi_node/scripts/lws.yaml.jinja2``).

The memory-backed ``/dev/shm`` (emptyDir ``medium: Memory``) is charged to the pod's memory cgroup, so
``shm_size_gib`` plus the engine's own host memory must fit inside the limit: :func:`resource_problems`
refuses a stack where it does not (exit 2, naming ``kubernetes.shm_size_gib``).

The sizes and the check are pure functions of the Plan and live in the planner
(``planner/pod_resources.py``, raised by ``planner/validation.py``), so ``ascend-deploy plan`` refuses the
same stacks with the same message; this module is the render layer's name for them.
"""

from __future__ import annotations

from ascend_runtime.planner.pod_resources import (
    ENGINE_HOST_BASE_GIB,
    ENGINE_HOST_GIB_PER_NPU,
    MIN_CPUS_PER_NPU,
    EngineResources,
    engine_resources,
    resource_problems,
)
from ascend_runtime.planner.validation import require_engine_resources

__all__ = ["ENGINE_HOST_BASE_GIB", "ENGINE_HOST_GIB_PER_NPU", "MIN_CPUS_PER_NPU", "EngineResources",
           "engine_resources", "require_engine_resources", "resource_problems"]
