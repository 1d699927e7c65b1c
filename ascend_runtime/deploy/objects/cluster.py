"""Cluster preparation: namespace, node labels/taints, device plugin, RuntimeClass, secrets."""

from __future__ import annotations

from typing import Any

from ascend_runtime.deploy.objects.common import (
    IMAGE_PULL_SECRET,
    IMAGE_PULL_SECRET_NAME,
    LABEL_SERVING_ROLE,
    MODEL_SOURCE_SECRET,
    MODEL_SOURCE_SECRET_NAME,
    TAINT_KEY,
    Context,
    K8sObject,
    base_labels,
    metadata,
    secret_placeholder,
)
from ascend_runtime.planner.plan import NodePlan

ACCELERATOR_TYPES = {"atlas-800i-a2": "module-910b-8", "cm384": "module-a3-16-super-pod"}
DEVICE_PLUGIN_NAMESPACE = "kube-system"


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
    if node.super_pod_id is not None:
        labels["huawei.com/topotree.superpodid"] = str(node.super_pod_id)
    if node.role:
        labels[LABEL_SERVING_ROLE] = node.role
    return labels


def node_patch(ctx: Context, node: NodePlan) -> K8sObject:
    """Labels and (optionally) the serving taint of one node, applied as a server-side patch.

    Taints keep other workloads off NPU nodes; engine pods tolerate them.
    Nodes the Plan does not use get the hardware labels only.
    """
    obj: K8sObject = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": node_labels(ctx, node)},
    }
    if ctx.k8s["taint_nodes"] and node.role:
        obj["spec"] = {"taints": [{"key": TAINT_KEY, "value": node.role, "effect": "NoSchedule"}]}
    return obj


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
    """The Ascend device plugin DaemonSet (and its ServiceAccount) when the cluster lacks it."""
    cfg: dict[str, Any] = ctx.k8s["device_plugin"]
    if not cfg["install"] or ctx.simulated:
        return []
    name = "ascend-device-plugin"
    labels = {**base_labels(ctx.plan, "device-plugin"), "app.kubernetes.io/name": name}
    selector = {"app.kubernetes.io/name": name}
    meta = {"name": name, "namespace": DEVICE_PLUGIN_NAMESPACE, "labels": labels}
    host = lambda vol, path, kind="Directory": {"name": vol, "hostPath": {"path": path, "type": kind}}  # noqa: E731
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": {**labels, **selector}},
                "spec": {
                    "serviceAccountName": name,
                    "priorityClassName": "system-node-critical",
                    "nodeSelector": {"accelerator": "huawei-Ascend910"},
                    "tolerations": [
                        {"key": "CriticalAddonsOnly", "operator": "Exists"},
                        {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
                        {"key": ctx.k8s["npu_resource"], "operator": "Exists", "effect": "NoSchedule"},
                    ],
                    "containers": [
                        {
                            "name": "device-plugin",
                            "image": f"{cfg['image']}:{cfg['version']}",
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["/bin/bash", "-c",
                                        "device-plugin -useAscendDocker=false -volcanoType=false -logLevel=0"],
                            "resources": {"requests": {"cpu": "500m", "memory": "500Mi"},
                                          "limits": {"cpu": "500m", "memory": "500Mi"}},
                            "securityContext": {"privileged": True, "readOnlyRootFilesystem": True},
                            "volumeMounts": [
                                {"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"},
                                {"name": "driver", "mountPath": "/usr/local/Ascend/driver", "readOnly": True},
                                {"name": "log", "mountPath": "/var/log/mindx-dl/devicePlugin"},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                        }
                    ],
                    "volumes": [
                        host("device-plugin", "/var/lib/kubelet/device-plugins"),
                        host("driver", "/usr/local/Ascend/driver"),
                        host("log", "/var/log/mindx-dl/devicePlugin", "DirectoryOrCreate"),
                        host("tmp", "/tmp"),
                    ],
                },
            },
        },
    }
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)}
    return [account, daemonset]


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
    return out


def cluster_objects(ctx: Context) -> list[K8sObject]:
    """Namespace, RuntimeClass, device plugin and secrets (node patches are separate)."""
    rc = runtime_class(ctx)
    return [namespace(ctx), *([rc] if rc else []), *device_plugin(ctx), *secrets(ctx)]
