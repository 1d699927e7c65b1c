"""One writer per node label: the super pod label is the device plugin's; the program reads it and refuses a disagreeing inventory.

On Atlas A3 (cm384) MindCluster's device plugin labels its node ``huawei.com/topotree.superpodid`` with the
super pod id it reads from the hardware when it starts (``addTopologyLabel`` in
``component/ascend-device-plugin/pkg/server/manager.go``, MindCluster v26.1.0). The kit's engine groups key
their affinity on that label (``render/objects/engine.py``), so the kit does not write it: a second writer
would conflict with the plugin under server-side apply or be flipped back by it. Instead, for every inventory
node with a super pod, the program reads the live Node (``Node.get``) and its NodePatch waits on the check
(:func:`checked_node_patch`): an inventory that names another super pod than the label fails ``pulumi
preview``/``up`` with :class:`ConfigError` naming the node, both values and the fix
(``render/objects/cluster.py`` ``super_pod_label_problem``), before any engine is created (engines wait for
the cluster preparation, whose NodePatches wait for the check). A node without the label yet (the plugin has
not started there) is warned about and passes: its engine pods wait for the label through their affinity.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects.cluster import SUPER_POD_LABEL, super_pod_label_problem
from ascend_runtime.render.objects.common import K8sObject


def labels_of(meta: Any) -> dict[str, str]:
    """The labels of a read Node's ``metadata`` (a typed output object, a plain dict, or nothing)."""
    if meta is None:
        return {}
    labels = meta.get("labels") if isinstance(meta, dict) else getattr(meta, "labels", None)
    return dict(labels or {})


def check_super_pod_label(plan: Plan, name: str, meta: Any) -> None:
    """Raise ConfigError when the live label of node ``name`` disagrees with the inventory; warn when it is absent."""
    index, node = next((i, n) for i, n in enumerate(plan.nodes) if n.name == name)
    labels = labels_of(meta)
    problem = super_pod_label_problem(plan.stack, index, node, labels)
    if problem is not None:
        raise ConfigError([problem], f"stack {plan.stack}, Node {name} of the cluster")
    if SUPER_POD_LABEL not in labels:
        pulumi.log.warn(f"node {name} has no label {SUPER_POD_LABEL} yet (the device plugin writes it from the "
                        f"hardware when it starts there); the inventory's super pod {node.super_pod_id} is not "
                        "checked, and the node's engine pods wait for the label")


def checked_node_patch(obj: K8sObject, plan: Plan, parent: pulumi.Resource) -> K8sObject:
    """``obj`` (a node's label patch) whose labels wait for the super pod check of that node; unchanged for a
    node without a super pod."""
    name = obj["metadata"]["name"]
    node = next((n for n in plan.nodes if n.name == name), None)
    if node is None or node.super_pod_id is None:
        return obj
    live = k8s.core.v1.Node.get(name, name, opts=pulumi.ResourceOptions(parent=parent))
    labels = dict(obj["metadata"].get("labels") or {})

    def check(meta: Any) -> dict[str, str]:
        check_super_pod_label(plan, name, meta)
        return labels

    return {**obj, "metadata": {**obj["metadata"], "labels": live.metadata.apply(check)}}
