"""NetworkPolicies of the serving namespace: default deny, and every flow the topology needs allowed.

A small evaluator of ``networking.k8s.io/v1`` NetworkPolicy semantics decides, for one connection
(source, destination, port), whether the policies selecting the source allow it out and the
policies selecting the destination allow it in. Per pod that is not on the host network (proxy,
balancer, checks Job) the test lists the policies selecting it and checks each peer and port it
needs, and a few it must not reach.

Engine pods use hostNetwork. Kubernetes leaves policy for host-network pods to the plugin: either
it tells them apart (selectors match them) or it treats their traffic as the node's (only an
``ipBlock`` of the node IP matches). Connections to an engine must be allowed under both readings.
On kind the nodes' real addresses are not the inventory's, so the engine endpoint there carries an
address the Plan does not know.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
import pytest

from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects import build_system
from ascend_runtime.render.objects.balancer import has_role
from ascend_runtime.render.objects.common import Context

from .conftest import K8S_STACKS, stack_run
from .pods import pods_by_rank

COMPONENT = "app.kubernetes.io/component"
NS_NAME_LABEL = "kubernetes.io/metadata.name"
KIND_NODE_IP = "172.18.0.7"  # a kind node's docker address: not in any inventory


@dataclass(frozen=True)
class Endpoint:
    """One end of a connection: a pod (namespace and labels), a node or an outside address."""

    name: str
    namespace: str | None = None  # None: not a pod (outside the cluster, or a node / the API server)
    labels: Mapping[str, str] = field(default_factory=dict)
    ip: str | None = None  # the address policies see; None for ordinary pods (never matched by ipBlock)
    host_network: bool = False


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """LabelSelector semantics (matchLabels and matchExpressions; an empty selector matches everything)."""
    if selector is None:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def peer_matches(peer: Mapping[str, Any], policy_ns: str, ep: Endpoint, selectors_see_ep: bool) -> bool:
    """Does one ``from``/``to`` entry match the endpoint? ``selectors_see_ep``: pod/namespace selectors apply."""
    if "ipBlock" in peer:
        if ep.ip is None:
            return False
        block = peer["ipBlock"]
        addr = ipaddress.ip_address(ep.ip)
        return addr in ipaddress.ip_network(block["cidr"]) and not any(
            addr in ipaddress.ip_network(e) for e in block.get("except", []))
    if not selectors_see_ep or ep.namespace is None:
        return False
    if "namespaceSelector" in peer:
        ns_ok = selector_matches(peer["namespaceSelector"], {NS_NAME_LABEL: ep.namespace})
    else:
        ns_ok = ep.namespace == policy_ns
    return ns_ok and selector_matches(peer.get("podSelector"), ep.labels)


def port_matches(ports: list[dict[str, Any]] | None, port: int, protocol: str) -> bool:
    if not ports:  # omitted: every port
        return True
    for p in ports:
        assert not isinstance(p.get("port"), str), "named ports are not modelled; the kit uses numbers"
        lo = p.get("port")
        hi = p.get("endPort", lo)
        if p.get("protocol", "TCP") == protocol and (lo is None or lo <= port <= hi):
            return True
    return False


def selecting(policies: Iterable[dict[str, Any]], pod: Endpoint, direction: str) -> list[dict[str, Any]]:
    """Policies of the pod's namespace that select it for ``Ingress`` or ``Egress``."""
    out = []
    for pol in policies:
        spec = pol["spec"]
        types = spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
        if (pol["metadata"]["namespace"] == pod.namespace and direction in types
                and selector_matches(spec["podSelector"], pod.labels)):
            out.append(pol)
    return out


def _side_allows(policies: list[dict[str, Any]], pod: Endpoint, peer: Endpoint, port: int, protocol: str,
                 direction: str, selectors_see_peer: bool) -> bool:
    chosen = selecting(policies, pod, direction)
    if not chosen:
        return True  # not isolated in this direction
    key, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for pol in chosen:
        for rule in pol["spec"].get(key) or []:
            peers = rule.get(peers_key)
            peer_ok = peers is None or any(
                peer_matches(p, pol["metadata"]["namespace"], peer, selectors_see_peer) for p in peers)
            if peer_ok and port_matches(rule.get("ports"), port, protocol):
                return True
    return False


def allowed(policies: list[dict[str, Any]], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
    """Is src -> dst:port allowed? With a host-network end, under both readings of the plugin's behaviour."""
    readings = (True, False) if (src.host_network or dst.host_network) else (True,)
    for sees_host_pods in readings:
        # the source's egress policies apply to pods, and to host-network pods only if the plugin sees them
        egress_applies = src.namespace is not None and (sees_host_pods or not src.host_network)
        if egress_applies and not _side_allows(policies, src, dst, port, protocol, "Egress",
                                               sees_host_pods or not dst.host_network):
            return False
        ingress_applies = dst.namespace is not None and (sees_host_pods or not dst.host_network)
        if ingress_applies and not _side_allows(policies, dst, src, port, protocol, "Ingress",
                                                sees_host_pods or not src.host_network):
            return False
    return True


# ------------------------------------------------------------------------------------- the stack's pods

def _pods(objs: list[dict[str, Any]], namespace: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Pod name -> (pod template labels, pod spec) of the serving namespace (a LeaderWorkerSet's pods by rank)."""
    ours = [o for o in objs if o["metadata"].get("namespace") == namespace]
    return {name: (t["metadata"]["labels"], t["spec"]) for name, t in pods_by_rank(ours).items()}


@dataclass
class Topology:
    """The stack's endpoints and the flows between them."""

    plan: Any
    objs: list[dict[str, Any]]

    def __post_init__(self) -> None:
        self.ns = self.plan.config["kubernetes"]["namespace"]
        self.k8s = self.plan.config["kubernetes"]
        self.policies = [o for o in self.objs if o["kind"] == "NetworkPolicy"]
        self.pods = _pods(self.objs, self.ns)
        self.dns = Endpoint("kube-dns", "kube-system", {"k8s-app": "kube-dns"})
        self.prometheus = Endpoint("prometheus", self.k8s["monitoring_namespace"], {"app.kubernetes.io/name": "prometheus"})
        self.stranger = Endpoint("other-pod", self.ns, {"app": "something-else"})
        self.foreign_pod = Endpoint("foreign", "default", {"app": "x"})
        self.client = Endpoint("client", ip="198.51.100.7")
        self.internet = Endpoint("internet", ip="203.0.113.99")
        self.api_vip = Endpoint("kubernetes-service", ip="10.96.0.1")  # before DNAT (some plugins)
        self.api_host = Endpoint("kube-apiserver", ip="192.168.10.10")  # the control plane, after DNAT

    def pod(self, name: str) -> Endpoint:
        labels, spec = self.pods[name]
        return Endpoint(name, self.ns, labels, host_network=bool(spec.get("hostNetwork")))

    def engine_leader(self, inst: Any) -> Endpoint:
        labels, spec = self.pods[inst.ranks[0].name]
        assert spec["hostNetwork"] is True
        ip = KIND_NODE_IP if self.plan.target == "kind" else inst.ranks[0].host_ip
        return Endpoint(inst.ranks[0].name, self.ns, labels, ip=ip, host_network=True)

    def non_host_network_pods(self) -> list[str]:
        return sorted(n for n, (_, spec) in self.pods.items() if not spec.get("hostNetwork"))


def _topology(stack: str) -> Topology:
    return Topology(load_plan(stack), stack_run(stack).k8s_objects)


def _balancer_name(topo: Topology) -> str | None:
    return next((n for n, (labels, _) in topo.pods.items() if labels.get(COMPONENT) == "balancer"), None)


def _balanced(topo: Topology) -> list[Any]:
    """Decode instances the balancer serves: expert-parallel ones, on targets where it is deployed."""
    if not has_role(Context(topo.plan)):
        return []
    return [i for i in topo.plan.by_role("decode") if i.ep > 1]


# ------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("stack", K8S_STACKS)
def test_default_deny_selects_every_pod_both_ways(stack: str) -> None:
    topo = _topology(stack)
    deny = [p for p in topo.policies if p["metadata"]["name"] == "default-deny"]
    assert len(deny) == 1
    spec = deny[0]["spec"]
    assert spec["podSelector"] == {} and sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert not spec.get("ingress") and not spec.get("egress")
    assert deny[0]["metadata"]["namespace"] == topo.ns
    for name in topo.pods:
        for direction in ("Ingress", "Egress"):
            assert deny[0] in selecting(topo.policies, topo.pod(name), direction), (name, direction)
    for pol in topo.policies:
        kubernetes_validate.validate(pol, topo.k8s["version"], strict=True)


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_every_non_host_network_pod_is_selected_by_its_allows(stack: str) -> None:
    """Per pod: the policies that select it (default deny plus the allows of its component)."""
    topo = _topology(stack)
    names = topo.non_host_network_pods()
    assert "pd-proxy" in names and ("post-deploy-checks" in names) == topo.k8s["post_deploy_checks"]
    expected = {"proxy": {"Ingress": {"default-deny", "proxy-ingress"}, "Egress": {"default-deny", "proxy-egress"}},
                "balancer": {"Ingress": {"default-deny", "balancer-ingress"}, "Egress": {"default-deny", "balancer-egress"}},
                "checks": {"Ingress": {"default-deny"}, "Egress": {"default-deny", "checks-egress"}}}
    for name in names:
        pod = topo.pod(name)
        for direction, want in expected[pod.labels[COMPONENT]].items():
            got = {p["metadata"]["name"] for p in selecting(topo.policies, pod, direction)}
            assert got == want, (name, direction, got)
    # every pod of the namespace that is not on the host network is one of those three
    assert {topo.pod(n).labels[COMPONENT] for n in names} <= set(expected)


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_proxy_flows(stack: str) -> None:
    topo = _topology(stack)
    proxy, port = topo.pod("pd-proxy"), topo.plan.proxy_port
    pol = topo.policies
    # in: clients from anywhere (outside, other namespaces, the checks Job, Prometheus), on its port only
    for src in (topo.client, topo.foreign_pod, topo.prometheus):
        assert allowed(pol, src, proxy, port), src.name
        assert not allowed(pol, src, proxy, port + 1), src.name
    if "post-deploy-checks" in topo.pods:
        assert allowed(pol, topo.pod("post-deploy-checks"), proxy, port)
    # a pod of the serving namespace the kit does not know has no egress at all
    assert not allowed(pol, topo.stranger, proxy, port) and not allowed(pol, topo.stranger, topo.dns, 53, "UDP")
    # out: every instance leader's API port, and DNS
    for inst in topo.plan.instances:
        leader = topo.engine_leader(inst)
        assert allowed(pol, proxy, leader, inst.api_port), inst.name
        assert not allowed(pol, proxy, leader, 22), inst.name
    assert allowed(pol, proxy, topo.dns, 53, "UDP") and allowed(pol, proxy, topo.dns, 53, "TCP")
    # nothing else: not the API server, not the internet, not other pods
    for dst, p in ((topo.api_vip, 443), (topo.api_host, 6443), (topo.internet, 443), (topo.foreign_pod, 8080)):
        assert not allowed(pol, proxy, dst, p), dst.name


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_balancer_flows(stack: str) -> None:
    topo = _topology(stack)
    name = _balancer_name(topo)
    if name is None:
        assert not _balanced(topo)
        return
    bal, pol = topo.pod(name), topo.policies
    metrics = topo.plan.config["ports"]["balancer_metrics"]
    # out: the API server (its Role: the expert-map ConfigMap), the balanced instances' API (load, maps), DNS
    assert allowed(pol, bal, topo.api_vip, 443) and allowed(pol, bal, topo.api_host, 6443)
    for inst in _balanced(topo):
        assert allowed(pol, bal, topo.engine_leader(inst), inst.api_port), inst.name
    assert allowed(pol, bal, topo.dns, 53, "UDP") and allowed(pol, bal, topo.dns, 53, "TCP")
    assert not allowed(pol, bal, topo.internet, 80) and not allowed(pol, bal, topo.pod("pd-proxy"), topo.plan.proxy_port)
    balanced_ports = {i.api_port for i in _balanced(topo)}
    for inst in topo.plan.by_role("prefill"):
        if topo.plan.target != "kind" or inst.api_port not in balanced_ports:
            assert not allowed(pol, bal, topo.engine_leader(inst), inst.api_port), inst.name
    # in: Prometheus on the metrics port when the stack has the operator; nobody else
    assert allowed(pol, topo.prometheus, bal, metrics) == topo.k8s["prometheus_operator"]
    for src in (topo.stranger, topo.foreign_pod, topo.client, topo.pod("pd-proxy")):
        assert not allowed(pol, src, bal, metrics), src.name


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_checks_job_flows(stack: str) -> None:
    topo = _topology(stack)
    if "post-deploy-checks" not in topo.pods:
        return
    checks, pol = topo.pod("post-deploy-checks"), topo.policies
    assert allowed(pol, checks, topo.pod("pd-proxy"), topo.plan.proxy_port)
    assert allowed(pol, checks, topo.dns, 53, "UDP") and allowed(pol, checks, topo.dns, 53, "TCP")
    for inst in topo.plan.instances:  # the checks go through the proxy only
        assert not allowed(pol, checks, topo.engine_leader(inst), inst.api_port), inst.name
    for dst, p in ((topo.api_vip, 443), (topo.internet, 443), (topo.foreign_pod, 9000)):
        assert not allowed(pol, checks, dst, p), dst.name
    for src in (topo.client, topo.stranger, topo.pod("pd-proxy")):
        assert not allowed(pol, src, checks, 8080), src.name


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_engines_are_host_network_and_peer_ranks_reach_each_other(stack: str) -> None:
    """Policies do not isolate host-network pods; where a plugin applies them, peers and clients still pass."""
    topo = _topology(stack)
    engines = [n for n, (labels, _) in topo.pods.items() if labels.get(COMPONENT) == "engine"]
    assert engines and all(topo.pods[n][1]["hostNetwork"] is True for n in engines)
    inst = topo.plan.instances[0]
    leader = topo.engine_leader(inst)
    # a plugin that applies selectors to host-network pods: engine-ingress and engine-egress take over
    sees = [p for p in topo.policies if selector_matches(p["spec"]["podSelector"], leader.labels)]
    assert {p["metadata"]["name"] for p in sees} == {"default-deny", "engine-ingress", "engine-egress"}
    for other in topo.plan.instances:
        peer = Endpoint(other.ranks[-1].name, topo.ns, topo.pods[other.ranks[-1].name][0],
                        ip=other.ranks[-1].host_ip, host_network=True)
        assert _side_allows(topo.policies, leader, peer, 29999, "TCP", "Ingress", True)
        assert _side_allows(topo.policies, peer, leader, 29999, "TCP", "Egress", True)
    assert _side_allows(topo.policies, leader, topo.pod("pd-proxy"), inst.api_port, "TCP", "Ingress", True)
    assert not _side_allows(topo.policies, leader, topo.stranger, inst.api_port, "TCP", "Ingress", True)


def test_the_evaluator_can_fail() -> None:
    """Without the allow policies the default deny blocks the flows above (so those tests can fail)."""
    topo = _topology("a2-staging")
    only_deny = [p for p in topo.policies if p["metadata"]["name"] == "default-deny"]
    proxy = topo.pod("pd-proxy")
    leader = topo.engine_leader(topo.plan.instances[0])
    assert not allowed(only_deny, topo.client, proxy, topo.plan.proxy_port)
    assert not allowed(only_deny, proxy, leader, topo.plan.instances[0].api_port)
    assert not allowed(only_deny, proxy, topo.dns, 53, "UDP")
    assert allowed([], proxy, leader, topo.plan.instances[0].api_port)  # no policy: not isolated
    # selectors alone do not reach a host-network engine when the plugin sees only the node's address
    egress = copy.deepcopy(next(p for p in topo.policies if p["metadata"]["name"] == "proxy-egress"))
    for rule in egress["spec"]["egress"]:
        if "to" in rule:
            rule["to"] = [peer for peer in rule["to"] if "ipBlock" not in peer]
    assert not allowed([*only_deny, egress], proxy, leader, topo.plan.instances[0].api_port)
    assert selector_matches({"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}, {"a": "c"}) is False


def test_kind_proxy_reaches_engines_whose_addresses_the_plan_does_not_know() -> None:
    """On kind the inventory's addresses are placeholders: the allow cannot rely on them."""
    topo = _topology("kind")
    proxy = topo.pod("pd-proxy")
    for inst in topo.plan.instances:
        assert topo.engine_leader(inst).ip == KIND_NODE_IP
        assert allowed(topo.policies, proxy, topo.engine_leader(inst), inst.api_port)


def test_dns_allow_names_kube_dns_in_kube_system() -> None:
    objs = build_system(load_plan("a2-staging")).all()
    dns_peers = [peer for o in objs if o["kind"] == "NetworkPolicy"
                 for rule in o["spec"].get("egress", []) if any(p.get("port") == 53 for p in rule.get("ports", []))
                 for peer in rule.get("to", [])]
    assert dns_peers and all(p == {"namespaceSelector": {"matchLabels": {NS_NAME_LABEL: "kube-system"}},
                                   "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}} for p in dns_peers)
