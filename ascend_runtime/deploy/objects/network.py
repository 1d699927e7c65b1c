"""NetworkPolicies: engine ports accept only the proxy, the balancer, the checks and peer ranks.

Engine pods use hostNetwork; many CNIs do not enforce policies on host-network
pods, so the policy also lists the engine nodes' addresses as the only peers
and docs/kubernetes.md asks for the equivalent host firewall rules.
"""

from __future__ import annotations

from typing import Any

from ascend_runtime.deploy.objects.common import LABEL_COMPONENT, Context, K8sObject, metadata

CLIENT_COMPONENTS = ("proxy", "balancer", "checks")


def api_ports(ctx: Context) -> list[int]:
    """Every instance's OpenAI API port."""
    return sorted({i.api_port for i in ctx.plan.instances})


def engine_network_policy(ctx: Context) -> K8sObject:
    """Ingress to engine pods: API ports from clients (and Prometheus); all ports from peer ranks."""
    ports = [{"protocol": "TCP", "port": p} for p in api_ports(ctx)]
    clients: list[dict[str, Any]] = [
        {"podSelector": {"matchExpressions": [{"key": LABEL_COMPONENT, "operator": "In", "values": list(CLIENT_COMPONENTS)}]}}
    ]
    if ctx.k8s["prometheus_operator"]:
        clients.append({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ctx.k8s["monitoring_namespace"]}}})
    peers: list[dict[str, Any]] = [{"podSelector": {"matchLabels": {LABEL_COMPONENT: "engine"}}}]
    peers += [{"ipBlock": {"cidr": f"{ip}/32"}} for ip in sorted({r.host_ip for r in ctx.plan.ranks})]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(ctx, "engine-ingress", "engine"),
        "spec": {
            "podSelector": {"matchLabels": {LABEL_COMPONENT: "engine"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": clients, "ports": ports}, {"from": peers}],
        },
    }


def balancer_network_policy(ctx: Context) -> K8sObject:
    """The balancer's metrics port: Prometheus only (and nothing else reaches the pod)."""
    rules: list[dict[str, Any]] = []
    if ctx.k8s["prometheus_operator"]:
        rules.append({
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ctx.k8s["monitoring_namespace"]}}}],
            "ports": [{"protocol": "TCP", "port": ctx.plan.config["ports"]["balancer_metrics"]}],
        })
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(ctx, "balancer-ingress", "balancer"),
        "spec": {"podSelector": {"matchLabels": {LABEL_COMPONENT: "balancer"}}, "policyTypes": ["Ingress"], "ingress": rules},
    }


def network_policies(ctx: Context, with_balancer: bool) -> list[K8sObject]:
    """Policies of the serving namespace."""
    return [engine_network_policy(ctx), *([balancer_network_policy(ctx)] if with_balancer else [])]
