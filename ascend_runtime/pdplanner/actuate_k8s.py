"""The Kubernetes actuator: a flexible group's shape is the replica count of its instances' workloads.

Each instance of either shape is rendered (render/objects/engine.py): a LeaderWorkerSet named after
the instance, or one Deployment per rank (``<instance>-rank<k>``); the shape that does not run has
``replicas: 0`` and the Pulumi program ignores changes of that field (deploy/components.py), so the
planner owns it. Stopping an instance patches its workloads to 0 and waits until no pod is left;
starting patches them to 1 and waits until ``status.readyReplicas`` is 1 on each (the pods' readiness
probes are the engines' ``/health``). Every patch is a JSON merge patch of ``spec.replicas`` only,
which is all the planner's Role allows (render/objects/pdplanner.py: ``get`` and ``patch`` on
exactly these objects by name).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from ascend_runtime.faults.kube import KubeClient, KubeError
from ascend_runtime.pdplanner.actuate import ActuationError
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects.pdplanner import Workload, flexible_workloads, instance_workloads

__all__ = ["KubeBackend", "Workload", "flexible_workloads", "instance_workloads"]


class KubeBackend:
    """Scales the flexible instances' workloads in ``namespace`` through ``kube``."""

    def __init__(self, plan: Plan, kube: KubeClient, namespace: str, poll_s: float = 5.0) -> None:
        self.plan, self.kube, self.namespace, self.poll_s = plan, kube, namespace, poll_s

    async def _patch(self, w: Workload, replicas: int) -> None:
        path = w.path(self.namespace)
        status, data = await self.kube.merge_patch(path, {"spec": {"replicas": replicas}})
        if status != 200:
            raise ActuationError(f"PATCH {path} replicas={replicas}: HTTP {status}: {data}")

    async def replicas(self, w: Workload) -> tuple[int, int]:
        """(spec.replicas, status.readyReplicas) of one workload."""
        obj = await self.kube.get(w.path(self.namespace))
        if obj is None:
            raise ActuationError(f"{w.kind} {self.namespace}/{w.name} does not exist; run `pulumi up` first")
        return int((obj.get("spec") or {}).get("replicas") or 0), int((obj.get("status") or {}).get("readyReplicas") or 0)

    async def _wait(self, workloads: list[Workload], want: int, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                states = [await self.replicas(w) for w in workloads]
            except KubeError as exc:
                states = []
                last = str(exc)
            else:
                last = ", ".join(f"{w.name} ready {r}" for w, (_, r) in zip(workloads, states))
                if all(ready == want for _, ready in states):
                    return
            if time.monotonic() > deadline:
                raise ActuationError(f"{what} not done after {timeout_s:g} s: {last}")
            await asyncio.sleep(self.poll_s)

    async def read_layout(self) -> dict[str, str]:
        """Group -> the role whose workloads have replicas 1 (read from the cluster)."""
        out = {}
        for g in self.plan.flex_groups:
            up = {}
            for role in ("prefill", "decode"):
                ws = [w for n in g.shape(role) for w in instance_workloads(self.plan, n)]
                up[role] = all((await self.replicas(w))[0] >= 1 for w in ws)
            if up["prefill"] == up["decode"]:
                raise ActuationError(f"{g.name}: {'both' if up['prefill'] else 'neither'} shape scaled up; set the "
                                     f"replicas of one shape to 1 and of the other to 0 (docs/runbooks/change-pd-ratio.md)")
            out[g.name] = "prefill" if up["prefill"] else "decode"
        return out

    async def stop(self, names: Sequence[str]) -> None:
        ws = [w for n in names for w in instance_workloads(self.plan, n)]
        for w in ws:
            await self._patch(w, 0)
        await self._wait(ws, 0, 600.0, f"scaling {', '.join(names)} to 0")

    async def start(self, names: Sequence[str], timeout_s: float) -> None:
        ws = [w for n in names for w in instance_workloads(self.plan, n)]
        for w in ws:
            await self._patch(w, 1)
        await self._wait(ws, 1, timeout_s, f"{', '.join(names)} becoming ready")
