"""CPU and memory of the NPU engine pods: their sizes (stack keys or the hardware's defaults) and the fit check.

Pure functions of a placed Plan, here in the planner so that every command that shows or deploys a Plan
runs the same check: ``ascend-deploy plan`` (through :func:`ascend_runtime.planner.validation.require_engine_resources`)
and ``render`` / ``pulumi`` (``render/objects/resources.py``, which also documents what the pods get).

``/dev/shm`` (emptyDir ``medium: Memory``) is charged to the pod's memory cgroup, so ``shm_size_gib`` plus
the engine's expected host memory must fit inside ``engine_memory_gib``; ``engine_cpu`` must cover the
CPUs vLLM-Ascend binds per NPU (``MIN_CPUS_PER_NPU`` in ``vllm_ascend/cpu_binding.py``, v0.23.0).
:func:`resource_problems` lists what does not (nothing on the simulated targets ``local`` and ``kind``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascend_runtime.config.errors import Problem
from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner.plan import Plan

#: Host memory of the processes one engine pod runs besides its workers (GiB): the API server(s), the DP
#: coordinator, tokenizer and detokenizer, the launch script's tools. The kit's estimate.
ENGINE_HOST_BASE_GIB = 32
#: Host memory of one worker process per NPU (GiB): the torch_npu / CANN runtime, vLLM's host-side buffers
#: and pinned staging memory. The kit's estimate, on the safe side of what such a process holds.
ENGINE_HOST_GIB_PER_NPU = 16
#: CPUs vLLM-Ascend binds per NPU: 2 IRQ + main + ACL + release (``MIN_CPUS_PER_NPU`` in
#: ``vllm_ascend/cpu_binding.py``, v0.23.0); a smaller request lets other pods claim the CPUs it binds.
MIN_CPUS_PER_NPU = 5


@dataclass(frozen=True)
class EngineResources:
    """The size of every NPU engine pod of a stack.

    ``cpu``: CPU request (whole CPUs); ``memory_gib``: memory request = limit (GiB); ``shm_gib``: the
    memory-backed ``/dev/shm`` inside it (GiB); ``npus_per_pod``: most NPUs one rank uses.
    """

    cpu: int
    memory_gib: int
    shm_gib: int
    npus_per_pod: int

    @property
    def expected_host_gib(self) -> int:
        """The engine's own host memory besides ``/dev/shm`` (GiB): base + per NPU."""
        return ENGINE_HOST_BASE_GIB + ENGINE_HOST_GIB_PER_NPU * self.npus_per_pod

    def container_resources(self, npu_resource: str, npus: int) -> dict[str, Any]:
        """``resources`` of one engine container using ``npus`` NPUs: requests and limits as above."""
        memory = f"{self.memory_gib}Gi"
        return {
            "requests": {npu_resource: str(npus), "cpu": str(self.cpu), "memory": memory},
            "limits": {npu_resource: str(npus), "memory": memory},
        }


def engine_resources(plan: Plan) -> EngineResources:
    """The stack's ``kubernetes.engine_cpu`` / ``engine_memory_gib``, or the hardware's defaults (hardware.py)."""
    k8s = plan.config["kubernetes"]
    spec = hardware_spec(plan.hardware)
    npus = max((len(r.devices) for inst in plan.all_instances for r in inst.ranks), default=spec.devices_per_node)
    return EngineResources(
        cpu=k8s.get("engine_cpu") or spec.engine_cpu,
        memory_gib=k8s.get("engine_memory_gib") or spec.engine_memory_gib,
        shm_gib=k8s["shm_size_gib"],
        npus_per_pod=npus,
    )


def resource_problems(plan: Plan) -> list[Problem]:
    """What is wrong with the engine pods' size on NPUs (nothing on the simulated targets)."""
    if plan.target in ("local", "kind"):
        return []
    res = engine_resources(plan)
    k8s = plan.config["kubernetes"]
    problems: list[Problem] = []
    need = res.shm_gib + res.expected_host_gib
    if need > res.memory_gib:
        limit_from = ("kubernetes.engine_memory_gib" if k8s.get("engine_memory_gib")
                      else f"the {plan.hardware} default of kubernetes.engine_memory_gib")
        problems.append(Problem(
            "kubernetes.shm_size_gib",
            f"the memory-backed /dev/shm ({res.shm_gib} GiB) and the engine's expected host memory "
            f"({res.expected_host_gib} GiB: {ENGINE_HOST_BASE_GIB} + {ENGINE_HOST_GIB_PER_NPU} per NPU x "
            f"{res.npus_per_pod}) need {need} GiB, more than the engine pods' memory limit of {res.memory_gib} GiB "
            f"({limit_from}); /dev/shm counts against that limit",
            res.shm_gib,
            f"set shm_size_gib to at most {max(res.memory_gib - res.expected_host_gib, 0)}, "
            f"or kubernetes.engine_memory_gib to at least {need}",
        ))
    floor = MIN_CPUS_PER_NPU * res.npus_per_pod
    if res.cpu < floor:
        problems.append(Problem(
            "kubernetes.engine_cpu",
            f"{res.cpu} CPUs is less than the {floor} vLLM-Ascend binds for {res.npus_per_pod} NPUs "
            f"({MIN_CPUS_PER_NPU} per NPU)",
            res.cpu,
            f"set kubernetes.engine_cpu to at least {floor}, or leave it out for the {plan.hardware} default",
        ))
    return problems
