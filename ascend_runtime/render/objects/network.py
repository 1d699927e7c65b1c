"""NetworkPolicies of the serving namespace: deny everything, then allow what the topology needs.

* ``default-deny``: every pod of the namespace, ingress and egress, no rule.
* ``proxy-ingress``: the proxy's port from anywhere (clients, the checks Job, Prometheus).
* ``proxy-egress``: each instance leader's API port (``serving: rank``: every DP rank's); DNS.
* ``balancer-ingress``: the metrics port from the monitoring namespace (Prometheus operator only).
* ``balancer-egress``: the Kubernetes API (its Role: the expert-map ConfigMap), the balanced
  instances' API ports (expert load, maps); DNS.
* ``checks-egress``: the proxy pods' port; DNS.
* ``engine-ingress`` / ``engine-egress``: see below.

Engine pods use hostNetwork. Kubernetes leaves NetworkPolicy for host-network pods to the
plugin, and most plugins do not isolate them at all and see their traffic as the node's. So
the engine policies are a statement of intent for plugins that do apply them (ingress: API
ports from proxy, balancer, checks and Prometheus, every port from peer ranks and the engine
nodes; egress: open, for HCCL, KV transfer and model downloads), the hosts' firewalls must
enforce the same (docs/kubernetes.md), and every allow towards an engine names both the engine
pods and the engine nodes' addresses (``ipBlock``), so it holds under either behaviour.
On simulated targets (kind) the inventory's addresses are placeholders for nodes whose real
addresses the Plan does not know: allows towards engines there are by port only.
"""

from __future__ import annotations

from typing import Any

from ascend_runtime.planner.plan import InstancePlan
from ascend_runtime.planner.spares import SHARED, spare_roles
from ascend_runtime.render.objects.common import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_LEADER,
    Context,
    K8sObject,
    balanced_instances,
    metadata,
)

CLIENT_COMPONENTS = ("proxy", "balancer", "checks")
#: Where the Kubernetes API answers: the ``kubernetes`` Service (443) or, after DNAT, the API servers (6443).
API_SERVER_PORTS = (443, 6443)
KUBE_DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
DNS_RULE = {"to": [KUBE_DNS], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}


def api_ports(ctx: Context) -> list[int]:
    """Every instance's OpenAI API port (``serving: rank``: every DP rank's)."""
    return sorted({ep.port for i in ctx.plan.instances for ep in i.api_endpoints})


def network_policy(ctx: Context, name: str, component: str, selector: dict[str, Any], types: list[str],
            ingress: list[dict[str, Any]] | None = None, egress: list[dict[str, Any]] | None = None) -> K8sObject:
    spec: dict[str, Any] = {"podSelector": selector, "policyTypes": types}
    if "Ingress" in types:
        spec["ingress"] = ingress or []
    if "Egress" in types:
        spec["egress"] = egress or []
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(ctx, name, component), "spec": spec}


#: The engine pods that serve an instance's API (its leader ranks).
ENGINE_LEADERS = {"matchExpressions": [{"key": LABEL_COMPONENT, "operator": "In", "values": ["engine"]},
                                       {"key": LABEL_LEADER, "operator": "In", "values": ["true"]}]}


def controller_policies(ctx: Context, name: str, component: str, metrics_port: int,
                        instances: list[InstancePlan]) -> list[K8sObject]:
    """A kit controller's own traffic (render/objects/controller.py): three NetworkPolicies.

    ``<name>-egress``: the Kubernetes API, the proxy's port, the leaders of ``instances`` and DNS;
    ``<name>-ingress``: its metrics port from the monitoring namespace (with ``prometheus_operator``);
    ``<name>-to-engines``: the leaders of ``instances`` accept it on their API ports.
    """
    me = _component(component)
    api = {"ports": [{"protocol": "TCP", "port": p} for p in API_SERVER_PORTS]}
    to_proxy = {"to": [{"podSelector": _component("proxy")}],
                "ports": [{"protocol": "TCP", "port": ctx.plan.proxy_port}]}
    ingress = ([{"from": [_monitoring(ctx)], "ports": [{"protocol": "TCP", "port": metrics_port}]}]
               if ctx.k8s["prometheus_operator"] else [])
    ports = [{"protocol": "TCP", "port": p} for p in sorted({i.api_port for i in instances})]
    return [
        network_policy(ctx, f"{name}-egress", component, me, ["Egress"],
                       egress=[api, to_proxy, *(to_leader(ctx, i) for i in instances), DNS_RULE]),
        network_policy(ctx, f"{name}-ingress", component, me, ["Ingress"], ingress=ingress),
        network_policy(ctx, f"{name}-to-engines", component, ENGINE_LEADERS, ["Ingress"],
                       ingress=[{"from": [{"podSelector": me}], "ports": ports}]),
    ]


def _component(name: str) -> dict[str, Any]:
    return {"matchLabels": {LABEL_COMPONENT: name}}


def _monitoring(ctx: Context) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ctx.k8s["monitoring_namespace"]}}}


def spare_addresses(ctx: Context, role: str | None = None) -> list[str]:
    """Host addresses of the spare nodes an instance of ``role`` may move to (any role: every spare), where the
    fault watcher recreates a faulted instance (planner/spares.py): allows towards a leader name them too."""
    kept = spare_roles(ctx.plan)
    return [n.host_ip for n in ctx.plan.nodes if n.name in kept and (role is None or kept[n.name] in (role, SHARED))]


def to_leader(ctx: Context, inst: InstancePlan) -> dict[str, Any]:
    """Egress rule to one instance leader's API port: its pod and its node's address, and the addresses of the
    spares it may move to (by port only on kind)."""
    ports = [{"protocol": "TCP", "port": inst.api_port}]
    if ctx.simulated:
        return {"ports": ports}
    leader = inst.ranks[0]
    return {"to": [{"podSelector": {"matchLabels": {LABEL_COMPONENT: "engine", LABEL_INSTANCE: inst.name,
                                                    LABEL_LEADER: "true"}}},
                   *({"ipBlock": {"cidr": f"{ip}/32"}} for ip in [leader.host_ip, *spare_addresses(ctx, inst.role)])],
            "ports": ports}


def to_endpoints(ctx: Context, inst: InstancePlan) -> dict[str, Any]:
    """Egress rule to what the proxy routes to of one instance: its leader (:func:`to_leader`), or under
    ``serving: rank`` every DP rank's API port on the instance's engine pods, their nodes' addresses and the
    spares the instance may move to (by port only on kind)."""
    if inst.serving != "rank":
        return to_leader(ctx, inst)
    ports = [{"protocol": "TCP", "port": p} for p in sorted({ep.port for ep in inst.api_endpoints})]
    if ctx.simulated:
        return {"ports": ports}
    hosts = sorted({r.host_ip for r in inst.ranks})
    return {"to": [{"podSelector": {"matchLabels": {LABEL_COMPONENT: "engine", LABEL_INSTANCE: inst.name}}},
                   *({"ipBlock": {"cidr": f"{ip}/32"}} for ip in [*hosts, *spare_addresses(ctx, inst.role)])],
            "ports": ports}


def default_deny(ctx: Context) -> K8sObject:
    """Every pod of the namespace: no ingress, no egress, unless another policy allows it."""
    return network_policy(ctx, "default-deny", "network", {}, ["Ingress", "Egress"])


def engine_network_policy(ctx: Context) -> K8sObject:
    """Ingress to engine pods: API ports from clients (and Prometheus); all ports from peer ranks."""
    ports = [{"protocol": "TCP", "port": p} for p in api_ports(ctx)]
    clients: list[dict[str, Any]] = [
        {"podSelector": {"matchExpressions": [{"key": LABEL_COMPONENT, "operator": "In", "values": list(CLIENT_COMPONENTS)}]}}
    ]
    if ctx.k8s["prometheus_operator"]:
        clients.append(_monitoring(ctx))
    peers: list[dict[str, Any]] = [{"podSelector": _component("engine")}]
    peers += [{"ipBlock": {"cidr": f"{ip}/32"}} for ip in sorted({r.host_ip for r in ctx.plan.ranks})]
    peers += [{"ipBlock": {"cidr": f"{ip}/32"}} for ip in spare_addresses(ctx)]  # where a faulted rank moves
    return network_policy(ctx, "engine-ingress", "engine", _component("engine"), ["Ingress"],
                   ingress=[{"from": clients, "ports": ports}, {"from": peers}])


def engine_egress_policy(ctx: Context) -> K8sObject:
    """Egress of engine pods: open (peer nodes for HCCL and KV transfer, DNS, the model source)."""
    return network_policy(ctx, "engine-egress", "engine", _component("engine"), ["Egress"], egress=[{}])


def proxy_policies(ctx: Context) -> list[K8sObject]:
    """In: the proxy port from anywhere. Out: every instance leader's API port, DNS."""
    port = [{"protocol": "TCP", "port": ctx.plan.proxy_port}]
    return [
        network_policy(ctx, "proxy-ingress", "proxy", _component("proxy"), ["Ingress"], ingress=[{"ports": port}]),
        network_policy(ctx, "proxy-egress", "proxy", _component("proxy"), ["Egress"],
                egress=[*(to_endpoints(ctx, i) for i in ctx.plan.instances), DNS_RULE]),
    ]


def balancer_network_policy(ctx: Context) -> K8sObject:
    """The balancer's metrics port: Prometheus only (and nothing else reaches the pod)."""
    rules: list[dict[str, Any]] = []
    if ctx.k8s["prometheus_operator"]:
        rules.append({"from": [_monitoring(ctx)],
                      "ports": [{"protocol": "TCP", "port": ctx.plan.config["ports"]["balancer_metrics"]}]})
    return network_policy(ctx, "balancer-ingress", "balancer", _component("balancer"), ["Ingress"], ingress=rules)


def balancer_egress_policy(ctx: Context) -> K8sObject:
    """The Kubernetes API (by port: its address is the cluster's), the balanced instances' API ports, DNS."""
    api = {"ports": [{"protocol": "TCP", "port": p} for p in API_SERVER_PORTS]}
    return network_policy(ctx, "balancer-egress", "balancer", _component("balancer"), ["Egress"],
                   egress=[api, *(to_leader(ctx, i) for i in balanced_instances(ctx)), DNS_RULE])


def checks_egress_policy(ctx: Context) -> K8sObject:
    """The checks Job talks to the proxy pods only (and DNS for the Service name)."""
    to_proxy = {"to": [{"podSelector": _component("proxy")}],
                "ports": [{"protocol": "TCP", "port": ctx.plan.proxy_port}]}
    return network_policy(ctx, "checks-egress", "checks", _component("checks"), ["Egress"], egress=[to_proxy, DNS_RULE])


def network_policies(ctx: Context, with_balancer: bool) -> list[K8sObject]:
    """Policies of the serving namespace, the default deny first."""
    out = [default_deny(ctx), engine_network_policy(ctx), engine_egress_policy(ctx), *proxy_policies(ctx)]
    if with_balancer:
        out += [balancer_network_policy(ctx), balancer_egress_policy(ctx)]
    if ctx.k8s["post_deploy_checks"]:
        out.append(checks_egress_policy(ctx))
    return out
