"""The expert balancer: ServiceAccount, Role (its own ConfigMap only), RoleBinding,
expert-map ConfigMap, Deployment and metrics Service; on kind also the Secret with the
simulators' admin token (when the stack sets ``simulator_admin_token``)."""

from __future__ import annotations

from typing import Any

from ascend_runtime.deploy.objects.common import (
    BALANCER_NAME,
    EXPERT_MAP_CONFIGMAP,
    EXPERT_MAP_KEY,
    LABEL_COMPONENT,
    SIM_ADMIN_TOKEN_ENV,
    Context,
    K8sObject,
    balanced_instances,
    metadata,
    pod_security,
    simulator_admin_secret,
    simulator_admin_token,
    simulator_admin_token_env,
    tmp_volume,
)
from ascend_runtime.deploy.objects.engine import api_service_url

COMPONENT = "balancer"
__all__ = ["balanced_instances", "balancer_command", "balancer_objects", "role_rules"]


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
           # the CLI binds 127.0.0.1 by default; Prometheus scrapes the pod IP
           "--metrics-host", "0.0.0.0", "--metrics-port", str(ctx.plan.config["ports"]["balancer_metrics"])]
    if simulator_admin_token(ctx):
        cmd += ["--sim-token-env", SIM_ADMIN_TOKEN_ENV]
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
    tmp, tmp_mount = tmp_volume()
    container: dict[str, Any] = {
        "name": "balancer",
        "image": ctx.k8s["runtime_image"],
        "imagePullPolicy": "IfNotPresent",
        "command": balancer_command(ctx),
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 30, "failureThreshold": 4},
        "securityContext": pod_security(),
        "volumeMounts": [tmp_mount],
    }
    if simulator_admin_token(ctx):
        container["env"] = [simulator_admin_token_env()]
    pod_spec: dict[str, Any] = {
        "serviceAccountName": BALANCER_NAME,
        # the only pod with a token: it reads and updates the expert-map ConfigMap (role_rules)
        "automountServiceAccountToken": True,
        "containers": [container],
        "volumes": [tmp],
    }
    if ctx.image_pull_secrets:
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": BALANCER_NAME}
    secret = simulator_admin_secret(ctx)
    return [
        *([secret] if secret else []),
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
