"""docs/kubernetes.md's object graph per stack is what tools/object_graph.py generates from build_system now,
and its "waits for" edges are the Pulumi program's own (ServingSystem under the mock runtime)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ascend_runtime.planner import load_plan

from .pulumi_mock import mock_system

ROOT = Path(__file__).resolve().parents[2]


def _tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("object_graph", ROOT / "tools" / "object_graph.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["object_graph"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


TOOL = _tool()


def test_the_doc_section_is_current() -> None:
    text = (ROOT / "docs" / "kubernetes.md").read_text()
    assert TOOL.rewrite(text, TOOL.section()) == text, "docs/kubernetes.md is stale: run python tools/object_graph.py"
    for stack in ("a2-staging", "cm384-prod", "kind"):
        assert f"#### {stack}\n" in text


def test_the_check_mode_notices_a_stale_doc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "kubernetes.md"
    doc.write_text(TOOL.rewrite((ROOT / "docs" / "kubernetes.md").read_text(), f"{TOOL.BEGIN}\nold\n{TOOL.END}"))
    monkeypatch.setattr(TOOL, "DOC", doc)
    assert TOOL.main(["--check"]) == 1
    assert TOOL.main([]) == 0 and TOOL.main(["--check"]) == 0


@pytest.mark.parametrize("stack", ["cm384-prod", "a2-staging"])
def test_the_graph_waits_for_what_the_program_depends_on(stack: str) -> None:
    system = mock_system(stack)
    label = {id(system.cluster): "ClusterPrep", id(system.proxy): "Proxy", id(system.network): "NetworkPolicies"}
    label |= {id(e): f"EngineInstance {n}" for n, e in system.engines.items()}
    if system.balancer is not None:
        label[id(system.balancer)] = "Balancer"
    nodes = {n.label: n for n in TOOL.graph(load_plan(stack))}
    program = {f"EngineInstance {n}": e for n, e in system.engines.items()}
    if system.checks is not None:
        program["PostDeployChecks"] = system.checks
    for name, component in program.items():
        assert [label[id(d)] for d in component.depends_on] == nodes[name].waits_for, name
    assert [n for n in nodes if n.startswith("EngineInstance ")] == list(program)[:len(system.engines)]
