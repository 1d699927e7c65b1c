"""The expert balancer: ServiceAccount, Role (its own ConfigMap only), RoleBinding,
expert-map ConfigMap, Deployment and metrics Service."""

from __future__ import annotations

from typing import Any

from ascend_runtime.deploy.objects.common import (
    BALANCER_NAME,
    EXPERT_MAP_CONFIGMAP,
    EXPERT_MAP_KEY,
    LABEL_COMPONENT,
    Context,
    K8sObject,
    metadata,
    pod_security,
)
from ascend_runtime.deploy.objects.engine import api_service_url

COMPONENT = "balancer"


def balanced_instances(ctx: Context) -> list[Any]:
    """Instances the balancer serves: the decode stage (one EP shape), when it is expert-parallel."""
    return [i for i in ctx.plan.by_role("decode") if i.ep > 1]


def role_rules(ctx: Context) -> list[dict[str, Any]]:
    """The only permissions: get and update of the expert-map ConfigMap."""
    return [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [EXPERT_MAP_CONFIGMAP],
             "verbs": ["get", "update"]}]


def balancer_command(ctx: Context) -> list[str]:
    """``ascend-deploy balance serve`` argv."""
    insts = balanced_instances(ctx)
    first = insts[0]
    nodes = len(first.ranks)
    cmd = ["ascend-deploy", "balance", "serve",
           "--experts", str(ctx.plan.config["model"]["num_routed_experts"]),
           "--ranks", str(first.ep), "--slots", str(first.expert_slots_per_rank),
           "--groups", str(ctx.plan.config["model"]["num_expert_groups"]), "--nodes", str(nodes),
           "--configmap", f"{ctx.namespace}/{EXPERT_MAP_CONFIGMAP}:{EXPERT_MAP_KEY}",
           # applying a map restarts engines; on real clusters that is the rebalance runbook's job
           "--apply", "simulator" if ctx.simulated else "none",
           "--metrics-host", "0.0.0.0", "--metrics-port", str(ctx.plan.config["ports"]["balancer_metrics"])]
    for inst in insts:
        cmd += ["--instance", f"{inst.name}={api_service_url(ctx, inst) if ctx.simulated else inst.api_url}"]
    return cmd


def balancer_objects(ctx: Context) -> list[K8sObject]:
    """Nothing when no decode instance is expert-parallel."""
    if not balanced_instances(ctx):
        return []
    port = ctx.plan.config["ports"]["balancer_metrics"]
    selector = {LABEL_COMPONENT: COMPONENT, "app.kubernetes.io/name": BALANCER_NAME}
    meta = lambda name: metadata(ctx, name, COMPONENT, selector)  # noqa: E731
    pod_spec: dict[str, Any] = {
        "serviceAccountName": BALANCER_NAME,
        "containers": [{
            "name": "balancer",
            "image": ctx.k8s["runtime_image"],
            "imagePullPolicy": "IfNotPresent",
            "command": balancer_command(ctx),
            "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 30, "failureThreshold": 4},
            "securityContext": pod_security(),
        }],
    }
    if ctx.image_pull_secrets:
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": BALANCER_NAME}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(BALANCER_NAME)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(BALANCER_NAME),
         "rules": role_rules(ctx)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(BALANCER_NAME),
         "roleRef": role_ref,
         "subjects": [{"kind": "ServiceAccount", "name": BALANCER_NAME, "namespace": ctx.namespace}]},
        # created empty; the balancer owns its content (Pulumi ignores later changes of `data`)
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(EXPERT_MAP_CONFIGMAP), "data": {EXPERT_MAP_KEY: ""}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(BALANCER_NAME),
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector},
                  "template": {"metadata": {"labels": meta(BALANCER_NAME)["labels"]}, "spec": pod_spec}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta(BALANCER_NAME),
         "spec": {"type": "ClusterIP", "selector": selector,
                  "ports": [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]}},
    ]
