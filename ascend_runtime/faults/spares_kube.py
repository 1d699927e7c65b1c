"""Recovery onto spares on Kubernetes: the moved instance's objects patched where the Plan moved it.

The kit renders every object from the Plan (``render/objects/``). For a moved instance both Plans are
rendered, the old one and the watcher's (faulted nodes out, spares in), and each object that differs is
changed on the cluster by exactly that difference (``rollout/jsonpatch.py``), through the rollout's
Kubernetes driver (``rollout/kube.py`` ``KubeDriver``: a JSON patch with a ``test`` of
``metadata.resourceVersion``, read again and retried once on a concurrent write, then the wait for the group):

* the instance's ConfigMaps first: ``<inst>-launch`` (the worker script's node table, a leader's script and,
  on kind, each node's ``hccn.conf``) and ``<inst>-ranktable`` where the engine reads one;
* ``pd-proxy-instances`` when the leader (the API URL) moved (the proxies are told at once through their admin
  API; the ConfigMap is what a restarted proxy reads);
* its LeaderWorkerSet: the leader template's ``nodeSelector`` (``kubernetes.io/hostname``) when the leader
  moved, the worker template's ``nodeAffinity`` values (the planned worker nodes), each template's
  ``ascend-deepseek/node`` and ``ascend-deepseek/config-digest`` annotations, and any environment that names
  the node (``HCCL_IF_IP``, ...). Its revision is the whole ``leaderWorkerTemplate`` (``getPatch`` in
  ``pkg/utils/revision/revision_utils.go``, lws v0.10.0), so the controller replaces the group on the new
  nodes (``rolloutStrategy`` ``maxUnavailable: 1``, ``maxSurge: 0``); or its per-rank Deployments (single-node
  and LLMDataDist instances), whose template's ``nodeSelector`` moves the same way.

Fields the renderings agree on are left as the cluster has them (an image a rollout set stays). Taking a node
out is a JSON merge patch of the Node: ``spec.unschedulable: true`` (what ``kubectl cordon`` sets) and the
annotation ``ascend-deepseek/out-of-service`` holding ``{"at", "instances"}``; at start the watcher reads the
annotation of every Plan node to plan as before. RBAC: ``render/objects/faults.py`` (``spare_rules``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from ascend_runtime.faults.kube import KubeClient, KubeError
from ascend_runtime.faults.spares import Move, NotReady, RecreateError
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects.common import Context, K8sObject
from ascend_runtime.render.objects.engine import instance_objects
from ascend_runtime.render.objects.proxy import proxy_objects
from ascend_runtime.rollout.jsonpatch import Op, diff
from ascend_runtime.rollout.kube import CONFIG_KINDS, KubeDriver, KubeWorkloads, Workload
from ascend_runtime.rollout.order import Target
from ascend_runtime.rollout.steps import ReplaceError

#: The Node annotation recording that the watcher took the node out of service.
OUT_OF_SERVICE_ANNOTATION = "ascend-deepseek/out-of-service"
#: What the watcher writes as (``managedFields`` manager).
FIELD_MANAGER = "ascend-fault-watcher"
#: The part of each kind the recovery changes: a ConfigMap's data, a workload's spec.
CHANGED_PART = {"ConfigMap": "data", "LeaderWorkerSet": "spec", "Deployment": "spec"}


def _objects(plan: Plan, instance: str, secrets: frozenset[str]) -> dict[tuple[str, str], K8sObject]:
    """(kind, name) -> the instance's ConfigMaps and workloads, and the proxy's instance list, as rendered."""
    ctx = Context(plan, secrets)
    objs = [*instance_objects(ctx, plan.instance(instance)), proxy_objects(ctx)[0]]
    return {(o["kind"], o["metadata"]["name"]): o for o in objs if o["kind"] in CHANGED_PART}


def changes(move: Move, instance: str, secrets: frozenset[str] = frozenset()) -> list[tuple[Workload, list[Op]]]:
    """Each object of ``instance`` the move changes, ConfigMaps first, with the ops that turn the old rendering's
    part (:data:`CHANGED_PART`) into the new one's."""
    old, new = _objects(move.old, instance, secrets), _objects(move.new, instance, secrets)
    out = []
    for key in sorted(new, key=lambda k: (k[0] not in CONFIG_KINDS, k)):
        part = CHANGED_PART[key[0]]
        ops = diff(old[key][part], new[key][part], f"/{part}") if key in old else []
        if ops:
            meta = new[key]["metadata"]
            out.append((Workload(key[0], meta["namespace"], meta["name"]), ops))
    return out


def _patcher(ops: dict[str, list[Op]]) -> Any:
    """A :data:`~ascend_runtime.rollout.kube.Patcher` applying ``ops`` (by object name) after the
    resourceVersion test, so a concurrent writer makes it read again."""
    def patch(obj: dict[str, Any], w: Workload, _stamp: str) -> list[Op]:
        return [{"op": "test", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]},
                *ops[f"{w.kind}/{w.name}"]]
    return patch


class KubeSpares:
    """Patches moved instances' objects in the cluster (the :class:`~ascend_runtime.faults.spares.Actuator`).

    ``kube``: the watcher's API client (Nodes); ``workloads``: the rollout's (LeaderWorkerSets, Deployments,
    ConfigMaps); ``ready_timeout_s``: the longest wait for a recreated group (s, a weight load included).
    """

    kind = "kubernetes"

    def __init__(self, kube: KubeClient, workloads: KubeWorkloads, secrets: frozenset[str] = frozenset(),
                 ready_timeout_s: float = 1800.0, poll_s: float = 2.0) -> None:
        self.kube, self.workloads, self.secrets = kube, workloads, secrets
        self.ready_timeout_s, self.poll_s = ready_timeout_s, poll_s

    async def taken_out(self, plan: Plan) -> list[str]:
        """Plan nodes carrying :data:`OUT_OF_SERVICE_ANNOTATION`, by its time."""
        found = []
        for node in plan.nodes:
            obj = await self.kube.get_node(node.name)
            note = ((obj or {}).get("metadata") or {}).get("annotations", {}).get(OUT_OF_SERVICE_ANNOTATION)
            if note:
                try:
                    at = float(json.loads(note).get("at") or 0)
                except (ValueError, AttributeError, TypeError):
                    at = 0.0
                found.append((at, node.name))
        return [name for _, name in sorted(found)]

    async def recreate(self, move: Move, instance: str) -> str:
        found = changes(move, instance, self.secrets)
        if not found:
            raise RecreateError(f"{instance}: the two Plans render the same objects")
        ops = {f"{w.kind}/{w.name}": o for w, o in found}
        inst = move.new.instance(instance)
        driver = KubeDriver(self.workloads, {instance: [w for w, _ in found]}, ready_timeout_s=self.ready_timeout_s,
                            poll_s=self.poll_s, patcher=_patcher(ops),
                            what=f"to nodes {', '.join(inst.nodes)}")
        first = found[0][0]
        try:
            return await driver.replace(Target(inst.name, inst.role, inst.api_url))
        except ReplaceError as exc:
            if str(exc).startswith(f"patch {first}:"):
                raise RecreateError(str(exc)) from None  # the first patch failed: nothing changed
            raise NotReady(str(exc)) from None

    async def take_out(self, move: Move, note: dict[str, Any]) -> None:
        body = {"spec": {"unschedulable": True},
                "metadata": {"annotations": {OUT_OF_SERVICE_ANNOTATION: json.dumps(note, sort_keys=True)}}}
        for node in move.nodes:
            status, data = await self.kube.merge_patch(f"/api/v1/nodes/{quote(node)}", body)
            if status != 200:
                raise KubeError(f"cordon {node}: HTTP {status}: {str(data)[:200]}", status)

    async def serving(self, plan: Plan) -> None:
        """Nothing: the cluster's objects already say where the instances run."""

