"""The PD proxy: instances ConfigMap, Deployment, Service and PodDisruptionBudget.

Scale-out: the Deployment runs ``Plan.proxy.replicas`` replicas (planner/proxy_sizing.py: the
stack's expected output token rate over the measured relay cost per core, one replica spare) behind
the one ClusterIP Service; each pod asks for ``workers_per_replica`` cores. The replicas keep
independent routing state; KV-cache affinity stays coherent across them through rendezvous hashing
(proxy/affinity.py). A PodDisruptionBudget (policy/v1) lets one replica go at a time, and
topologySpreadConstraints spread replicas over nodes and zones. Simulated targets (kind) keep the
configured ``kubernetes.proxy_replicas`` and one core per pod.
"""

from __future__ import annotations

from typing import Any

import yaml

from ascend_runtime.render.objects.common import (
    LABEL_COMPONENT,
    PROXY_NAME,
    Context,
    K8sObject,
    metadata,
    pod_security,
    tmp_volume,
)
from ascend_runtime.render.launch import serves_ranks
from ascend_runtime.render.objects.engine import api_service_url, endpoint_service_urls
from ascend_runtime.render.objects.faults import (
    PROXY_ADMIN_SECRET,
    PROXY_TOKEN_ENV,
    proxy_token_env,
)

INSTANCES_DIR = "/etc/ascend-deploy/proxy"
COMPONENT = "proxy"


def instance_urls(ctx: Context) -> list[dict[str, Any]]:
    """What the proxy routes to: the Plan's leader endpoints (Service DNS on simulated targets).

    ``serving: rank``: ``Plan.endpoints()``, one entry per DP rank's server with the ``instance`` it belongs to
    (ascend_runtime/proxy/instances.py ``InstanceSpec.instance``) and the rank's share of the NPUs as weight."""
    out: list[dict[str, Any]] = []
    for i in ctx.plan.instances:
        if not serves_ranks(i):
            out.append({"name": i.name, "role": i.role, "url": api_service_url(ctx, i) if ctx.simulated else i.api_url,
                        "weight": float(i.npus)})
            continue
        urls = endpoint_service_urls(ctx, i) if ctx.simulated else [ep.url for ep in i.api_endpoints]
        out += [{"name": ep.name, "role": ep.role, "url": url, "weight": float(i.npus // i.dp), "instance": ep.instance}
                for ep, url in zip(i.api_endpoints, urls, strict=True)]
    return out


def proxy_shape(ctx: Context) -> tuple[int, int]:
    """(replicas, cores per replica) of the proxy Deployment."""
    if ctx.simulated:
        return int(ctx.k8s["proxy_replicas"]), 1
    sizing = ctx.plan.proxy
    return sizing.replicas, sizing.workers_per_replica


def spread_constraints(selector: dict[str, str]) -> list[dict[str, Any]]:
    """Spread proxy replicas over nodes, then zones (best effort: serving nodes are tainted, few may be left)."""
    return [
        {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": selector}}
        for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
    ]


def proxy_objects(ctx: Context) -> list[K8sObject]:
    """ConfigMap, Deployment (replicas sized by the Plan), Service (named like the Plan's proxy host), PDB."""
    port = ctx.plan.proxy_port
    replicas, cores = proxy_shape(ctx)
    selector = {LABEL_COMPONENT: COMPONENT, "app.kubernetes.io/name": PROXY_NAME}
    meta = lambda name: metadata(ctx, name, COMPONENT, selector)  # noqa: E731
    tmp, tmp_mount = tmp_volume()
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,  # routes from its instances file: no API access
        "containers": [{
            "name": "proxy",
            "image": ctx.runtime_image,
            "imagePullPolicy": "IfNotPresent",
            # the CLI binds 127.0.0.1 by default; clients reach the pod on its IP
            "command": ["ascend-deploy", "proxy", "--host", "0.0.0.0", "--port", str(port),
                        "--instances-file", f"{INSTANCES_DIR}/instances.yaml"],
            "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
            "resources": {"requests": {"cpu": str(cores), "memory": f"{max(1, -(-cores // 2))}Gi"},
                          "limits": {"memory": f"{2 * max(1, -(-cores // 2))}Gi"}},
            "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 5},
            "livenessProbe": {"tcpSocket": {"port": port}, "periodSeconds": 10, "failureThreshold": 6},
            "securityContext": pod_security(),
            "volumeMounts": [{"name": "instances", "mountPath": INSTANCES_DIR, "readOnly": True}, tmp_mount],
        }],
        "volumes": [{"name": "instances", "configMap": {"name": f"{PROXY_NAME}-instances"}}, tmp],
        "topologySpreadConstraints": spread_constraints(selector),
    }
    if cores > 1:  # one worker process per core, sharing the port (ascend-deploy proxy --workers)
        pod_spec["containers"][0]["command"] += ["--workers", str(cores)]
    if ctx.image_pull_secrets:
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets
    if PROXY_ADMIN_SECRET in ctx.secrets:  # the admin API (drain/undrain) opens only with a token
        container = pod_spec["containers"][0]
        container["command"] += ["--admin-token-env", PROXY_TOKEN_ENV]
        container["env"] = [proxy_token_env()]
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
         "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}}},
    ]
