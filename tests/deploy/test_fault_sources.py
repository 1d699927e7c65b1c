"""Under the mock runtime: MindCluster's fault sources schedule on the tainted serving nodes, and the super pod
label has one writer (the device plugin), which the program reads and holds the inventory to.

Tolerations (render/objects/mindcluster.py): NodeD's v26.1.0 DaemonSet tolerates nothing and MindCluster's
device plugin only its own keys, so the program patches their pod templates' tolerations; the kit's own
device plugin tolerates the taint by itself. Labels (deploy/node_labels.py): no NodePatch writes
``huawei.com/topotree.superpodid``; every A3 node is read, and a label that disagrees with the inventory fails
the run naming the node and both values before any engine is registered.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from ascend_runtime.faults import sources
from ascend_runtime.faults.signals import MINDCLUSTER_RELEASE
from ascend_runtime.faults.topology import Topology
from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects.cluster import SUPER_POD_LABEL, serving_taint_commands
from ascend_runtime.render.objects.common import Context
from ascend_runtime.render.objects.device_plugin import RELEASE as PLUGIN_RELEASE
from ascend_runtime.render.objects.mindcluster import PATCH_FIELD_MANAGER, PATCH_FORCE, SKIP_AWAIT, is_patch
from ascend_runtime.render.objects.fault_alerts import rules
from ascend_runtime.render.objects.faults import fault_watcher_objects

from .conftest import K8S_STACKS, stack_run
from .harness import ROOT, Run, run_stack
from .test_program_objects import validate_object

MIRROR = Path(os.environ.get("MINDCLUSTER_MIRROR") or Path(os.environ.get("UPSTREAM_MIRRORS", "/nonexistent"))
              / "Ascend+mind-cluster" / "repo")
NODE = "kubernetes:core/v1:Node"


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, str]) -> bool:
    """Kubernetes' rule (``ToleratesTaint``, k8s.io/api core/v1 toleration.go): the effect matches or is empty,
    the key matches or is empty with ``Exists``, and ``Exists`` or the value matches under ``Equal``."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint["effect"]):
            continue
        if t.get("key") not in (None, "") and t["key"] != taint["key"]:
            continue
        if t.get("key") in (None, "") and t.get("operator") != "Exists":
            continue
        if t.get("operator", "Equal") == "Exists" or t.get("value", "") == taint["value"]:
            return True
    return False


def serving_taints(stack: str) -> list[dict[str, str]]:
    """The taints the stack's ``node_taint_commands`` put on its serving nodes (``key=value:effect``)."""
    out = []
    for argv in serving_taint_commands(Context(load_plan(stack))):
        key, _, rest = argv[5].partition("=")
        value, _, effect = rest.partition(":")
        out.append({"key": key, "value": value, "effect": effect})
    return out


def daemonset_tolerations(run: Run, source: sources.DaemonSetSource) -> tuple[list[dict[str, Any]], bool]:
    """(tolerations the source's pods get on the cluster after the program ran, whether by a patch)."""
    (obj,) = [o for o in run.k8s_objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == source.daemonset
              and o["metadata"]["namespace"] == source.namespace]
    return obj["spec"]["template"]["spec"]["tolerations"], is_patch(obj)


@pytest.mark.parametrize("stack", [s for s in K8S_STACKS if load_plan(s).target == "kubernetes"])
def test_noded_and_the_device_plugin_tolerate_the_serving_taint(stack: str) -> None:
    run = stack_run(stack)
    plan = load_plan(stack)
    taints = serving_taints(stack)
    assert {t["value"] for t in taints} == {"prefill", "decode"}
    for name in (sources.NODED, sources.DEVICE_PLUGIN):
        tolerations, patched = daemonset_tolerations(run, sources.DAEMONSETS[name])
        for taint in taints:
            assert tolerates(tolerations, taint), (stack, name, taint)
        # the kit's own device plugin tolerates by itself; MindCluster's DaemonSets are patched
        assert patched == (name == sources.NODED or not plan.config["kubernetes"]["device_plugin"]["install"])
    patches = [(r, r.inputs) for r in run.resources if r.is_k8s and r.typ == "kubernetes:apps/v1:DaemonSetPatch"]
    assert patches and all(is_patch(o) for _, o in patches)
    version = plan.config["kubernetes"]["version"]
    for _, obj in patches:
        annotations = obj["metadata"]["annotations"]
        assert annotations[PATCH_FORCE] == "true" and annotations[SKIP_AWAIT] == "true"
        assert annotations[PATCH_FIELD_MANAGER] == f"ascend-deepseek-{plan.config['kubernetes']['namespace']}"
        # the patch owns only the tolerations list (an atomic list: the manifest's entries and the taint's)
        assert set(obj["spec"]) == {"template"} and set(obj["spec"]["template"]) == {"spec"}
        assert set(obj["spec"]["template"]["spec"]) == {"tolerations"}
        validate_object(obj, version)


def test_without_the_patch_the_manifests_would_not_schedule_there() -> None:
    """The check above can fail: NodeD's and MindCluster's device plugin's own tolerations do not pass the taint."""
    for taint in serving_taints("cm384-prod"):
        assert not tolerates([], taint)  # noded.yaml: no tolerations
        assert not tolerates([dict(t) for t in PLUGIN_RELEASE.tolerations], taint)


def _stacks_copy(tmp_path: Path, stack: str, **kubernetes: Any) -> Path:
    target = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", target)
    path = target / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["ascend-deepseek:kubernetes"].update(kubernetes)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def test_no_patch_for_a_source_the_stack_does_not_expect_nor_without_the_taint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(_stacks_copy(tmp_path / "a", "cm384-prod",
                                                                 fault_sources={"noded": False})))
    run = run_stack("cm384-prod")
    assert run.error is None, run.error
    names = [o["metadata"]["name"] for o in run.k8s_objects if is_patch(o)]
    assert names == ["ascend-device-plugin-daemonset"]
    assert Topology.from_plan(load_plan("cm384-prod")).expected_sources == (sources.DEVICE_PLUGIN,)
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(_stacks_copy(tmp_path / "b", "cm384-prod", taint_nodes=False)))
    assert not [o for o in run_stack("cm384-prod").k8s_objects if is_patch(o)]
    # kind runs no MindCluster: nothing patched, nothing expected
    assert not [o for o in stack_run("kind").k8s_objects if is_patch(o)]
    assert Topology.from_plan(load_plan("kind")).expected_sources == ()


def _manifest_daemonset(path: str) -> dict[str, Any]:
    text = subprocess.run(["git", f"--git-dir={MIRROR}", "show", f"{MINDCLUSTER_RELEASE}:{path}"],
                          capture_output=True, text=True, check=True).stdout
    (ds,) = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "DaemonSet"]
    return ds


@pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no mind-cluster mirror on this machine")
def test_patches_keep_the_v26_1_0_manifests_tolerations() -> None:
    """A patch owns the whole (atomic) list: it must hold every toleration the release's manifest has, in order,
    before the serving taint's, or it would take them away."""
    run = stack_run("cm384-prod")
    for source in sources.DAEMONSETS.values():
        manifest = _manifest_daemonset(source.manifest)["spec"]["template"]["spec"].get("tolerations") or []
        tolerations, patched = daemonset_tolerations(run, source)
        assert patched and tolerations[:len(manifest)] == manifest, source.manifest
        assert tolerations[len(manifest):] == [{"key": "ascend-deepseek/serving", "operator": "Exists",
                                                "effect": "NoSchedule"}] or source.source == sources.DEVICE_PLUGIN


# --- one writer of the super pod label ---------------------------------------------------------------


def _labelled(stack: str, **override: str) -> dict[tuple[str, str], dict[str, Any]]:
    """What reading each Node of ``stack`` answers: the super pod label as the device plugin wrote it (the
    inventory's value, or ``override[node]``; ``""`` leaves the label out)."""
    out = {}
    for n in load_plan(stack).nodes:
        value = override.get(n.name, str(n.super_pod_id))
        labels = {"kubernetes.io/hostname": n.name, **({SUPER_POD_LABEL: value} if value else {})}
        out[(NODE, n.name)] = {"metadata": {"name": n.name, "labels": labels}}
    return out


def test_the_kit_reads_the_super_pod_label_and_never_writes_it() -> None:
    plan = load_plan("cm384-prod")
    run = run_stack("cm384-prod", read_states=_labelled("cm384-prod"))
    assert run.error is None, run.error
    assert sorted(r.read_id for r in run.reads if r.typ == NODE) == sorted(n.name for n in plan.nodes)
    patches = [o for o in run.k8s_objects if o["kind"] == "Node"]
    assert len(patches) == len(plan.nodes) and not any(SUPER_POD_LABEL in p["metadata"]["labels"] for p in patches)
    # A2 has no super pods: nothing read
    assert not [r for r in stack_run("a2-staging").reads if r.typ == NODE]


def test_an_inventory_that_disagrees_with_the_label_is_refused_naming_node_and_values() -> None:
    node = load_plan("cm384-prod").nodes[3]
    run = run_stack("cm384-prod", read_states=_labelled("cm384-prod", **{node.name: "7"}))
    text = str(run.error)
    assert run.error is not None and "invalid configuration" in text
    assert "inventory.nodes[3].devices[*].super_pod_id" in text
    assert f"node {node.name} is in super pod 7 by its label {SUPER_POD_LABEL}=7" in text
    assert f"in super pod {node.super_pod_id} by the inventory" in text
    assert f"--limit {node.name}" in text
    # nothing that waits for the cluster preparation was registered: no engine, no proxy
    kinds = {r.typ for r in run.resources if r.is_k8s}
    assert "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet" not in kinds
    assert not [r for r in run.resources if r.is_k8s and r.name.endswith("pd-proxy")]


def test_a_node_the_plugin_has_not_labelled_yet_passes() -> None:
    node = load_plan("cm384-prod").nodes[0]
    run = run_stack("cm384-prod", read_states=_labelled("cm384-prod", **{node.name: ""}))
    assert run.error is None, run.error


# --- the alert rules ------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (the prometheus package) is not installed")
def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    (rule,) = [o for o in fault_watcher_objects(load_plan("cm384-prod"), True) if o["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"][0]["rules"] == rules("deepseek")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {r["alert"] for r in rule["spec"]["groups"][0]["rules"]} == {"AscendFaultSourceFailed",
                                                                        "AscendFaultWatcherSilent"}
