"""The Ascend device plugin (MindCluster ``ascend-device-plugin``) as the pinned release ships it.

Pinned manifest:
``component/ascend-device-plugin/build/ascendplugin.yaml@v26.1.0 (9e132e216bb7b81f4a2742a4ac6d3b50754e8a77)``
of MindCluster (https://gitcode.com/Ascend/mind-cluster; release tag ``v26.1.0``).

In v26.1.0 that file is the old ``ascendplugin-910.yaml`` renamed and made generic: it is
the manifest for Atlas training series, Atlas A2 (910B, e.g. Atlas 800I A2) and Atlas A3
(910C, e.g. CloudMatrix 384) nodes **without Volcano**. The release has no separate A3/910C
manifest; ``ascendplugin-volcano.yaml`` is the Volcano variant (``-volcanoType=true``) and
``ascendplugin-310P-1usoc*.yaml`` are for Atlas 200I SoC boards; neither applies here.

:data:`RELEASE` holds everything the manifest declares, as data; the builders below turn it
into the four objects (ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet). A release
bump is a change of :data:`RELEASE` only (see docs/kubernetes.md, "Ascend device plugin").

The kit deviates from the manifest in exactly these points (:data:`KIT_DEVIATIONS`):

* the image (init container and plugin container) is ``kubernetes.device_plugin.image`` and
  ``.version`` from the stack instead of the manifest's placeholder ``ascend-k8sdeviceplugin:v3.0.0``
  (the release's ``build.sh`` rewrites that placeholder to ``ascend-k8sdeviceplugin:<tag>``);
* ``imagePullPolicy: IfNotPresent`` instead of ``Never``: the manifest expects an image built or
  ``docker load``-ed on every node, the stack names a registry image;
* every object also carries the kit's labels (:func:`~.common.base_labels`, component
  ``device-plugin``); the manifest's object names and its pod label / selector
  ``name: ascend-device-plugin-ds`` are kept (MindCluster's docs: do not rename the DaemonSet);
* the pods also tolerate the kit's serving taint (``ascend-deepseek/serving``, set by the node
  patches when ``taint_nodes``) and the stack's ``npu_resource`` when the manifest does not
  already tolerate it; without that the plugin could not run on serving nodes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from ascend_runtime.render.objects.common import (
    LABEL_NAME,
    TAINT_KEY,
    Context,
    K8sObject,
    base_labels,
)

COMPONENT = "device-plugin"
NAME_LABEL_VALUE = "ascend-device-plugin"
RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class HostVolume:
    """A ``hostPath`` volume of the manifest (``type`` omitted when the manifest omits it)."""

    name: str
    path: str
    type: str | None = None


@dataclass(frozen=True)
class Mount:
    """A ``volumeMount`` of the manifest."""

    volume: str
    path: str
    read_only: bool = False
    sub_path: str | None = None


@dataclass(frozen=True)
class DevicePluginRelease:
    """Everything a MindCluster device plugin manifest declares (one release, one manifest)."""

    tag: str
    commit: str
    manifest: str
    image_tag: str
    namespace: str
    service_account: str
    cluster_role: str
    cluster_role_binding: str
    daemonset: str
    selector: dict[str, str]
    pod_annotations: dict[str, str]
    rules: tuple[dict[str, list[str]], ...]
    update_strategy: dict[str, Any]
    tolerations: tuple[dict[str, str], ...]
    affinity: dict[str, Any]
    priority_class: str
    node_selector: dict[str, str]
    host_pid: bool
    init_container: str
    init_command: tuple[str, ...]
    init_security_context: dict[str, Any]
    init_mounts: tuple[Mount, ...]
    container: str
    resources: dict[str, dict[str, str]]
    command: tuple[str, ...]
    args: tuple[str, ...]
    liveness_probe: dict[str, Any]
    security_context: dict[str, Any]
    image_pull_policy: str
    mounts: tuple[Mount, ...]
    env: tuple[dict[str, Any], ...]
    volumes: tuple[HostVolume, ...]

    @property
    def source(self) -> str:
        """``<manifest path>@<tag> (<commit>)``."""
        return f"{self.manifest}@{self.tag} ({self.commit})"


def _field_env(name: str, field_path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def _no_schedule(key: str) -> dict[str, str]:
    return {"key": key, "operator": "Exists", "effect": "NoSchedule"}


# component/ascend-device-plugin/build/ascendplugin.yaml@v26.1.0 (9e132e216bb7b81f4a2742a4ac6d3b50754e8a77)
RELEASE = DevicePluginRelease(
    tag="v26.1.0",
    commit="9e132e216bb7b81f4a2742a4ac6d3b50754e8a77",
    manifest="component/ascend-device-plugin/build/ascendplugin.yaml",
    # build.sh: build_version="v26.1.0"; sed "s/ascend-k8sdeviceplugin:.*/ascend-k8sdeviceplugin:${build_version}/"
    image_tag="v26.1.0",
    namespace="kube-system",
    service_account="ascend-device-plugin-sa",
    cluster_role="pods-node-ascend-device-plugin-role",
    cluster_role_binding="pods-node-ascend-device-plugin-rolebinding",
    daemonset="ascend-device-plugin-daemonset",
    selector={"name": "ascend-device-plugin-ds"},
    # The manifest keeps the pre-1.19 seccomp annotation; its pod securityContext.seccompProfile
    # (RuntimeDefault) is commented out, so the pod spec has no securityContext.
    pod_annotations={
        "scheduler.alpha.kubernetes.io/critical-pod": "",
        "seccomp.security.alpha.kubernetes.io/pod": "runtime/default",
    },
    rules=(
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "update", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch", "update"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update", "list", "watch"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    ),
    update_strategy={"type": "RollingUpdate"},
    tolerations=(
        {"key": "CriticalAddonsOnly", "operator": "Exists"},
        _no_schedule("huawei.com/Ascend910"),
        _no_schedule("huawei.com/Ascend310"),
        _no_schedule("huawei.com/Ascend310P"),
        _no_schedule("huawei.com/npu"),
        {"key": "device-plugin", "operator": "Equal", "value": "v2", "effect": "NoSchedule"},
    ),
    affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "servertype", "operator": "NotIn", "values": ["soc"]}]},
    ]}}},
    priority_class="system-node-critical",
    # MindCluster's worker label (docs/en/scheduling/api/k8s.md: `workerselector=dls-worker-node`,
    # used by Ascend Device Plugin, NodeD, NPU Exporter). Nodes without it get no plugin pod.
    node_selector={"workerselector": "dls-worker-node"},
    host_pid=True,
    init_container="init-log-setup",
    init_command=(
        "sh", "-c",
        "mkdir -p /var/log/mindx-dl && chmod 755 /var/log/mindx-dl && chown root:root /var/log/mindx-dl"
        " && mkdir -p /var/log/mindx-dl/devicePlugin && chmod 750 /var/log/mindx-dl/devicePlugin"
        " && chown root:root /var/log/mindx-dl/devicePlugin",
    ),
    init_security_context={"runAsUser": 0, "runAsNonRoot": False},
    # The init container gets the host's whole /var/log (broad; as the manifest has it, to be
    # reviewed by the hardening pass).
    init_mounts=(Mount("log-path", "/var/log"),),
    container="device-plugin-01",
    resources={"requests": {"memory": "500Mi", "cpu": "500m"}, "limits": {"memory": "500Mi", "cpu": "500m"}},
    command=("/bin/bash", "-c", "--"),
    args=(
        "device-plugin -logFile=/var/log/mindx-dl/devicePlugin/devicePlugin.log -logLevel=0"
        " --enable-healthz=true --healthz-address=11251",
    ),
    liveness_probe={
        "httpGet": {"path": "/", "port": 11251, "scheme": "HTTP"},
        "initialDelaySeconds": 30, "periodSeconds": 15, "timeoutSeconds": 5, "failureThreshold": 3,
    },
    security_context={"privileged": True, "readOnlyRootFilesystem": True},
    image_pull_policy="Never",
    mounts=(
        Mount("device-plugin", "/var/lib/kubelet/device-plugins"),
        Mount("pod-resource", "/var/lib/kubelet/pod-resources"),
        Mount("hiai-driver", "/usr/local/Ascend/driver", read_only=True),
        Mount("log-path", "/var/log/mindx-dl/devicePlugin", sub_path="mindx-dl/devicePlugin"),
        # The host's whole /tmp, read-write (broad; as the manifest has it, to be reviewed by the
        # hardening pass).
        Mount("tmp", "/tmp"),
        Mount("lingqu-log", "/var/log/lingqu"),
        Mount("localtime", "/etc/localtime", read_only=True),
        Mount("data-trace-file-dir", "/user/cluster-info/datatrace-config"),
        # The manifest's docker-sock / docker-dir / containerd mounts are commented out in this
        # release: with MOUNT_BY_RUNTIME_FOR_DP set, Ascend Docker Runtime adds them itself.
    ),
    env=(
        {"name": "MOUNT_BY_RUNTIME_FOR_DP", "value": "true"},
        _field_env("NODE_NAME", "spec.nodeName"),
        _field_env("HOST_IP", "status.hostIP"),
    ),
    volumes=(
        HostVolume("device-plugin", "/var/lib/kubelet/device-plugins"),
        HostVolume("pod-resource", "/var/lib/kubelet/pod-resources"),
        HostVolume("hiai-driver", "/usr/local/Ascend/driver"),
        HostVolume("log-path", "/var/log", "Directory"),  # the host's whole /var/log (see init_mounts)
        HostVolume("data-trace-file-dir", "/user/cluster-info/datatrace-config", "DirectoryOrCreate"),
        HostVolume("tmp", "/tmp"),  # the host's whole /tmp (see mounts)
        HostVolume("lingqu-log", "/var/log/lingqu", "DirectoryOrCreate"),
        HostVolume("localtime", "/etc/localtime"),
    ),
)

#: Where the kit departs from :data:`RELEASE` (see the module docstring for the reasons).
KIT_DEVIATIONS = (
    "image: kubernetes.device_plugin.image:version from the stack",
    "imagePullPolicy: IfNotPresent (manifest: Never)",
    "kit labels added to every object and the pod template (names, selector unchanged)",
    "tolerations: + ascend-deepseek/serving (kit taint) and kubernetes.npu_resource if not tolerated",
)
KIT_IMAGE_PULL_POLICY = "IfNotPresent"


def _labels(ctx: Context) -> dict[str, str]:
    return {**base_labels(ctx.plan, COMPONENT), LABEL_NAME: NAME_LABEL_VALUE}


def _meta(ctx: Context, name: str, namespaced: bool, release: DevicePluginRelease) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespaced:
        meta["namespace"] = release.namespace
    meta["labels"] = _labels(ctx)
    return meta


def volume(vol: HostVolume) -> dict[str, Any]:
    """One ``hostPath`` volume."""
    host: dict[str, str] = {"path": vol.path}
    if vol.type:
        host["type"] = vol.type
    return {"name": vol.name, "hostPath": host}


def volume_mount(mount: Mount) -> dict[str, Any]:
    """One ``volumeMount``."""
    out: dict[str, Any] = {"name": mount.volume, "mountPath": mount.path}
    if mount.read_only:
        out["readOnly"] = True
    if mount.sub_path:
        out["subPath"] = mount.sub_path
    return out


def image(ctx: Context) -> str:
    """``<image>:<version>`` of the stack."""
    cfg = ctx.k8s["device_plugin"]
    return f"{cfg['image']}:{cfg['version']}"


def tolerations(ctx: Context, release: DevicePluginRelease = RELEASE) -> list[dict[str, str]]:
    """The manifest's tolerations plus the kit's serving taint and the stack's NPU resource."""
    out = [dict(t) for t in release.tolerations]
    for key in (TAINT_KEY, ctx.k8s["npu_resource"]):
        if not any(t.get("key") == key for t in out):
            out.append(_no_schedule(key))
    return out


def service_account(ctx: Context, release: DevicePluginRelease = RELEASE) -> K8sObject:
    """The plugin's ServiceAccount (kube-system)."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(ctx, release.service_account, True, release)}


def cluster_role(ctx: Context, release: DevicePluginRelease = RELEASE) -> K8sObject:
    """The ClusterRole with the manifest's rules, verbatim."""
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": _meta(ctx, release.cluster_role, False, release),
        "rules": copy.deepcopy(list(release.rules)),
    }


def cluster_role_binding(ctx: Context, release: DevicePluginRelease = RELEASE) -> K8sObject:
    """Binds the ClusterRole to the ServiceAccount."""
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": _meta(ctx, release.cluster_role_binding, False, release),
        "subjects": [{"kind": "ServiceAccount", "name": release.service_account, "namespace": release.namespace}],
        "roleRef": {"kind": "ClusterRole", "name": release.cluster_role, "apiGroup": RBAC_GROUP},
    }


def daemonset(ctx: Context, release: DevicePluginRelease = RELEASE) -> K8sObject:
    """The plugin DaemonSet: the manifest's pod, with the stack's image (see :data:`KIT_DEVIATIONS`)."""
    img = image(ctx)
    init = {
        "name": release.init_container,
        "image": img,
        "imagePullPolicy": KIT_IMAGE_PULL_POLICY,
        "command": list(release.init_command),
        "securityContext": dict(release.init_security_context),
        "volumeMounts": [volume_mount(m) for m in release.init_mounts],
    }
    container = {
        "image": img,
        "name": release.container,
        "resources": copy.deepcopy(release.resources),
        "command": list(release.command),
        "args": list(release.args),
        "livenessProbe": copy.deepcopy(release.liveness_probe),
        "securityContext": dict(release.security_context),
        "imagePullPolicy": KIT_IMAGE_PULL_POLICY,
        "volumeMounts": [volume_mount(m) for m in release.mounts],
        "env": copy.deepcopy(list(release.env)),
    }
    pod_spec = {
        "tolerations": tolerations(ctx, release),
        "affinity": copy.deepcopy(release.affinity),
        "priorityClassName": release.priority_class,
        "nodeSelector": dict(release.node_selector),
        "serviceAccountName": release.service_account,
        "hostPID": release.host_pid,
        "initContainers": [init],
        "containers": [container],
        "volumes": [volume(v) for v in release.volumes],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(ctx, release.daemonset, True, release),
        "spec": {
            "selector": {"matchLabels": dict(release.selector)},
            "updateStrategy": copy.deepcopy(release.update_strategy),
            "template": {
                "metadata": {"annotations": dict(release.pod_annotations), "labels": {**release.selector, **_labels(ctx)}},
                "spec": pod_spec,
            },
        },
    }


def device_plugin_objects(ctx: Context, release: DevicePluginRelease = RELEASE) -> list[K8sObject]:
    """ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet, when the stack installs the plugin.

    Nothing on kind/local (simulated NPUs) or when ``kubernetes.device_plugin.install`` is false.
    RBAC comes first: the component registers the DaemonSet after (and depending on) them.
    """
    if not ctx.k8s["device_plugin"]["install"] or ctx.simulated:
        return []
    return [
        service_account(ctx, release),
        cluster_role(ctx, release),
        cluster_role_binding(ctx, release),
        daemonset(ctx, release),
    ]


def device_plugin_node_selector(release: DevicePluginRelease = RELEASE) -> dict[str, str]:
    """Labels a node needs for the plugin DaemonSet to run there (the kit puts them on every node it labels)."""
    return dict(release.node_selector)
