"""The objects against the released code and published schemas of the components they target.

* engine PodDisruptionBudgets: a serving instance's ranks are never evicted, an instance that is down does
  not block the drain of its nodes (the eviction API's rules, modelled from the policy/v1 API reference);
* PodMonitor / ServiceMonitor: the published prometheus-operator CRDs (tests/deploy/crds/README.md), and
  they scrape ports that the selected pods / Services name;
* MindCluster (Ascend/mind-cluster, the device plugin's pinned tag): every flag the DaemonSet passes is
  registered by the release's flag parsing, and the node labels the kit writes are the release's names and
  values; the node patches carry the DaemonSet's nodeSelector.

With mirrors at ``$UPSTREAM_MIRRORS/<owner>+<name>/repo`` the upstream sources themselves are read;
without them those tests skip.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects.cluster import ACCELERATOR_TYPES, SUPER_POD_LABEL, node_labels
from ascend_runtime.render.objects.common import Context
from ascend_runtime.render.objects.device_plugin import RELEASE as PLUGIN_RELEASE
from ascend_runtime.render.objects.device_plugin import daemonset
from ascend_runtime.render.objects.engine import UNHEALTHY_POD_EVICTION_SINCE, instance_pdb
from ascend_runtime.render.objects.monitoring import monitors

from .conftest import K8S_STACKS, stack_run
from .crd_schemas import (
    PROMETHEUS_CRD_PATHS,
    PROMETHEUS_OPERATOR_COMMIT,
    PROMETHEUS_OPERATOR_TAG,
    committed_doc,
    schema_from_crd,
    strict_json_schema,
    validate_crd,
)
from .pods import pod_spec, workload_objects

MIRRORS = Path(os.environ.get("UPSTREAM_MIRRORS", "/nonexistent"))
PROMETHEUS_MIRROR = Path(os.environ.get("PROMETHEUS_OPERATOR_MIRROR")
                         or MIRRORS / "prometheus-operator+prometheus-operator" / "repo")
MINDCLUSTER_MIRROR = Path(os.environ.get("MINDCLUSTER_MIRROR") or MIRRORS / "Ascend+mind-cluster" / "repo")


def _git(mirror: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={mirror}", *args], check=True, capture_output=True, text=True).stdout


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against ``labels``."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
              "Exists": key in labels, "DoesNotExist": key not in labels}[op]
        if not ok:
            return False
    return True


def _template_labels(workload: dict[str, Any]) -> dict[str, str]:
    return (workload["template"] if workload["kind"] == "PodTemplate" else workload["spec"]["template"])["metadata"]["labels"]


# --- engine PodDisruptionBudgets ----------------------------------------------------------------------


def eviction_allowed(pdb_spec: dict[str, Any], ready: list[bool], evict: int) -> bool:
    """Whether the eviction API lets pod ``evict`` of a budget's pods go (all Running; ``ready``: each pod's
    Ready condition). The rules of policy/v1 ``PodDisruptionBudgetSpec`` (``maxUnavailable``,
    ``unhealthyPodEvictionPolicy``; the field's API reference): desiredHealthy = expected pods -
    maxUnavailable; a Ready pod goes only while currentHealthy - desiredHealthy > 0; a not-Ready pod
    under ``IfHealthyBudget`` (the default) only while currentHealthy >= desiredHealthy, under
    ``AlwaysAllow`` always."""
    healthy = sum(ready)
    desired = len(ready) - int(pdb_spec["maxUnavailable"])
    if ready[evict]:
        return healthy - desired > 0
    if pdb_spec.get("unhealthyPodEvictionPolicy", "IfHealthyBudget") == "AlwaysAllow":
        return True
    return healthy >= desired


def test_eviction_model_follows_the_api_rules() -> None:
    """The model above on the cases the API reference spells out (so the test below can fail)."""
    assert not eviction_allowed({"maxUnavailable": 0}, [True, True], 0)  # "prevent all voluntary evictions"
    assert eviction_allowed({"maxUnavailable": 1}, [True, True], 0)
    assert not eviction_allowed({"maxUnavailable": 0}, [False, True], 0)  # IfHealthyBudget: app disrupted
    assert eviction_allowed({"maxUnavailable": 1}, [False, True], 0)  # not disrupted: currentHealthy >= desired
    assert eviction_allowed({"maxUnavailable": 0, "unhealthyPodEvictionPolicy": "AlwaysAllow"}, [False, True], 0)
    assert not eviction_allowed({"maxUnavailable": 0, "unhealthyPodEvictionPolicy": "AlwaysAllow"}, [False, True], 1)


def test_engine_pdbs_protect_serving_ranks_but_not_a_down_instance(k8s_run) -> None:
    """A serving instance: no rank may be evicted. An instance that is down (a leader that crashed makes every
    worker unready; a worker stuck on a failed node): its unready pods may go, so a drain of its nodes
    completes instead of hanging on a budget no pod can meet."""
    plan = load_plan(k8s_run.stack)
    pdbs = {o["metadata"]["name"]: o for o in k8s_run.k8s_objects if o["kind"] == "PodDisruptionBudget"}
    pods = workload_objects(k8s_run.k8s_objects)
    assert plan.instances
    for inst in plan.all_instances:
        pdb = pdbs[inst.name]
        version = plan.config["kubernetes"]["version"]
        kubernetes_validate.validate(pdb, version, strict=True)
        assert [p for p in pods if _selects(pdb["spec"]["selector"], _template_labels(p))], f"{inst.name}: selects no pod"
        n = len(inst.ranks)
        for k in range(n):
            assert not eviction_allowed(pdb["spec"], [True] * n, k), f"{inst.name}: a serving rank {k} is evictable"
        down = [False] * n  # the leader crashed: no rank is Ready
        assert all(eviction_allowed(pdb["spec"], down, k) for k in range(n)), f"{inst.name}: a down instance blocks drains"
        if n > 1:
            stuck = [True] * (n - 1) + [False]  # one worker not Ready: the instance serves nothing
            assert eviction_allowed(pdb["spec"], stuck, n - 1)


def test_engine_pdb_policy_only_where_the_api_serves_it() -> None:
    """``unhealthyPodEvictionPolicy`` is honoured by default from 1.27 (beta); an older cluster gets the
    budget without it, and both validate against their version's schema."""
    plan = copy.deepcopy(load_plan("a2-staging"))
    inst = plan.instances[0]
    for version, expect in (("1.26", False), ("1.27", True), ("1.30", True)):
        plan.config["kubernetes"]["version"] = version
        pdb = instance_pdb(Context(plan), inst, {})
        assert ("unhealthyPodEvictionPolicy" in pdb["spec"]) is expect, version
        assert (tuple(int(x) for x in version.split(".")) >= UNHEALTHY_POD_EVICTION_SINCE) is expect
        kubernetes_validate.validate(pdb, version, strict=True)


# --- Prometheus operator monitors ---------------------------------------------------------------------


def _all_monitors() -> list[dict[str, Any]]:
    """The monitors of cm384-prod (prometheus_operator on) and, built directly, the balancer's ServiceMonitor."""
    registered = [o for o in stack_run("cm384-prod").k8s_objects if o["kind"] in ("PodMonitor", "ServiceMonitor")]
    built = monitors(Context(load_plan("cm384-prod")), with_balancer=True)
    assert {m["metadata"]["name"] for m in registered} < {m["metadata"]["name"] for m in built}
    return built


def test_monitors_fit_the_published_crds() -> None:
    for kind in ("PodMonitor", "ServiceMonitor"):
        doc = committed_doc(kind)
        assert doc["source"] == {"repository": "prometheus-operator/prometheus-operator", "tag": PROMETHEUS_OPERATOR_TAG,
                                 "commit": PROMETHEUS_OPERATOR_COMMIT, "path": PROMETHEUS_CRD_PATHS[kind]}
        assert re.fullmatch(r"v\d+\.\d+\.\d+", doc["source"]["tag"]), "a release tag, not a pre-release"
    objs = _all_monitors()
    assert {o["kind"] for o in objs} == {"PodMonitor", "ServiceMonitor"}
    for obj in objs:
        validate_crd(obj)
    # the published schema knows fields the old hand-written one refused, and refuses what it let through
    pm = next(o for o in objs if o["kind"] == "PodMonitor")
    validate_crd({**pm, "spec": {**pm["spec"], "namespaceSelector": {"matchNames": ["deepseek"]}}})
    bad = json.loads(json.dumps(pm))
    bad["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["action"] = "rename"
    with pytest.raises(jsonschema.ValidationError):
        validate_crd(bad)


def test_monitors_scrape_named_ports_of_what_they_select() -> None:
    """A PodMonitor's ``port`` names a container port of every pod it selects; a ServiceMonitor's a port of
    every Service it selects (prometheus-operator: ``port`` is a name), and each selects something."""
    objs = stack_run("cm384-prod").k8s_objects
    pods = [p for p in workload_objects(objs) if p["metadata"].get("namespace") == "deepseek"]
    services = [o for o in objs if o["kind"] == "Service"]
    for mon in (o for o in objs if o["kind"] in ("PodMonitor", "ServiceMonitor")):
        if mon["kind"] == "PodMonitor":
            chosen = [p for p in pods if _selects(mon["spec"]["selector"], _template_labels(p))]
            names = [{cp.get("name") for c in pod_spec(p)["containers"] for cp in c.get("ports", [])} for p in chosen]
            endpoints = mon["spec"]["podMetricsEndpoints"]
        else:
            chosen = [s for s in services if _selects(mon["spec"]["selector"], s["metadata"]["labels"])]
            names = [{sp.get("name") for sp in s["spec"]["ports"]} for s in chosen]
            endpoints = mon["spec"]["endpoints"]
        assert chosen, f"{mon['kind']} {mon['metadata']['name']} selects nothing"
        for ep in endpoints:
            assert all(ep["port"] in n for n in names), (mon["metadata"]["name"], ep["port"])


@pytest.mark.skipif(not (PROMETHEUS_MIRROR / "HEAD").exists(), reason="no prometheus-operator mirror on this machine")
def test_prometheus_crds_match_upstream() -> None:
    """The committed schemas are the tag's CRDs; the monitors also fit an old release's (v0.50.0)."""
    assert _git(PROMETHEUS_MIRROR, "rev-parse", f"{PROMETHEUS_OPERATOR_TAG}^{{commit}}").strip() == PROMETHEUS_OPERATOR_COMMIT
    for kind, path in PROMETHEUS_CRD_PATHS.items():
        crd = yaml.safe_load(_git(PROMETHEUS_MIRROR, "show", f"{PROMETHEUS_OPERATOR_COMMIT}:{path}"))
        assert crd["spec"]["names"]["kind"] == kind
        assert committed_doc(kind)["openAPIV3Schema"] == schema_from_crd(crd)
    for obj in _all_monitors():
        crd = yaml.safe_load(_git(PROMETHEUS_MIRROR, "show", f"v0.50.0:{PROMETHEUS_CRD_PATHS[obj['kind']]}"))
        schema = strict_json_schema(schema_from_crd(crd))
        schema["properties"]["metadata"] = {"type": "object"}
        jsonschema.validate(obj, schema)


# --- MindCluster: device plugin flags, node labels ----------------------------------------------------


def test_node_patches_carry_the_device_plugin_node_selector() -> None:
    """With ``device_plugin.install`` every patched node gets the DaemonSet's nodeSelector labels (else the
    plugin schedules nowhere); without it they are not written."""
    plan = load_plan("a2-staging")
    assert plan.config["kubernetes"]["device_plugin"]["install"]
    ctx = Context(plan)
    selector = daemonset(ctx)["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == PLUGIN_RELEASE.node_selector
    patches = [o for o in stack_run("a2-staging").k8s_objects if o["kind"] == "Node"]
    assert len(patches) == len(plan.nodes)
    for patch in patches:
        assert selector.items() <= patch["metadata"]["labels"].items(), patch["metadata"]["name"]
    off = copy.deepcopy(plan)
    off.config["kubernetes"]["device_plugin"]["install"] = False
    assert not selector.keys() & node_labels(Context(off), off.nodes[0]).keys()


def _daemonset_flags() -> list[str]:
    """Flag names in the plugin container's command line (``-name=value`` / ``--name=value``)."""
    (line,) = PLUGIN_RELEASE.args
    words = line.split()
    assert words[0] == "device-plugin"
    return [re.match(r"--?([A-Za-z][-A-Za-z0-9]*)", w).group(1) for w in words[1:]]


@pytest.mark.skipif(not (MINDCLUSTER_MIRROR / "HEAD").exists(), reason="no mind-cluster mirror on this machine")
def test_device_plugin_flags_and_labels_exist_in_the_release() -> None:
    """Every flag the DaemonSet passes is registered at the pinned tag (component/ascend-device-plugin/main.go
    and the healthz flags it registers, component/ascend-common/common-utils/healthz/healthz.go); the node
    labels the kit writes are the tag's keys and values."""
    tag = PLUGIN_RELEASE.tag
    assert _git(MINDCLUSTER_MIRROR, "rev-parse", f"{tag}^{{commit}}").strip() == PLUGIN_RELEASE.commit
    main = _git(MINDCLUSTER_MIRROR, "show", f"{tag}:component/ascend-device-plugin/main.go")
    healthz = _git(MINDCLUSTER_MIRROR, "show", f"{tag}:component/ascend-common/common-utils/healthz/healthz.go")
    assert "healthz.RegisterFlags()" in main
    registered = set(re.findall(r'flag\.[A-Za-z0-9]+\("([^"]+)"', main))
    registered |= set(re.findall(r'flag\.[A-Za-z]+Var\(&[^,]+, "([^"]+)"', healthz))
    flags = _daemonset_flags()
    assert flags == ["logFile", "logLevel", "enable-healthz", "healthz-address"]
    assert set(flags) <= registered, set(flags) - registered
    consts = _git(MINDCLUSTER_MIRROR, "show", f"{tag}:component/ascend-common/api/default_name.go")
    consts += _git(MINDCLUSTER_MIRROR, "show", f"{tag}:component/ascend-common/api/consts.go")
    consts += _git(MINDCLUSTER_MIRROR, "show", f"{tag}:component/ascend-common/devmanager/common/constants.go")
    consts += _git(MINDCLUSTER_MIRROR, "show", f"{tag}:component/ascend-for-volcano/common/util/constants.go")
    for value in ("accelerator", "huawei-Ascend910", "accelerator-type", SUPER_POD_LABEL, "huawei.com/Ascend910",
                  *ACCELERATOR_TYPES.values()):
        assert f'"{value}"' in consts, value
    for stack in K8S_STACKS:
        plan = load_plan(stack)
        if plan.target != "kubernetes":
            continue
        assert plan.config["kubernetes"]["npu_resource"] == "huawei.com/Ascend910"
