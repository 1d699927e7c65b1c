"""Cluster preparation: namespace, node labels, the serving taint's commands, device plugin, the fault sources'
tolerations patches, RuntimeClass, secrets."""

from __future__ import annotations

from collections.abc import Mapping

from ascend_runtime.config.errors import Problem
from ascend_runtime.planner.plan import NodePlan, Plan
from ascend_runtime.render.objects.common import (
    IMAGE_PULL_SECRET,
    IMAGE_PULL_SECRET_NAME,
    LABEL_SERVING_ROLE,
    MODEL_SOURCE_SECRET,
    MODEL_SOURCE_SECRET_NAME,
    TAINT_EFFECT,
    TAINT_KEY,
    Context,
    K8sObject,
    base_labels,
    engine_env_secret,
    metadata,
    secret_placeholder,
)
from ascend_runtime.render.objects.device_plugin import RELEASE as DEVICE_PLUGIN_RELEASE
from ascend_runtime.render.objects.device_plugin import (
    device_plugin_node_selector,
    device_plugin_objects,
)
from ascend_runtime.render.objects.lws import deploys_as_lws
from ascend_runtime.render.objects.mindcluster import toleration_patches

ACCELERATOR_TYPES = {"atlas-800i-a2": "module-910b-8", "cm384": "module-a3-16-super-pod"}
#: Node label of the super pod an A3 node belongs to. One writer: MindCluster's device plugin sets it from the
#: hardware when it starts (``TopoLabelSuperPodId`` in ``component/ascend-common/devmanager/common/constants.go``,
#: written by ``addTopologyLabel`` in ``component/ascend-device-plugin/pkg/server/manager.go`` for Ascend910A3,
#: MindCluster v26.1.0). The kit only reads it and refuses an inventory that disagrees
#: (:func:`super_pod_label_problem`); multi-node engine groups stay inside one super pod by it (engine.py).
SUPER_POD_LABEL = "huawei.com/topotree.superpodid"
DEVICE_PLUGIN_NAMESPACE = DEVICE_PLUGIN_RELEASE.namespace


def namespace(ctx: Context) -> K8sObject:
    """The serving namespace."""
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": metadata(ctx, ctx.namespace, "cluster", namespaced=False)}


def node_labels(ctx: Context, node: NodePlan) -> dict[str, str]:
    """Labels an Atlas node carries (facts section 6) plus its serving role."""
    labels = {
        "accelerator": "huawei-Ascend910",
        "accelerator-type": ACCELERATOR_TYPES[ctx.plan.hardware],
    }
    if ctx.plan.hardware == "atlas-800i-a2":
        labels["server-usage"] = "infer"
    if node.role:
        labels[LABEL_SERVING_ROLE] = node.role
    if ctx.k8s["device_plugin"]["install"]:
        labels.update(device_plugin_node_selector())  # the pinned plugin DaemonSet schedules only there
    return labels


def node_patch(ctx: Context, node: NodePlan) -> K8sObject:
    """The labels of one node, applied as a server-side patch (Pulumi ``NodePatch``); nothing else.

    ``metadata.labels`` is a map under server-side apply: the patch owns only its own keys and never
    conflicts with another manager's labels. Taints are no part of it: Node ``spec.taints`` is an
    atomic list (``x-kubernetes-list-type: atomic``), so one manager owns the whole list and the
    taints the node lifecycle controller adds (``node.kubernetes.io/unschedulable`` on cordon,
    ``not-ready``/``unreachable``) or an operator's own would make the next ``pulumi up`` conflict, or,
    forced, wipe them. The serving taint is applied by :func:`serving_taint_commands` instead.
    Nodes the Plan does not use get the hardware labels only.
    """
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": node_labels(ctx, node)},
    }


def super_pod_label_problem(stack: str, index: int, node: NodePlan, labels: Mapping[str, str] | None) -> Problem | None:
    """The refusal when the live Node's :data:`SUPER_POD_LABEL` (the device plugin's) names another super pod
    than the inventory; None when they agree, the node has no super pod, or the label is not there yet (the
    plugin writes it when it starts; engine pods wait for it through their affinity). ``index``: the node's
    place in the inventory (``plan.nodes`` keeps its order)."""
    value = (labels or {}).get(SUPER_POD_LABEL)
    if node.super_pod_id is None or value is None or value == str(node.super_pod_id):
        return None
    return Problem(
        f"inventory.nodes[{index}].devices[*].super_pod_id",
        f"node {node.name} is in super pod {value} by its label {SUPER_POD_LABEL}={value} (written by the device "
        f"plugin from the hardware), but in super pod {node.super_pod_id} by the inventory",
        node.super_pod_id,
        f"re-run the facts playbook on it (`ascend-deploy playbook run facts --stack {stack} --limit {node.name}`) or set "
        f"its devices' super_pod_id to {value}; the kit never writes this label",
    )


def serving_taint_commands(ctx: Context) -> list[list[str]]:
    """``kubectl taint`` argv lists that give every serving node its taint ``<TAINT_KEY>=<role>:NoSchedule``.

    One command per role the Plan serves, selecting the nodes by the ``LABEL_SERVING_ROLE`` label the node
    patches set, so it needs no node list and follows the Plan. ``--overwrite`` makes it idempotent and
    updates a node whose role changed; ``kubectl taint`` reads the node and writes its taint list back
    with only the kit's taint added or changed, so other managers' taints stay (kubectl
    ``pkg/cmd/taint/taint.go``: ``-l/--selector``, ``--overwrite``, ``reorganizeTaints``). Empty with
    ``taint_nodes: false`` (the kind stack: the proxy must fit on its nodes).
    """
    if not ctx.k8s["taint_nodes"]:
        return []
    roles = sorted({n.role for n in ctx.plan.nodes if n.role})
    return [["kubectl", "taint", "nodes", "-l", f"{LABEL_SERVING_ROLE}={role}",
             f"{TAINT_KEY}={role}:{TAINT_EFFECT}", "--overwrite"] for role in roles]


def runtime_class(ctx: Context) -> K8sObject | None:
    """The RuntimeClass engine pods use, when the stack names one."""
    name = ctx.k8s.get("runtime_class")
    if not name:
        return None
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name, "labels": base_labels(ctx.plan, "cluster")},
        "handler": ctx.k8s["runtime_class_handler"],
        "scheduling": {"nodeSelector": {"accelerator": "huawei-Ascend910"}},
    }


def device_plugin(ctx: Context) -> list[K8sObject]:
    """The Ascend device plugin (ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet) when the cluster lacks it.

    Built from the pinned MindCluster manifest, see :mod:`ascend_runtime.render.objects.device_plugin`.
    """
    return device_plugin_objects(ctx)


def lws_prerequisite(plan: Plan) -> str | None:
    """What the cluster preparation does about the LeaderWorkerSet controller (kubernetes-sigs/lws, pinned in
    :data:`.lws.RELEASE`): None when no instance is a LeaderWorkerSet; ``"install"`` with
    ``kubernetes.lws.install`` (the program applies the release manifest); else ``"check"`` (the program reads
    the CRD, so a cluster without the controller fails ``pulumi preview`` before anything is created).
    """
    if plan.target == "local" or not any(deploys_as_lws(plan, i) for i in plan.instances):
        return None
    return "install" if plan.config["kubernetes"]["lws"]["install"] else "check"


def secrets(ctx: Context) -> list[K8sObject]:
    """Secrets whose values come only from Pulumi secret config (placeholders here)."""
    out: list[K8sObject] = []
    if IMAGE_PULL_SECRET in ctx.secrets:
        out.append({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata(ctx, IMAGE_PULL_SECRET_NAME, "cluster"),
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": secret_placeholder(IMAGE_PULL_SECRET)},
        })
    if MODEL_SOURCE_SECRET in ctx.secrets:
        out.append({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata(ctx, MODEL_SOURCE_SECRET_NAME, "cluster"),
            "type": "Opaque",
            "stringData": {"credentials": secret_placeholder(MODEL_SOURCE_SECRET)},
        })
    env_secret = engine_env_secret(ctx)  # engine.extra_env variables backed by Pulumi secrets
    if env_secret:
        out.append(env_secret)
    return out


def cluster_objects(ctx: Context) -> list[K8sObject]:
    """Namespace, RuntimeClass, device plugin, MindCluster's DaemonSets' tolerations patches (mindcluster.py) and
    secrets (node patches are separate)."""
    rc = runtime_class(ctx)
    return [namespace(ctx), *([rc] if rc else []), *device_plugin(ctx), *toleration_patches(ctx), *secrets(ctx)]
