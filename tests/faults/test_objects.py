"""The watcher's Kubernetes objects: valid, least privilege, registered by the Pulumi program and rendered."""

from __future__ import annotations

import json
import shlex
from typing import Any

import kubernetes_validate
import pytest
import yaml

import tests.deploy.test_network_policy as netpol
from tests.deploy.harness import unpinned
from tests.deploy.test_program_objects import validate_object
from ascend_runtime.cli import build_parser
from ascend_runtime.faults import signals
from ascend_runtime.faults.topology import Topology
from ascend_runtime.planner import load_plan
from ascend_runtime.render.manifests import manifest_files
from ascend_runtime.render.objects import build_system
from ascend_runtime.render.objects.common import (
    RUNTIME_GID,
    RUNTIME_UID,
    secret_placeholder,
)
from ascend_runtime.render.objects.faults import (
    METRICS_PORT,
    NAME,
    PROXY_ADMIN_SECRET,
    PROXY_ADMIN_SECRET_NAME,
    PROXY_TOKEN_ENV,
    TOPOLOGY_KEY,
    fault_watcher_objects,
)
from tests.deploy.harness import PROJECT, run_stack

K8S_STACKS = ["kind", "a2-staging", "cm384-prod"]
TOKEN = "proxy-admin-t0ken-value"


def _objs(stack: str) -> list[dict[str, Any]]:
    return fault_watcher_objects(load_plan(stack), proxy_token=True)


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return obj


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_objects_validate(stack: str) -> None:
    plan = load_plan(stack)
    objs = _objs(stack)
    operator = plan.config["kubernetes"]["prometheus_operator"]
    source_roles = ["Role", "RoleBinding"] * len(Topology.from_plan(plan).expected_sources)  # kube-system, mindx-dl
    assert [o["kind"] for o in objs] == ["Secret", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                                         "RoleBinding", "Role", "RoleBinding", *source_roles, "ConfigMap",
                                         "NetworkPolicy", "NetworkPolicy", "NetworkPolicy", "Deployment", "Service",
                                         *(["PodMonitor", "PrometheusRule"] if operator else [])]
    for obj in objs:  # the PodMonitor and PrometheusRule against prometheus-operator's CRD schemas
        validate_object(obj, plan.config["kubernetes"]["version"])
    if operator:  # it scrapes the watcher's own pods on the container port named "metrics"
        monitor, deployment = _one(objs, "PodMonitor"), _one(objs, "Deployment")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in [p["name"] for p in ports]
    broken = json.loads(json.dumps(_one(objs, "ClusterRole")))
    broken["rules"][0]["verb"] = ["get"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, plan.config["kubernetes"]["version"], strict=True)


def test_nothing_without_the_proxy_admin_token_or_on_local() -> None:
    assert fault_watcher_objects(load_plan("a2-staging"), proxy_token=False) == []
    assert fault_watcher_objects(load_plan("local"), proxy_token=True) == []


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_rbac_is_get_by_name_plus_events_and_endpointslices(stack: str) -> None:
    plan = load_plan(stack)
    objs = _objs(stack)
    nodes = [n.name for n in plan.nodes]
    role = _one(objs, "ClusterRole")
    assert role["metadata"]["name"] == f"{NAME}-{plan.config['kubernetes']['namespace']}"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "resourceNames": nodes, "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["configmaps"],
         "resourceNames": [f"mindx-dl-deviceinfo-{n}" for n in nodes] + [f"mindx-dl-nodeinfo-{n}" for n in nodes],
         "verbs": ["get"]},
    ]
    binding = _one(objs, "ClusterRoleBinding")
    ns = plan.config["kubernetes"]["namespace"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": ns}]
    roles = {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "Role"}
    bindings = {o["metadata"]["namespace"]: o for o in objs if o["kind"] == "RoleBinding"}
    assert roles[ns]["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]
    # Node Events are taken by the API server only in "default" (faults/signals.py NODE_EVENT_NAMESPACE), so
    # the Role that lets the watcher post them lives there, named after the serving namespace
    assert roles["default"]["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert roles["default"]["metadata"]["name"] == role["metadata"]["name"]
    # where the stack expects MindCluster's fault sources (target kubernetes), the watcher lists their pods
    # in their namespaces (faults/sources.py): list pods only, nothing else there
    expected = {"kube-system", "mindx-dl"} if plan.target == "kubernetes" else set()
    assert set(bindings) == {ns, "default", *expected}
    for source_ns in expected:
        assert roles[source_ns]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    for other in set(bindings) - {ns}:
        assert bindings[other]["roleRef"]["name"] == roles[other]["metadata"]["name"] == role["metadata"]["name"]
        assert bindings[other]["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": ns}]
    command = _one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--event-namespace") + 1] == "default"
    for rule in role["rules"] + [r for o in roles.values() for r in o["rules"]]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
        assert not set(rule["verbs"]) & {"update", "patch", "delete", "watch", "deletecollection"}


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_pod_is_restricted_and_reads_the_token_from_the_secret(stack: str) -> None:
    objs = _objs(stack)
    dep = _one(objs, "Deployment")
    spec = dep["spec"]["template"]["spec"]
    assert not {"hostNetwork", "hostPID", "hostIPC", "securityContext"} & set(spec)
    assert not [v for v in spec["volumes"] if "hostPath" in v]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in spec["containers"]:
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_GID, "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"}}
        (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert "emptyDir" in volumes[tmp["name"]]
        assert not [p for p in c["ports"] if "hostPort" in p]
    assert spec["serviceAccountName"] == NAME and spec["automountServiceAccountToken"] is True
    (c,) = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env[PROXY_TOKEN_ENV]["valueFrom"] == {"secretKeyRef": {"name": PROXY_ADMIN_SECRET_NAME, "key": "token"}}
    secret = _one(objs, "Secret")
    assert secret["stringData"] == {"token": secret_placeholder(PROXY_ADMIN_SECRET)}
    assert "pulumi-secret" not in json.dumps([o for o in objs if o["kind"] != "Secret"])
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": METRICS_PORT}


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_command_parses_and_the_topology_is_the_plans(stack: str) -> None:
    plan = load_plan(stack)
    objs = _objs(stack)
    cmd = _one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    args = build_parser().parse_args(cmd[1:])
    assert args.func.__name__ == "cmd_watch" and args.metrics_port == METRICS_PORT
    assert args.proxy_service == f"{plan.config['kubernetes']['namespace']}/pd-proxy:{plan.proxy_port}"
    assert args.device_plugin_namespace == signals.DEVICE_INFO_NAMESPACE
    assert args.noded_namespace == signals.NODE_INFO_NAMESPACE
    data = _one(objs, "ConfigMap")["data"][TOPOLOGY_KEY]
    assert Topology.from_dict(json.loads(data)) == Topology.from_plan(plan)
    assert shlex.join(cmd).count(TOKEN) == 0


@pytest.mark.parametrize("stack", ["kind", "a2-staging"])
def test_network_flows(stack: str) -> None:
    plan = load_plan(stack)
    objs = build_system(plan).all() + _objs(stack)
    topo = netpol.Topology(plan, objs)
    pol = topo.policies
    me = topo.pod(NAME)
    assert netpol.allowed(pol, me, topo.api_vip, 443) and netpol.allowed(pol, me, topo.api_host, 6443)
    assert netpol.allowed(pol, me, topo.pod("pd-proxy"), plan.proxy_port)
    assert not netpol.allowed(pol, me, topo.pod("pd-proxy"), plan.proxy_port + 1)
    for inst in plan.instances:  # recovery checks go straight to the leaders
        assert netpol.allowed(pol, me, topo.engine_leader(inst), inst.api_port), inst.name
        assert not netpol.allowed(pol, me, topo.engine_leader(inst), 22), inst.name
    assert netpol.allowed(pol, me, topo.dns, 53, "UDP")
    assert not netpol.allowed(pol, me, topo.internet, 80)  # 443 is open by port: the API server address is the cluster's
    assert netpol.allowed(pol, topo.prometheus, me, METRICS_PORT) == topo.k8s["prometheus_operator"]
    for src in (topo.stranger, topo.foreign_pod, topo.client, topo.pod("pd-proxy")):
        assert not netpol.allowed(pol, src, me, METRICS_PORT), src.name
    # without the watcher's own policies the default deny blocks it
    others = [p for p in pol if not p["metadata"]["name"].startswith(NAME)]
    assert not netpol.allowed(others, me, topo.pod("pd-proxy"), plan.proxy_port)


@pytest.mark.parametrize("stack", ["kind", "a2-staging"])
def test_pulumi_registers_them_and_render_writes_the_same(stack: str) -> None:
    """With the secret set, the program registers the watcher (a FaultWatcher component) and ``render``'s
    manifests hold the same objects (the Secret with the placeholder, never the value)."""
    key = f"{PROJECT}:{PROXY_ADMIN_SECRET}"
    run = run_stack(stack, {key: TOKEN}, secret_keys=[key])
    assert run.error is None, run.error
    assert any(r.typ == "ascend-deepseek:deploy:FaultWatcher" for r in run.resources)
    plan = load_plan(stack)
    # render writes the runtime image's tag reference; the program pins it by the build's digest
    registered = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
                  for o in unpinned(run.k8s_objects, plan)}
    files = manifest_files(plan, secrets=(*plan.secret_keys, PROXY_ADMIN_SECRET))
    faults_files = {p: t for p, t in files.items() if p.startswith("faults/")}
    rendered = [yaml.safe_load(t) for t in faults_files.values()]
    assert len(rendered) == len(fault_watcher_objects(plan, True))
    for obj in rendered:
        got = registered[(obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])]
        if obj["kind"] == "Secret":
            assert got["stringData"] == {"token": TOKEN}
            assert obj["stringData"] == {"token": secret_placeholder(PROXY_ADMIN_SECRET)}
            continue
        assert got == obj
    assert TOKEN not in "".join(files.values())
    # without the secret nothing of the watcher is registered or rendered
    plain = run_stack(stack)
    assert plain.error is None and not any(o["metadata"]["name"].startswith(NAME) for o in plain.k8s_objects)
    assert not [p for p in manifest_files(plan) if p.startswith("faults/")]
