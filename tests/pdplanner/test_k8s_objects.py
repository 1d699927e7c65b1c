"""Under the Pulumi mock runtime: a pd_ratio auto copy of the kind stack registers both shapes of its
flexible group, the planner's objects validate, and the scaled replica fields carry ignoreChanges."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi.runtime import mocks

from ascend_runtime.pdplanner.actuate_k8s import flexible_workloads
from ascend_runtime.pdplanner.from_plan import plan_from_json
from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects.faults import PROXY_ADMIN_SECRET
from tests.deploy.harness import PROJECT, ROOT, normalize, run_stack
from tests.deploy.test_program_objects import validate_object

NS = PROJECT + ":"


def auto_kind(tmp_path: Path) -> Path:
    """stacks/ copied with two more kind nodes and one flexible group on them (starting as decode)."""
    stacks = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", stacks)
    inv_file = stacks / "inventories" / "kind.yaml"
    inv = yaml.safe_load(inv_file.read_text())
    for k in range(2):
        node = copy.deepcopy(inv["nodes"][-1])
        node["name"], node["host_ip"] = f"ascend-worker-flex{k}", f"192.0.2.{220 + k}"
        for j, dev in enumerate(node["devices"]):
            dev["device_ip"] = f"203.0.113.{200 + 8 * k + j}"
        inv["nodes"].append(node)
    inv_file.write_text(yaml.safe_dump(inv, sort_keys=False))
    f = stacks / "Pulumi.kind.yaml"
    doc = yaml.safe_load(f.read_text())
    doc["config"][NS + "pd_ratio"] = {"mode": "auto", "groups": 1}
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return stacks


class _Captured:
    """ignoreChanges of every RegisterResource request, by logical name and type."""

    def __init__(self) -> None:
        self.ignore: dict[tuple[str, str], list[str]] = {}


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Captured]:
    cap = _Captured()
    original = mocks.MockMonitor.RegisterResource

    def register(self, request):  # type: ignore[no-untyped-def]
        cap.ignore[(request.type, request.name)] = list(request.ignoreChanges)
        return original(self, request)

    monkeypatch.setattr(mocks.MockMonitor, "RegisterResource", register)
    yield cap


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, captured: _Captured):  # type: ignore[no-untyped-def]
    stacks = auto_kind(tmp_path)
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(stacks))
    key = NS + PROXY_ADMIN_SECRET
    result = run_stack("kind", {key: "t0ken"}, secret_keys=[key])
    assert result.error is None, result.error
    return result, load_plan("kind", stacks), captured


def _named(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in objs if o["kind"] == kind])
    return found[0]


def test_both_shapes_registered_planner_objects_validate_and_replicas_are_ignored(run) -> None:  # type: ignore[no-untyped-def]
    result, plan, cap = run
    objs = result.k8s_objects
    version = plan.config["kubernetes"]["version"]
    for obj in objs:
        validate_object(obj, version)
    (group,) = plan.flex_groups
    assert group.initial == "decode" and group.decode == ("decode-1",) and group.prefill == ("prefill-1",)
    flexible = flexible_workloads(plan)
    assert {w.name for w in flexible} == {"decode-1", "prefill-1"}
    by_type = {"Deployment": "kubernetes:apps/v1:Deployment",
               "LeaderWorkerSet": "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet"}
    for w in flexible:
        obj = _named(objs, w.kind, w.name)
        assert obj["spec"]["replicas"] == (1 if w.name == "decode-1" else 0)
        assert obj["metadata"]["annotations"].get("pulumi.com/skipAwait") == "true"
        tolerations = [t for tpl in _templates(obj) for t in tpl["spec"]["tolerations"]]
        assert tolerations and all(t["operator"] == "Exists" for t in tolerations)
        ignore = [v for (typ, name), v in cap.ignore.items() if name.endswith("/" + w.name) and typ == by_type[w.kind]]
        assert ignore == [["spec.replicas"]], (w, ignore)
    # a fixed instance's workload is Pulumi's alone
    fixed = _named(objs, "LeaderWorkerSet", "decode-0")
    assert fixed["spec"]["replicas"] == 1 and "pulumi.com/waitFor" in fixed["metadata"]["annotations"]
    fixed_ignores = [v for (typ, name), v in cap.ignore.items() if name.endswith("/decode-0")]
    assert fixed_ignores and all(v == [] for v in fixed_ignores)
    # the planner: a Role limited to get/patch on exactly those workloads, by name
    role = _named(objs, "Role", "ascend-pd-planner")
    scaled = [r for r in role["rules"] if r.get("resourceNames")]
    assert sorted(n for r in scaled for n in r["resourceNames"]) == sorted(w.name for w in flexible)
    assert all(r["verbs"] == ["get", "patch"] for r in scaled)
    others = [r for r in role["rules"] if not r.get("resourceNames")]
    assert others == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list"]}]
    dep = _named(objs, "Deployment", "ascend-pd-planner")
    command = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--plan-file" in command and "--dry-run" not in command
    cm = _named(objs, "ConfigMap", "ascend-pd-planner-plan")
    assert plan_from_json(cm["data"]["plan.json"]) == plan
    assert any(r.typ == "ascend-deepseek:deploy:PDPlanner" for r in result.resources)


def _templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "Deployment":
        return [obj["spec"]["template"]]
    t = obj["spec"]["leaderWorkerTemplate"]
    return [t["leaderTemplate"], t["workerTemplate"]]


def test_without_the_admin_token_the_planner_only_decides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(auto_kind(tmp_path)))
    result = run_stack("kind")
    assert result.error is None, result.error
    dep = [o for o in result.k8s_objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "ascend-pd-planner"]
    assert "--dry-run" in dep[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert json.loads(json.dumps(normalize(dep[0])))  # plain data
