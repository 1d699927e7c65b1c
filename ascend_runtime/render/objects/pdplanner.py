"""The P:D planner (``ascend-deploy pd-planner``, docs/pd-planner.md) as Kubernetes objects.

Only for stacks with flexible node groups (``pd_ratio.mode: auto``) on the kubernetes and kind targets:

* ServiceAccount, Role and RoleBinding. The Role allows ``get`` and ``patch`` on exactly the
  flexible groups' workloads, by name (``resourceNames``): the LeaderWorkerSets or rank
  Deployments of both shapes (actuate_k8s.py patches only their ``spec.replicas``), and ``list``
  of EndpointSlices (the proxy Service's endpoints: the replicas every drain goes to). Nothing else;
* ConfigMap with the Plan (``plan.json``; the image carries no stack files);
* Deployment (one replica, PSS restricted, read-only root). With the proxy admin token set
  (``proxy_admin_token``, its Secret is the fault watcher's) it drains and moves groups; without
  it, it runs ``--dry-run`` (decides, exports metrics, moves nothing);
* NetworkPolicies: the planner out to the API server, the proxy pods, the engine leaders' API ports
  (prompt-length metrics) and DNS; in, its metrics port from the monitoring namespace; into the engine
  leaders' API ports from the planner; and, for the standby shapes' instances (whose ports the
  serving policies do not list), the proxy's egress to and the clients' ingress on their API ports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects.common import (
    LABEL_COMPONENT,
    PROXY_NAME,
    Context,
    K8sObject,
    metadata,
)
from ascend_runtime.render.objects.controller import (
    OFF_SERVING_NODES,
    controller_container,
    controller_monitor,
    controller_pod_spec,
    role_with_binding,
    service_account,
    single_deployment,
)
from ascend_runtime.render.objects.faults import PROXY_ADMIN_SECRET, proxy_token_env
from ascend_runtime.render.objects.lws import RELEASE as LWS_RELEASE
from ascend_runtime.render.objects.lws import deploys_as_lws
from ascend_runtime.render.objects.network import (
    ENGINE_LEADERS,
    controller_policies,
    network_policy,
    to_leader,
)

COMPONENT = "pdplanner"
NAME = "ascend-pd-planner"
PLAN_CONFIGMAP = f"{NAME}-plan"
PLAN_DIR = "/etc/ascend-deploy/pd-planner"
PLAN_KEY = "plan.json"
#: Metrics port of the planner pod.
METRICS_PORT = 9103
TOKEN_ENV = "ASCEND_PROXY_TOKEN"


@dataclass(frozen=True)
class Workload:
    """One object whose ``spec.replicas`` the planner sets: API path prefix and name."""

    kind: str  # Deployment | LeaderWorkerSet
    name: str

    def path(self, namespace: str) -> str:
        """The object's API path."""
        ns = quote(namespace)
        if self.kind == "LeaderWorkerSet":
            group, version = LWS_RELEASE.api_version.split("/")
            return f"/apis/{group}/{version}/namespaces/{ns}/leaderworkersets/{quote(self.name)}"
        return f"/apis/apps/v1/namespaces/{ns}/deployments/{quote(self.name)}"


def instance_workloads(plan: Plan, name: str) -> list[Workload]:
    """The workloads of one instance, as render/objects/engine.py names them."""
    inst = plan.instance(name)
    if deploys_as_lws(plan, inst):
        return [Workload("LeaderWorkerSet", inst.name)]
    return [Workload("Deployment", r.name) for r in inst.ranks]


def flexible_workloads(plan: Plan) -> list[Workload]:
    """Every workload of every flexible group, both shapes (what the planner's Role names)."""
    return [w for g in plan.flex_groups for n in (*g.prefill, *g.decode) for w in instance_workloads(plan, n)]


def role_rules(ctx: Context) -> list[dict[str, Any]]:
    """``get``/``patch`` on the flexible workloads by name; ``list`` EndpointSlices (proxy replicas)."""
    ws = flexible_workloads(ctx.plan)
    rules: list[dict[str, Any]] = []
    deployments = sorted(w.name for w in ws if w.kind == "Deployment")
    sets = sorted(w.name for w in ws if w.kind == "LeaderWorkerSet")
    if deployments:
        rules.append({"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": deployments,
                      "verbs": ["get", "patch"]})
    if sets:
        rules.append({"apiGroups": [LWS_RELEASE.api_version.split("/")[0]], "resources": ["leaderworkersets"],
                      "resourceNames": sets, "verbs": ["get", "patch"]})
    rules.append({"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]})
    return rules


def planner_command(ctx: Context, acting: bool) -> list[str]:
    """``ascend-deploy pd-planner`` argv of the pod."""
    argv = ["ascend-deploy", "pd-planner", "--plan-file", f"{PLAN_DIR}/{PLAN_KEY}",
            "--proxy-admin", f"{ctx.namespace}/{PROXY_NAME}:{ctx.plan.proxy_port}", "--token-env", TOKEN_ENV,
            "--metrics-host", "0.0.0.0", "--metrics-port", str(METRICS_PORT)]
    return argv if acting else [*argv, "--dry-run"]


def network_policies(ctx: Context) -> list[K8sObject]:
    """The planner's own traffic, and the standby instances' API ports for the proxy and clients."""
    standby_ports = [{"protocol": "TCP", "port": p} for p in sorted({i.api_port for i in ctx.plan.standby})]
    clients = {"podSelector": {"matchExpressions": [{"key": LABEL_COMPONENT, "operator": "In",
                                                     "values": ["proxy", "checks", COMPONENT]}]}}
    out = controller_policies(ctx, NAME, COMPONENT, METRICS_PORT, ctx.plan.all_instances)
    if standby_ports:
        out += [
            network_policy(ctx, f"{NAME}-standby-ingress", COMPONENT, ENGINE_LEADERS, ["Ingress"],
                           ingress=[{"from": [clients], "ports": standby_ports}]),
            network_policy(ctx, f"{NAME}-proxy-to-standby", COMPONENT, {"matchLabels": {LABEL_COMPONENT: "proxy"}},
                           ["Egress"], egress=[to_leader(ctx, i) for i in ctx.plan.standby]),
        ]
    return out


def pdplanner_objects(ctx: Context) -> list[K8sObject]:
    """The planner's objects; none without flexible groups or on the ``local`` target."""
    plan = ctx.plan
    if not plan.flex_groups or plan.target not in ("kubernetes", "kind"):
        return []
    acting = PROXY_ADMIN_SECRET in ctx.secrets
    selector = {LABEL_COMPONENT: COMPONENT, "app.kubernetes.io/name": NAME}
    container = controller_container(
        ctx, "planner", planner_command(ctx, acting), METRICS_PORT,
        env=[proxy_token_env()] if acting else (),
        mounts=[{"name": "plan", "mountPath": PLAN_DIR, "readOnly": True}], probe_path="/metrics")
    # patches the flexible workloads' replicas (role_rules); a move outlives a restart badly: give a
    # running move time to finish (drain + engine load)
    pod_spec = controller_pod_spec(
        ctx, NAME, container, volumes=[{"name": "plan", "configMap": {"name": PLAN_CONFIGMAP}}],
        terminationGracePeriodSeconds=int(plan.config["pd_ratio"]["drain_timeout_s"]) + 60,
        affinity=OFF_SERVING_NODES)
    return [
        service_account(ctx, NAME, COMPONENT, selector),
        *role_with_binding(ctx, NAME, COMPONENT, selector, role_rules(ctx)),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(ctx, PLAN_CONFIGMAP, COMPONENT, selector),
         "data": {PLAN_KEY: plan.to_json()}},
        *network_policies(ctx),
        single_deployment(ctx, NAME, COMPONENT, selector, pod_spec),
        *controller_monitor(ctx, NAME, COMPONENT, selector),
    ]
