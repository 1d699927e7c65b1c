"""Run __main__.py under the mock runtime for every stack; validate and check invariants."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects.balancer import has_role
from ascend_runtime.render.objects.common import Context
from ascend_runtime.render.objects.mindcluster import is_patch

from .conftest import K8S_STACKS, stack_run
from .crd_schemas import validate_crd, validate_lws
from .harness import Run
from .pods import lws_templates, workload_objects


def _plan(run: Run):
    return load_plan(run.stack)


def _by_kind(run: Run, kind: str) -> list[dict[str, Any]]:
    return [o for o in run.k8s_objects if o["kind"] == kind]


def _engine_deployments(run: Run) -> list[dict[str, Any]]:
    return [d for d in _by_kind(run, "Deployment")
            if d["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"]


def engine_pods(run: Run) -> list[tuple[list[Any], dict[str, Any], dict[str, Any]]]:
    """(the ranks a pod template runs, the template, its workload) of every engine pod template:
    a rank Deployment runs its rank, a LeaderWorkerSet's leader rank 0, its worker template ranks 1..n-1."""
    plan = _plan(run)
    ranks = {r.name: r for r in plan.ranks}
    out: list[tuple[list[Any], dict[str, Any], dict[str, Any]]] = []
    for dep in _engine_deployments(run):
        out.append(([ranks[dep["metadata"]["name"]]], dep["spec"]["template"], dep))
    for lws in _by_kind(run, "LeaderWorkerSet"):
        inst = plan.instance(lws["metadata"]["name"])
        leader, worker = lws_templates(lws)
        out += [([inst.ranks[0]], leader, lws), (list(inst.ranks[1:]), worker, lws)]
    return out


def validate_patch(obj: dict[str, Any], version: str) -> None:
    """A server-side-apply patch of an object the kit does not own (mindcluster.py) holds only the fields it owns;
    it is validated (strict) with the fields the schema requires and the patched object already has filled in
    by placeholders: a DaemonSet's selector and containers. Every field the patch sets is thus checked."""
    filled = json.loads(json.dumps(obj))
    spec = filled.setdefault("spec", {})
    spec.setdefault("selector", {"matchLabels": {"placeholder": "x"}})
    spec.setdefault("template", {}).setdefault("spec", {}).setdefault(
        "containers", [{"name": "placeholder", "image": "placeholder"}])
    kubernetes_validate.validate(filled, version, strict=True)


def validate_object(obj: dict[str, Any], version: str) -> None:
    """kubernetes-validate (strict) for built-in kinds; custom resources against their CRD schema, and a
    LeaderWorkerSet's pod templates as v1 PodTemplates with kubernetes-validate too; a patch with
    :func:`validate_patch`."""
    if is_patch(obj):
        validate_patch(obj, version)
    elif obj["apiVersion"].startswith("monitoring.coreos.com/"):
        validate_crd(obj)
    elif obj["kind"] == "LeaderWorkerSet":
        validate_lws(obj)
        for template in workload_objects([obj]):
            kubernetes_validate.validate(template, version, strict=True)
    else:
        kubernetes_validate.validate(obj, version, strict=True)


def test_every_registered_object_validates(any_run: Run) -> None:
    plan = _plan(any_run)
    version = plan.config["kubernetes"]["version"]
    checked = 0
    for obj in any_run.k8s_objects:
        validate_object(obj, version)
        checked += 1
    assert checked == len(any_run.k8s_objects)
    if plan.target == "local":
        assert checked == 0, "the local target runs processes, it registers no Kubernetes objects"
    else:
        assert checked > 10


def test_validation_can_fail() -> None:
    """The validators reject a broken object (so the test above can fail)."""
    obj = json.loads(json.dumps(_engine_deployments(stack_run("cm384-prod"))[0]))
    obj["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, "1.30", strict=True)
    lws = _by_kind(stack_run("a2-staging"), "LeaderWorkerSet")[0]
    for path, value in ((("spec", "leaderWorkerTemplate", "workerTemplate", "spec", "hostNetwrok"), True),
                        (("spec", "leaderWorkerTemplate", "restartPolicy"), "Always"),
                        (("spec", "startupPolicy"), "LeaderStarted"),
                        (("spec", "leaderWorkerTemplate", "size"), "4"),
                        (("metadata", "name"), "0-decode")):  # a DNS-1035 label: it names the headless Service
        broken = json.loads(json.dumps(lws))
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate_object(broken, "1.30")
    validate_object(lws, "1.30")
    # monitors against the published prometheus-operator CRDs (crd_schemas.PROMETHEUS_OPERATOR_TAG)
    monitors = [o for o in stack_run("cm384-prod").k8s_objects if o["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert {m["kind"] for m in monitors} == {"PodMonitor", "ServiceMonitor"}
    for monitor in monitors:
        validate_crd(monitor)
        endpoints = "podMetricsEndpoints" if monitor["kind"] == "PodMonitor" else "endpoints"
        for key, value in (("interval", "15 seconds"), ("port", 8000), ("metricsPath", "/metrics")):
            broken = json.loads(json.dumps(monitor))
            broken["spec"][endpoints][0][key] = value  # a bad duration, a number for the port's name, a typo
            with pytest.raises(jsonschema.ValidationError):
                validate_crd(broken)
        broken = json.loads(json.dumps(monitor))
        del broken["spec"]["selector"]  # required by both CRDs
        with pytest.raises(jsonschema.ValidationError):
            validate_crd(broken)


def test_registered_counts() -> None:
    """Every rank has a pod; counts per stack as designed."""
    for stack in K8S_STACKS:
        run, plan = stack_run(stack), load_plan(stack)
        lws = _by_kind(run, "LeaderWorkerSet")
        assert len(_engine_deployments(run)) + sum(o["spec"]["leaderWorkerTemplate"]["size"] for o in lws) == len(plan.ranks)
        assert len(lws) == sum(1 for i in plan.instances if len(i.ranks) > 1)
        assert len(_by_kind(run, "Node")) == len(plan.nodes)
        names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in run.k8s_objects]
        assert len(names) == len(set(names)), "duplicate objects"


def test_engine_pods_pinned_with_node_ip(k8s_run: Run) -> None:
    """Rank Deployments and LeaderWorkerSet leaders are pinned to their Plan node with its IP; LeaderWorkerSet
    workers may land on any of their instance's worker nodes (their node's values: tests/deploy/test_lws.py)."""
    plan = _plan(k8s_run)
    nodes = {n.name: n for n in plan.nodes}
    for ranks, template, owner in engine_pods(k8s_run):
        pod = template["spec"]
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        if owner["kind"] == "Deployment" or ranks[0].is_leader:
            (rank,) = ranks
            assert pod["nodeSelector"] == {"kubernetes.io/hostname": rank.node}
            assert env["HCCL_IF_IP"] == nodes[rank.node].host_ip
        else:
            assert "nodeSelector" not in pod
            # one worker node: its IP is every worker's; several: the worker script sets the node's own
            assert env.get("HCCL_IF_IP") == (nodes[ranks[0].node].host_ip if len(ranks) == 1 else None)
            (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In",
                                                 "values": [r.node for r in ranks]}]
        if owner["kind"] == "Deployment":
            assert owner["spec"]["replicas"] == 1 and owner["spec"]["strategy"] == {"type": "Recreate"}


def _server_ids(doc: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key == "server_id":
                found.add(value)
            else:
                found |= _server_ids(value)
    elif isinstance(doc, list):
        for item in doc:
            found |= _server_ids(item)
    return found


def test_every_rank_table_server_has_a_rank_pod(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    node_of_ip = {n.host_ip: n.name for n in plan.nodes}
    pinned = {d["spec"]["template"]["spec"]["nodeSelector"]["kubernetes.io/hostname"] for d in _engine_deployments(k8s_run)}
    if plan.kv_connector == "llmdatadist":  # every rank of a rank-table dialect is a pinned Deployment
        assert not _by_kind(k8s_run, "LeaderWorkerSet")
    tables = [cm for cm in _by_kind(k8s_run, "ConfigMap") if cm["metadata"]["name"].endswith("-ranktable")]
    if plan.kv_connector != "llmdatadist":
        # no process of a Mooncake engine reads a rank table: none is shipped to (or mounted by) engine pods
        assert tables == []
        return
    assert len(tables) == len(plan.instances)
    seen = 0
    for cm in tables:
        for text in cm["data"].values():
            for server_id in _server_ids(json.loads(text)):
                assert node_of_ip[server_id] in pinned, f"{server_id} has no rank pod"
                seen += 1
    assert seen >= len(plan.instances)


def test_npu_requests_fit_nodes_and_sum_to_plan(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    resource = plan.config["kubernetes"]["npu_resource"]
    per_node: Counter[str] = Counter()
    for ranks, template, _ in engine_pods(k8s_run):
        res = template["spec"]["containers"][0]["resources"]
        requested = int(res.get("requests", {}).get(resource, 0))
        assert requested == int(res.get("limits", {}).get(resource, 0))
        for rank in ranks:  # one pod per rank, on one of these ranks' nodes (one of the group per node)
            assert requested in (0, len(rank.devices))
            per_node[rank.node] += requested
    if plan.target == "kind":
        assert sum(per_node.values()) == 0, "kind requests no NPUs"
        return
    for node in plan.nodes:
        assert per_node[node.name] <= node.device_count
    assert sum(per_node.values()) == sum(i.npus for i in plan.instances)


def test_engine_mounts_and_shm(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    cfg = plan.config["kubernetes"]
    for ranks, template, owner in engine_pods(k8s_run):
        pod = template["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{cfg['shm_size_gib']}Gi"}
        assert "/dev/shm" in mounts
        # the node's own hccn.conf; on kind a simulated node's from the ConfigMap, which only a pinned pod can pick
        worker_template = owner["kind"] == "LeaderWorkerSet" and not ranks[0].is_leader
        assert ("/etc/hccn.conf" in mounts) == (plan.target != "kind" or not worker_template)
        assert "/etc/ascend-deploy/launch" in mounts
        assert ("/etc/ascend-deploy/ranktables" in mounts) == (plan.kv_connector == "llmdatadist")
        if plan.target == "kind":
            assert not any("hostPath" in v for v in volumes.values())
            continue
        host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
        for path in ("/usr/local/Ascend/driver/lib64", "/usr/local/Ascend/driver/version.info", "/usr/local/dcmi",
                     "/usr/local/bin/npu-smi", "/etc/ascend_install.info", "/etc/hccn.conf"):
            assert path in host_paths
        model = volumes["model"]
        if cfg["model_source"] == "pvc":
            assert model["persistentVolumeClaim"] == {"claimName": cfg["model_pvc_name"], "readOnly": True}
        else:
            assert model["hostPath"]["path"] == cfg["model_host_path"]
        if cfg.get("runtime_class"):
            assert pod["runtimeClassName"] == cfg["runtime_class"]


def test_probes_never_kill_a_loading_engine_and_follow_the_leader(k8s_run: Run) -> None:
    """Workers' readiness is the leader's /health; liveness starts only after a long startup probe; a
    LeaderWorkerSet worker has no liveness (the group is recreated by the controller)."""
    plan = _plan(k8s_run)
    budget = plan.config["kubernetes"]["startup_probe_seconds"]
    for ranks, template, owner in engine_pods(k8s_run):
        rank = ranks[0]
        inst = plan.instance(rank.instance)
        c = template["spec"]["containers"][0]
        assert int(owner["metadata"]["annotations"]["pulumi.com/timeoutSeconds"]) > budget
        if owner["kind"] == "LeaderWorkerSet" and not rank.is_leader:
            assert set(c) & {"startupProbe", "readinessProbe", "livenessProbe"} == {"readinessProbe"}
            probes = [c["readinessProbe"]]
        else:
            startup = c["startupProbe"]
            assert startup["periodSeconds"] * startup["failureThreshold"] >= budget
            assert "livenessProbe" in c and "readinessProbe" in c
            probes = [startup, c["readinessProbe"], c["livenessProbe"]]
        for probe in probes:
            if "httpGet" in probe:
                assert probe["httpGet"]["path"] == "/health" and probe["httpGet"]["port"] == inst.api_port
                if rank.is_leader:
                    assert "host" not in probe["httpGet"]
                else:
                    assert probe["httpGet"]["host"] == inst.ranks[0].host_ip
            else:
                assert not rank.is_leader and plan.target == "kind"
                assert f"{inst.name}-api" in probe["exec"]["command"][-1]


def test_balancer_role_grants_only_its_configmap(k8s_run: Run) -> None:
    roles = _by_kind(k8s_run, "Role")
    cluster_wide = [o for o in _by_kind(k8s_run, "ClusterRole") + _by_kind(k8s_run, "ClusterRoleBinding")
                    if o["metadata"]["labels"].get("app.kubernetes.io/component") != "device-plugin"]
    assert not cluster_wide  # only the device plugin's (tests/deploy/test_device_plugin.py)
    balancer_roles = [r for r in roles if r["metadata"]["name"] == "expert-balancer"]
    # other Roles are the P:D planner's and the fault watcher's, each tested with its component
    assert {r["metadata"]["labels"]["app.kubernetes.io/component"] for r in roles} <= {"balancer", "pdplanner", "faults"}
    if not has_role(Context(_plan(k8s_run))):  # vLLM-Ascend 0.23.0 balances in the engine: no daemon
        assert not balancer_roles
        return
    assert len(balancer_roles) == 1
    rules = balancer_roles[0]["rules"]
    assert len(rules) == 1
    rule = rules[0]
    assert rule["apiGroups"] == [""] and rule["resources"] == ["configmaps"]
    assert rule["resourceNames"] == ["expert-map"]
    assert set(rule["verbs"]) <= {"get", "update"}
    ns = roles[0]["metadata"]["namespace"]
    assert any(cm["metadata"]["name"] == "expert-map" and cm["metadata"]["namespace"] == ns
               for cm in _by_kind(k8s_run, "ConfigMap"))
    (binding,) = _by_kind(k8s_run, "RoleBinding")
    assert binding["roleRef"]["name"] == "expert-balancer"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "expert-balancer", "namespace": ns}]
    users = [d for d in _by_kind(k8s_run, "Deployment") if d["spec"]["template"]["spec"].get("serviceAccountName")]
    assert [d["metadata"]["name"] for d in users] == ["expert-balancer"]
    for dep in _by_kind(k8s_run, "Deployment") + _by_kind(k8s_run, "Job"):
        if dep["metadata"]["name"] in ("pd-proxy", "post-deploy-checks"):
            assert dep["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_engine_ports_accept_only_proxy_balancer_checks_and_peers(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    policy = next(p for p in _by_kind(k8s_run, "NetworkPolicy") if p["metadata"]["name"] == "engine-ingress")
    assert policy["spec"]["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "engine"}}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    engine_ips = {f"{r.host_ip}/32" for r in plan.ranks}
    monitoring_ns = plan.config["kubernetes"]["monitoring_namespace"]
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            if "ipBlock" in peer:
                assert peer["ipBlock"]["cidr"] in engine_ips
            elif "namespaceSelector" in peer:
                assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": monitoring_ns}}
                assert "ports" in rule
            elif "matchExpressions" in peer["podSelector"]:
                (expr,) = peer["podSelector"]["matchExpressions"]
                assert set(expr["values"]) <= {"proxy", "balancer", "checks"} and "ports" in rule
            else:
                assert peer["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "engine"}}


def test_pdbs_and_services(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    pdbs = {p["metadata"]["name"] for p in _by_kind(k8s_run, "PodDisruptionBudget")}
    assert {"pd-proxy", *(i.name for i in plan.instances)} <= pdbs
    services = {s["metadata"]["name"]: s for s in _by_kind(k8s_run, "Service")}
    assert plan.proxy_host.split(".")[0] in services  # the Plan's proxy endpoint exists
    assert services["pd-proxy"]["spec"]["ports"][0]["port"] == plan.proxy_port


def test_node_patches_label_like_atlas_nodes(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    patches = {n["metadata"]["name"]: n for n in _by_kind(k8s_run, "Node")}
    for node in plan.nodes:
        labels = patches[node.name]["metadata"]["labels"]
        assert labels["accelerator"] == "huawei-Ascend910"
        assert labels["accelerator-type"] == ("module-910b-8" if plan.hardware == "atlas-800i-a2" else "module-a3-16-super-pod")
        # the super pod label is the device plugin's alone (deploy/node_labels.py reads it)
        assert "huawei.com/topotree.superpodid" not in labels
        if node.role:
            assert labels["ascend-deepseek/serving-role"] == node.role
        # labels only: the serving taint is no part of a node patch (test_engine_resources_and_taints.py)
        assert set(patches[node.name]) == {"apiVersion", "kind", "metadata"}


def test_checks_job_awaited_and_scripted(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    (job,) = _by_kind(k8s_run, "Job")
    assert job["metadata"]["annotations"]["pulumi.com/skipAwait"] == "false"
    assert job["spec"]["backoffLimit"] == 0
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert script.startswith("set -eu\n")
    assert f"check smoke --endpoint {plan.proxy_url}" in script
    assert "check throughput" in script and f"--num-prompts {plan.config['throughput_check']['num_prompts']}" in script


def test_monitoring_objects(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    cfg = plan.config["kubernetes"]
    monitors = [o for o in k8s_run.k8s_objects if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert bool(monitors) == cfg["prometheus_operator"]
    dashboards = [cm for cm in _by_kind(k8s_run, "ConfigMap") if cm["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert len(dashboards) == (1 if cfg["grafana_dashboard"] else 0)
    if dashboards:
        dash = json.loads(next(iter(dashboards[0]["data"].values())))
        exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
        for metric in ("ascend_proxy_ttft_seconds_bucket", "ascend_proxy_itl_seconds_bucket", "ascend_proxy_requests_total",
                       "vllm:request_prefill_time_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
                       "vllm:kv_cache_usage_perc", "vllm:prompt_tokens_by_source_total", "vllm:generation_tokens_total"):
            assert metric in exprs
        assert cfg["prometheus_operator"]  # the monitors that label what the queries select (test_monitoring.py)
        # the balancer's panels only where its daemon runs (simulators; not on vLLM-Ascend 0.23.0)
        deployed = any(o["kind"] == "Deployment" and "balancer" in o["metadata"]["name"] for o in k8s_run.k8s_objects)
        assert ("ascend_balancer_balancedness" in exprs) == deployed
        assert "[[" not in exprs and "{{" in json.dumps(dash)  # template variables filled, Grafana legends kept


def test_stack_outputs(k8s_run: Run) -> None:
    plan = _plan(k8s_run)
    out = k8s_run.exports
    assert out["proxy_endpoint"] == plan.proxy_url
    assert {n: v["nodes"] for n, v in out["instances"].items()} == {i.name: list(i.nodes) for i in plan.instances}
    assert out["rank_table_digests"] and all(len(d) == 64 for d in out["rank_table_digests"].values())
    assert out["plan_summary"]["decode_npus"] == sum(i.npus for i in plan.by_role("decode"))


def test_grouping_per_component() -> None:
    """Every Kubernetes object is a child of one of the components (types seen by the mock monitor)."""
    run = stack_run("a2-staging")
    types = Counter(r.typ for r in run.resources if not r.is_k8s)
    assert types["ascend-deepseek:deploy:ServingSystem"] == 1
    assert types["ascend-deepseek:deploy:EngineInstance"] == len(load_plan("a2-staging").instances)
    for name in ("ClusterPrep", "Proxy", "NetworkPolicies", "Monitoring", "PostDeployChecks"):
        assert types[f"ascend-deepseek:deploy:{name}"] == 1
    assert types["ascend-deepseek:deploy:Balancer"] == 0  # 0.23.0: the engine balances itself
    grouped: dict[str, int] = defaultdict(int)
    for r in run.resources:
        grouped[r.typ.split(":")[0]] += 1
    assert grouped["kubernetes"] > 30
