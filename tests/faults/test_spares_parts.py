"""The parts of recovery onto spares one by one: the patch between two renderings, the stack as data, the
local stack's node source, the decision's refusals and the CLI's input errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_runtime.cli import main
from ascend_runtime.config.loader import load_stack
from ascend_runtime.faults.local_nodes import LocalNodes
from ascend_runtime.faults.spares import decide
from ascend_runtime.faults.stack_data import stack_document, stack_from_document
from ascend_runtime.local.state import ProcessRecord, StackState
from ascend_runtime.planner import build_plan, load_plan
from ascend_runtime.planner.spares import NoSpare
from ascend_runtime.rollout.jsonpatch import diff
from tests.rollout.fake_kube_workloads import apply_json_patch

from .conftest import TOPOLOGY


def test_the_patch_turns_one_rendering_into_the_other_and_tests_named_items() -> None:
    old = {"metadata": {"annotations": {"a/b": "1", "gone": "x"}},
           "spec": {"containers": [{"name": "engine", "env": [{"name": "HCCL_IF_IP", "value": "10.0.0.1"}]}],
                    "nodeSelector": {"kubernetes.io/hostname": "n1"}, "list": [1, 2]}}
    new = {"metadata": {"annotations": {"a/b": "2", "new": "y"}},
           "spec": {"containers": [{"name": "engine", "env": [{"name": "HCCL_IF_IP", "value": "10.0.0.9"}]}],
                    "nodeSelector": {"kubernetes.io/hostname": "n9"}, "list": [1, 2, 3]}}
    ops = diff(old, new)
    assert apply_json_patch(old, ops) == new
    assert {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"} in ops
    assert {"op": "remove", "path": "/metadata/annotations/gone"} in ops
    assert {"op": "replace", "path": "/spec/list", "value": [1, 2, 3]} in ops  # another length: whole
    tests = [op for op in ops if op["op"] == "test"]
    assert tests == [{"op": "test", "path": "/spec/containers/0/name", "value": "engine"},
                     {"op": "test", "path": "/spec/containers/0/env/0/name", "value": "HCCL_IF_IP"}]
    assert diff(old, json.loads(json.dumps(old))) == []


@pytest.mark.parametrize("stack", ["cm384-prod", "local"])
def test_the_stack_as_data_gives_the_same_plan(stack: str) -> None:
    plan = load_plan(stack)
    doc = json.loads(json.dumps(stack_document(plan)))
    assert build_plan(stack_from_document(doc, "stack.json")).to_json() == plan.to_json()
    with pytest.raises(ValueError, match=r"StackConfig\.decode\.dp"):
        stack_from_document({**doc, "config": {**doc["config"], "decode": {**doc["config"]["decode"], "dp": "x"}}},
                            "stack.json")
    with pytest.raises(ValueError, match="stack: missing"):
        stack_from_document({"config": {}}, "stack.json")


def test_a_local_node_is_down_while_a_process_on_its_address_is_dead(tmp_path: Path) -> None:
    plan = load_plan("local")
    leader = plan.instance("decode-0")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    state = StackState("local", plan.proxy_url, [
        ProcessRecord("decode-0", "simulator", dead.pid, [], f"{leader.api_url}/health", ""),
        ProcessRecord("proxy", "proxy", os.getpid(), [], f"{plan.proxy_url}/health", ""),
    ])
    state.save(tmp_path)
    nodes = LocalNodes(plan, tmp_path)

    def ready(name: str) -> str:
        import asyncio  # noqa: PLC0415

        node = asyncio.run(nodes.get_node(name))
        assert node is not None
        return node["status"]["conditions"][0]["status"]

    assert ready(leader.nodes[0]) == "False" and ready(leader.nodes[1]) == "True"
    assert ready(plan.instance("prefill-0").nodes[0]) == "True"


def test_without_a_spare_nothing_moves() -> None:
    stack = load_stack("cm384-prod")  # every node of the inventory serves
    plan = build_plan(stack)
    with pytest.raises(NoSpare) as info:
        decide(stack, plan, [], ["cm384-sp0-node10"])
    assert info.value.problem.path.endswith(".devices_out_of_service")
    assert "keep a spare node in super pod 0" in info.value.problem.hint


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "stack: missing"),
    ('{"stack": "x", "config": {"hardware": "cm384"}, "inventory": {"nodes": []}}', "StackConfig."),
])
def test_a_bad_stack_data_file_exits_2_naming_it(content: str, message: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "topology.json").write_text(json.dumps(TOPOLOGY.to_dict()))
    (tmp_path / "stack.json").write_text(content)
    monkeypatch.setenv("ASCEND_PROXY_TOKEN", "t")
    code = main(["faults", "watch", "--topology", str(tmp_path / "topology.json"), "--stack-data",
                 str(tmp_path / "stack.json"), "--proxy", "http://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 2 and "--stack-data" in err and message in err and "Traceback" not in err
