"""MindCluster's own fault-source DaemonSets on the serving nodes: the tolerations patch the cluster preparation applies.

Every serving node carries the kit's taint ``ascend-deepseek/serving=<role>:NoSchedule`` (cluster.py
``serving_taint_commands``). A DaemonSet pod that does not tolerate it is never created on such a node
(the DaemonSet controller adds tolerations only for the ``node.kubernetes.io/*`` condition taints), so a
fault source installed, upgraded or rolled after the taint would be missing exactly where faults matter.
In MindCluster v26.1.0 (tag ``v26.1.0``, commit ``9e132e216bb7b81f4a2742a4ac6d3b50754e8a77``):

* NodeD (``component/noded/build/noded.yaml``, DaemonSet ``noded`` in ``mindx-dl``) has no tolerations
  at all;
* the device plugin (``component/ascend-device-plugin/build/ascendplugin.yaml``, DaemonSet
  ``ascend-device-plugin-daemonset`` in ``kube-system``) tolerates ``CriticalAddonsOnly``, its NPU resource
  keys and ``device-plugin=v2`` only (``render/objects/device_plugin.py`` ``RELEASE.tolerations``).

Neither can be made to pass by choosing the taint: NodeD tolerates nothing, and a ``PreferNoSchedule`` taint
would let any NPU workload take a serving node's NPUs while its engine group restarts. So the kit keeps
``NoSchedule`` and, since it does not own these DaemonSets, applies a server-side-apply patch of their pod
template's ``tolerations`` (Pulumi ``DaemonSetPatch``): the manifest's list plus the serving taint. Pod
``tolerations`` is an atomic list, so the patch owns it whole and is forced (``pulumi.com/patchForce``) past
the installer's ownership, under a field manager of its own per serving namespace. MindCluster's installer
re-applying the same manifest changes nothing; a release that changes the list takes it back, and the fault
watcher then reports the source failed on every node its pods leave (docs/faults.md, "Fault sources").
The kit's own device plugin (``device_plugin.install``) already tolerates the taint and needs no patch.

Patched only on the ``kubernetes`` target, with ``taint_nodes``, for each source the stack expects
(``kubernetes.fault_sources``); the patched DaemonSet must exist when ``pulumi up`` runs.
"""

from __future__ import annotations

from typing import Any

from ascend_runtime.faults import sources
from ascend_runtime.faults.topology import Topology
from ascend_runtime.render.objects.common import TAINT_EFFECT, TAINT_KEY, Context, K8sObject
from ascend_runtime.render.objects.device_plugin import tolerations as device_plugin_tolerations

#: Annotations of pulumi-kubernetes Patch resources: force the apply past other managers, name the field
#: manager, and do not wait for the patched DaemonSet's rollout (the watcher checks its pods).
PATCH_FORCE = "pulumi.com/patchForce"
PATCH_FIELD_MANAGER = "pulumi.com/patchFieldManager"
SKIP_AWAIT = "pulumi.com/skipAwait"
#: component/noded/build/noded.yaml@v26.1.0: the NodeD pod template declares no tolerations.
NODED_TOLERATIONS: tuple[dict[str, str], ...] = ()


def is_patch(obj: K8sObject) -> bool:
    """True for an object that patches one the kit does not own (registered as a Pulumi Patch resource)."""
    meta = obj.get("metadata")
    return isinstance(meta, dict) and PATCH_FORCE in (meta.get("annotations") or {})


def serving_toleration() -> dict[str, str]:
    """Tolerates the serving taint whatever its role value."""
    return {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT}


def field_manager(ctx: Context) -> str:
    """The patches' field manager: one per serving namespace, so two stacks of one cluster co-own the list."""
    return f"ascend-deepseek-{ctx.namespace}"


def toleration_patch(ctx: Context, ds: sources.DaemonSetSource, manifest: list[dict[str, Any]]) -> K8sObject:
    """The patch giving ``ds``'s pod template the ``manifest`` tolerations plus :func:`serving_toleration`."""
    wanted = [dict(t) for t in manifest]
    if not any(t.get("key") == TAINT_KEY and t.get("operator") == "Exists" for t in wanted):
        wanted.append(serving_toleration())
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": ds.daemonset, "namespace": ds.namespace,
                     "annotations": {PATCH_FORCE: "true", PATCH_FIELD_MANAGER: field_manager(ctx), SKIP_AWAIT: "true"}},
        "spec": {"template": {"spec": {"tolerations": wanted}}},
    }


def toleration_patches(ctx: Context) -> list[K8sObject]:
    """The patches of the stack: NodeD's, and MindCluster's device plugin's where the kit does not install its own."""
    if ctx.plan.target != "kubernetes" or not ctx.k8s["taint_nodes"]:
        return []
    expected = Topology.from_plan(ctx.plan).expected_sources
    out = []
    if sources.NODED in expected:
        out.append(toleration_patch(ctx, sources.DAEMONSETS[sources.NODED], list(NODED_TOLERATIONS)))
    if sources.DEVICE_PLUGIN in expected and not ctx.k8s["device_plugin"]["install"]:
        out.append(toleration_patch(ctx, sources.DAEMONSETS[sources.DEVICE_PLUGIN], device_plugin_tolerations(ctx)))
    return out
