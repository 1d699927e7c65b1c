"""The PD proxy: instances ConfigMap, Deployment, Service and PodDisruptionBudget."""

from __future__ import annotations

from typing import Any

import yaml

from ascend_runtime.deploy.objects.common import (
    LABEL_COMPONENT,
    PROXY_NAME,
    Context,
    K8sObject,
    metadata,
    pod_security,
    tmp_volume,
)
from ascend_runtime.deploy.objects.engine import api_service_url
from ascend_runtime.deploy.objects.faults import (
    PROXY_ADMIN_SECRET,
    PROXY_TOKEN_ENV,
    proxy_token_env,
)

INSTANCES_DIR = "/etc/ascend-deploy/proxy"
COMPONENT = "proxy"


def instance_urls(ctx: Context) -> list[dict[str, Any]]:
    """What the proxy routes to: the Plan's leader endpoints (Service DNS on simulated targets)."""
    return [
        {"name": i.name, "role": i.role, "url": api_service_url(ctx, i) if ctx.simulated else i.api_url,
         "weight": float(i.npus)}
        for i in ctx.plan.instances
    ]


def proxy_objects(ctx: Context) -> list[K8sObject]:
    """ConfigMap, Deployment, Service (named like the Plan's proxy host) and PDB."""
    port = ctx.plan.proxy_port
    selector = {LABEL_COMPONENT: COMPONENT, "app.kubernetes.io/name": PROXY_NAME}
    meta = lambda name: metadata(ctx, name, COMPONENT, selector)  # noqa: E731
    tmp, tmp_mount = tmp_volume()
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # routes from its instances file: no API access
        "containers": [{
            "name": "proxy",
            "image": ctx.k8s["runtime_image"],
            "imagePullPolicy": "IfNotPresent",
            # the CLI binds 127.0.0.1 by default; clients reach the pod on its IP
            "command": ["ascend-deploy", "proxy", "--host", "0.0.0.0", "--port", str(port),
                        "--instances-file", f"{INSTANCES_DIR}/instances.yaml"],
            "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
            "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 5},
            "livenessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 10, "failureThreshold": 6},
            "securityContext": pod_security(),
            "volumeMounts": [{"name": "instances", "mountPath": INSTANCES_DIR, "readOnly": True}, tmp_mount],
        }],
        "volumes": [{"name": "instances", "configMap": {"name": f"{PROXY_NAME}-instances"}}, tmp],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector}},
        }]}},
    }
    if ctx.image_pull_secrets:
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets
    if PROXY_ADMIN_SECRET in ctx.secrets:  # the admin API (drain/undrain) opens only with a token
        container = pod_spec["containers"][0]
        container["command"] += ["--admin-token-env", PROXY_TOKEN_ENV]
        container["env"] = [proxy_token_env()]
    replicas = ctx.k8s["proxy_replicas"]
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(f"{PROXY_NAME}-instances"),
         "data": {"instances.yaml": yaml.safe_dump({"instances": instance_urls(ctx)}, sort_keys=False)}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(PROXY_NAME),
         "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                  "template": {"metadata": {"labels": meta(PROXY_NAME)["labels"]}, "spec": pod_spec}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta(PROXY_NAME),
         "spec": {"type": "ClusterIP", "selector": selector,
                  "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]}},
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta(PROXY_NAME),
         "spec": {"minAvailable": 1 if replicas > 1 else 0, "selector": {"matchLabels": selector}}},
    ]
