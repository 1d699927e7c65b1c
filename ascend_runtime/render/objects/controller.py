"""The kit's own small control processes as Kubernetes objects: one shape, several users.

The expert balancer, the NPU fault watcher and the P:D planner each run as one
container of the runtime image in a single-replica Deployment (``Recreate``: two
copies would fight), with their own ServiceAccount bound to a Role that names
only what they touch, and a metrics port. The pieces are separate functions so
each component keeps its own object order (which the rendered manifests number).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ascend_runtime.render.objects.common import (
    LABEL_SERVING_ROLE,
    Context,
    K8sObject,
    metadata,
    pod_security,
    tmp_volume,
)

RBAC = "rbac.authorization.k8s.io"
#: Prefer nodes that serve no engine: a fault or a move there should not take the controller with it.
OFF_SERVING_NODES = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
    "weight": 100,
    "preference": {"matchExpressions": [{"key": LABEL_SERVING_ROLE, "operator": "DoesNotExist"}]},
}]}}


def controller_container(ctx: Context, name: str, command: list[str], metrics_port: int, *,
                         env: Sequence[dict[str, Any]] = (), mounts: Sequence[dict[str, Any]] = (),
                         requests: tuple[str, str] = ("100m", "128Mi"), memory_limit: str = "512Mi",
                         probe_path: str = "/healthz", readiness_period_s: int = 10,
                         liveness: tuple[int, int] | None = None) -> dict[str, Any]:
    """The container: runtime image, ``command``, a ``metrics`` port, restricted securityContext, ``/tmp``.

    ``requests``: (cpu, memory); ``liveness``: (period s, failure threshold) of a liveness probe on
    ``probe_path``, or none. ``mounts`` come before the ``/tmp`` mount.
    """
    container: dict[str, Any] = {
        "name": name,
        "image": ctx.runtime_image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
    }
    if env:
        container["env"] = list(env)
    container |= {
        "ports": [{"name": "metrics", "containerPort": metrics_port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": requests[0], "memory": requests[1]}, "limits": {"memory": memory_limit}},
        "readinessProbe": {"httpGet": {"path": probe_path, "port": metrics_port}, "periodSeconds": readiness_period_s},
    }
    if liveness:
        container["livenessProbe"] = {"httpGet": {"path": probe_path, "port": metrics_port},
                                      "periodSeconds": liveness[0], "failureThreshold": liveness[1]}
    container["securityContext"] = pod_security()
    container["volumeMounts"] = [*mounts, tmp_volume()[1]]
    return container


def controller_pod_spec(ctx: Context, service_account: str, container: dict[str, Any], *,
                        volumes: Sequence[dict[str, Any]] = (), **extra: Any) -> dict[str, Any]:
    """Pod spec with the ServiceAccount's token mounted (controllers call the API), ``volumes`` + ``/tmp``.

    ``extra`` keys (``affinity``, ``terminationGracePeriodSeconds``, ...) are added as given.
    """
    spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        "automountServiceAccountToken": True,
        **{k: v for k, v in extra.items() if k != "affinity"},
        "containers": [container],
        "volumes": [*volumes, tmp_volume()[0]],
    }
    if "affinity" in extra:
        spec["affinity"] = extra["affinity"]
    if ctx.image_pull_secrets:
        spec["imagePullSecrets"] = ctx.image_pull_secrets
    return spec


def service_account(ctx: Context, name: str, component: str, selector: dict[str, str]) -> K8sObject:
    """The controller's ServiceAccount."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(ctx, name, component, selector)}


def role_with_binding(ctx: Context, name: str, component: str, selector: dict[str, str],
                      rules: list[dict[str, Any]]) -> list[K8sObject]:
    """A namespaced Role with ``rules`` and its RoleBinding to the ServiceAccount ``name``."""
    meta = metadata(ctx, name, component, selector)
    return [
        {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": metadata(ctx, name, component, selector),
         "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}]},
    ]


def single_deployment(ctx: Context, name: str, component: str, selector: dict[str, str],
                      pod_spec: dict[str, Any]) -> K8sObject:
    """One replica, ``Recreate``: never two copies of a controller at once."""
    meta = metadata(ctx, name, component, selector)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": meta["labels"]}, "spec": pod_spec}}}


def controller_monitor(ctx: Context, name: str, component: str, selector: dict[str, str]) -> list[K8sObject]:
    """A PodMonitor scraping the controller's ``metrics`` container port (prometheus-operator v0.93.0
    ``monitoring.coreos.com/v1``), when the stack runs the operator; else nothing."""
    if not ctx.k8s["prometheus_operator"]:
        return []
    return [{"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
             "metadata": metadata(ctx, name, component, selector),
             "spec": {"selector": {"matchLabels": dict(selector)},
                      "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}]}}]


def metrics_service(ctx: Context, name: str, component: str, selector: dict[str, str], port: int) -> K8sObject:
    """ClusterIP Service of the controller's ``metrics`` port (Prometheus scrapes it)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(ctx, name, component, selector),
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]}}
