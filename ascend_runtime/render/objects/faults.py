"""The fault watcher (``ascend-deploy faults watch``, docs/faults.md) as Kubernetes objects.

Registered only when the stack sets the Pulumi secret ``proxy_admin_token``:
the watcher drains through the proxy's admin API, which needs that token.

* Secret ``pd-proxy-admin-token`` (key ``token``, the value only from Pulumi's
  secret config) - the proxy's admin token, which the proxy pods are to read
  too (``--admin-token-env``);
* ServiceAccount, and a ClusterRole + ClusterRoleBinding allowing exactly
  ``get`` on the Plan's Node objects and on the MindCluster ConfigMaps of those
  nodes, by name (``resourceNames``): ``mindx-dl-deviceinfo-<node>`` (the device
  plugin's, in ``kube-system``) and ``mindx-dl-nodeinfo-<node>`` (NodeD's, in
  ``mindx-dl``). The ConfigMap grant is cluster-wide *by name* rather than a
  RoleBinding per namespace because ``mindx-dl`` exists only where NodeD is
  installed, and a RoleBinding there would fail ``pulumi up`` everywhere else;
  no other ConfigMap, and nothing but ``get``, is granted;
* Role + RoleBinding in the serving namespace: ``list`` EndpointSlices (the
  proxy Service's endpoints are the replicas every drain goes to); in ``default``:
  ``create`` Events (Node Events are accepted only there); in the namespace of
  each fault source the stack expects (``kube-system`` for the device plugin,
  ``mindx-dl`` for NodeD): ``list`` pods, to see the source's DaemonSet pod on
  every node (``faults/sources.py``);
* ConfigMap with the topology (nodes, instances, spares; the image has no stack files);
* with spare nodes, what recovery onto them needs (``fault_spares.py``): the stack as data, ``patch`` of
  the Plan's nodes and of the engine instances' objects, by name;
* Deployment (one replica, PSS restricted, read-only root, kept off the serving
  nodes when it can be: a node fault must not take the watcher with it) and
  its metrics Service;
* NetworkPolicies: out to the API server, the proxy pods' port, the instance
  leaders' API ports (recovery checks) and DNS; in, its metrics port from the
  monitoring namespace; and into the engine leaders' API ports from the watcher;
* with the Prometheus operator, its PodMonitor and the alerting rules of
  ``fault_alerts.py`` (a fault source failed, the watcher silent).
"""

from __future__ import annotations

import json
from typing import Any

from ascend_runtime.faults import signals, sources
from ascend_runtime.faults.topology import Topology
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects.common import (
    LABEL_COMPONENT,
    PROXY_NAME,
    Context,
    K8sObject,
    metadata,
    secret_placeholder,
)
from ascend_runtime.render.objects.controller import (
    OFF_SERVING_NODES,
    RBAC,
    controller_container,
    controller_monitor,
    controller_pod_spec,
    metrics_service,
    role_with_binding,
    service_account,
    single_deployment,
)
from ascend_runtime.render.objects.fault_alerts import alert_rules
from ascend_runtime.render.objects.fault_spares import (
    spare_cluster_rules,
    spare_namespace_rules,
    stack_data,
    stack_data_args,
)
from ascend_runtime.render.objects.network import controller_policies

COMPONENT = "faults"
NAME = "ascend-fault-watcher"
TOPOLOGY_CONFIGMAP = f"{NAME}-topology"
TOPOLOGY_DIR = "/etc/ascend-deploy/faults"
TOPOLOGY_KEY = "topology.json"
#: Metrics and /healthz of the watcher pod.
METRICS_PORT = 9102
#: Pulumi secret config key of the proxy admin token (``pulumi config set --secret ascend-deepseek:proxy_admin_token``).
PROXY_ADMIN_SECRET = "proxy_admin_token"
PROXY_ADMIN_SECRET_NAME = "pd-proxy-admin-token"
PROXY_ADMIN_SECRET_KEY = "token"
#: What ``ascend-deploy faults watch`` reads the token from (the CLI's default ``--token-env``).
PROXY_TOKEN_ENV = "ASCEND_PROXY_TOKEN"


def proxy_token_env() -> dict[str, Any]:
    """The container env entry with the proxy admin token, from its Secret (never inline)."""
    return {"name": PROXY_TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": PROXY_ADMIN_SECRET_NAME, "key": PROXY_ADMIN_SECRET_KEY}}}


def cluster_role_name(ctx: Context) -> str:
    """Cluster-scoped, so named after the serving namespace (two stacks may share a cluster)."""
    return f"{NAME}-{ctx.namespace}"


def cluster_rules(ctx: Context) -> list[dict[str, Any]]:
    """``get`` on the Plan's nodes and on their MindCluster fault ConfigMaps, by name only (and, with spares,
    ``patch`` of the nodes: fault_spares.py)."""
    return rules_for_nodes([n.name for n in ctx.plan.nodes]) + spare_cluster_rules(ctx)


def rules_for_nodes(nodes: list[str]) -> list[dict[str, Any]]:
    """The ClusterRole's rules for these nodes."""
    configmaps = [signals.device_info_name(n) for n in nodes] + [signals.node_info_name(n) for n in nodes]
    return [
        {"apiGroups": [""], "resources": ["nodes"], "resourceNames": nodes, "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": configmaps, "verbs": ["get"]},
    ]


def namespace_rules() -> list[dict[str, Any]]:
    """The proxy Service's EndpointSlices, in the serving namespace."""
    return [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]


def event_rules() -> list[dict[str, Any]]:
    """Events about nodes, in ``signals.NODE_EVENT_NAMESPACE`` (the only namespace the API server takes them in)."""
    return [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def pod_rules() -> list[dict[str, Any]]:
    """The pods of a fault source's namespace (its DaemonSet's pods, selected by label: ``list`` only)."""
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]


def source_namespaces(plan: Plan) -> list[str]:
    """Namespaces of the fault sources the stack expects (where the watcher lists their pods)."""
    return sorted({sources.DAEMONSETS[s].namespace for s in Topology.from_plan(plan).expected_sources})


def foreign_role_objects(ctx: Context, selector: dict[str, str], namespace: str,
                         rules: list[dict[str, Any]]) -> list[K8sObject]:
    """Role and RoleBinding in another namespace than the serving one, for the watcher's ServiceAccount; named
    after the serving namespace, like the ClusterRole, so two stacks in one cluster keep their own."""
    name = cluster_role_name(ctx)
    meta = {**metadata(ctx, name, COMPONENT, selector), "namespace": namespace}
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": ctx.namespace}]
    return [
        {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {"apiVersion": f"{RBAC}/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name}, "subjects": subject},
    ]


def event_role_objects(ctx: Context, selector: dict[str, str]) -> list[K8sObject]:
    """Role and RoleBinding in ``default`` letting the watcher post Node Events there."""
    return foreign_role_objects(ctx, selector, signals.NODE_EVENT_NAMESPACE, event_rules())


def source_pod_role_objects(ctx: Context, selector: dict[str, str]) -> list[K8sObject]:
    """Role and RoleBinding ``list`` pods in each expected fault source's namespace (``faults/sources.py``)."""
    return [o for ns in source_namespaces(ctx.plan) for o in foreign_role_objects(ctx, selector, ns, pod_rules())]


def watch_command(ctx: Context) -> list[str]:
    """``ascend-deploy faults watch`` argv of the pod."""
    return ["ascend-deploy", "faults", "watch", "--topology", f"{TOPOLOGY_DIR}/{TOPOLOGY_KEY}",
            "--proxy-service", f"{ctx.namespace}/{PROXY_NAME}:{ctx.plan.proxy_port}",
            "--token-env", PROXY_TOKEN_ENV, "--event-namespace", signals.NODE_EVENT_NAMESPACE,
            "--device-plugin-namespace", signals.DEVICE_INFO_NAMESPACE,
            "--noded-namespace", signals.NODE_INFO_NAMESPACE,
            # the CLI binds 127.0.0.1 by default; Prometheus and the kubelet's probes use the pod IP
            "--metrics-host", "0.0.0.0", "--metrics-port", str(METRICS_PORT), *stack_data_args(ctx, TOPOLOGY_DIR)]


def network_policies(ctx: Context) -> list[K8sObject]:
    """Egress and ingress of the watcher, and the engine leaders' API ports open to it."""
    return controller_policies(ctx, NAME, COMPONENT, METRICS_PORT, ctx.plan.instances)


def fault_watcher_objects(plan: Plan, proxy_token: bool, secrets: frozenset[str] = frozenset()) -> list[K8sObject]:
    """The watcher's objects; none without the proxy admin token, or on the ``local`` target."""
    if not proxy_token or plan.target not in ("kubernetes", "kind"):
        return []
    ctx = Context(plan, secrets)
    selector = {LABEL_COMPONENT: COMPONENT, "app.kubernetes.io/name": NAME}
    meta = lambda name: metadata(ctx, name, COMPONENT, selector)
    cluster_meta = metadata(ctx, cluster_role_name(ctx), COMPONENT, selector, namespaced=False)
    container = controller_container(
        ctx, "watcher", watch_command(ctx), METRICS_PORT,
        env=[proxy_token_env(), {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        mounts=[{"name": "topology", "mountPath": TOPOLOGY_DIR, "readOnly": True}],
        readiness_period_s=5, liveness=(10, 6))
    # reads nodes and MindCluster ConfigMaps, posts Events (cluster_rules); not on a serving node when
    # another node can take it: the fault it should report could take it down
    pod_spec = controller_pod_spec(ctx, NAME, container,
                                   volumes=[{"name": "topology", "configMap": {"name": TOPOLOGY_CONFIGMAP}}],
                                   affinity=OFF_SERVING_NODES)
    subject = [{"kind": "ServiceAccount", "name": NAME, "namespace": ctx.namespace}]
    topology = Topology.from_plan(plan).to_dict()
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": metadata(ctx, PROXY_ADMIN_SECRET_NAME, COMPONENT),
         "type": "Opaque", "stringData": {PROXY_ADMIN_SECRET_KEY: secret_placeholder(PROXY_ADMIN_SECRET)}},
        service_account(ctx, NAME, COMPONENT, selector),
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRole", "metadata": cluster_meta, "rules": cluster_rules(ctx)},
        {"apiVersion": f"{RBAC}/v1", "kind": "ClusterRoleBinding", "metadata": cluster_meta,
         "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": cluster_role_name(ctx)}, "subjects": subject},
        *role_with_binding(ctx, NAME, COMPONENT, selector, namespace_rules() + spare_namespace_rules(ctx)),
        *event_role_objects(ctx, selector),
        *source_pod_role_objects(ctx, selector),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(TOPOLOGY_CONFIGMAP),
         "data": {TOPOLOGY_KEY: json.dumps(topology, indent=2, sort_keys=True) + "\n", **stack_data(ctx)}},
        *network_policies(ctx),
        single_deployment(ctx, NAME, COMPONENT, selector, pod_spec),
        metrics_service(ctx, NAME, COMPONENT, selector, METRICS_PORT),
        *controller_monitor(ctx, NAME, COMPONENT, selector),
        *alert_rules(ctx, NAME, COMPONENT, selector),
    ]
