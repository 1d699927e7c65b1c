"""The package's layers import downwards only, read from the source with ``ast``.

``render`` builds text and Kubernetes objects as data and never imports the
Pulumi layer (``deploy``) or the CLI; the simulator's flag mapping lives in the
model layer (``perf.sim_flags``), so nothing below the CLI imports ``cli``. The
model layer (the performance and timing model, the planner, the renderer, the
stack configuration, the hardware catalogue) imports no runtime package: the
simulator, the proxy, the P:D planner and the local launcher are its users. And
no two modules import each other, directly or through a chain (lazy imports
inside functions count).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ascend_runtime"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: str) -> set[str]:
    """Every ``ascend_runtime`` module ``path`` imports, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m.startswith("ascend_runtime")}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {m for m in _imports(path, package) if m in paths and m != name}
    return graph


GRAPH = _graph()


def _in(layer: str, module: str) -> bool:
    return module == layer or module.startswith(layer + ".")


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("ascend_runtime.render", "ascend_runtime.deploy"),
        ("ascend_runtime.render", "ascend_runtime.cli"),
        ("ascend_runtime.sim", "ascend_runtime.cli"),
        ("ascend_runtime.checks", "ascend_runtime.cli"),
        ("ascend_runtime.planner", "ascend_runtime.render"),
        ("ascend_runtime.planner", "ascend_runtime.deploy"),
        ("ascend_runtime.config", "ascend_runtime.render"),
        ("ascend_runtime.proxy", "ascend_runtime.cli"),
    ],
)
def test_layer_does_not_import_upwards(layer: str, forbidden: str) -> None:
    offenders = sorted(
        f"{mod} -> {dep}" for mod, deps in GRAPH.items() if _in(layer, mod) for dep in deps if _in(forbidden, dep)
    )
    assert not offenders, f"{layer} must not import {forbidden}: {offenders}"


#: The model layer: what a Plan, a render and a performance figure are computed with.
MODEL_LAYER = (
    "ascend_runtime.perf",
    "ascend_runtime.planner",
    "ascend_runtime.render",
    "ascend_runtime.config",
    "ascend_runtime.engine",
    "ascend_runtime.hardware",
)
#: Runtime packages: processes and daemons that use the model layer. ``faults`` is not listed: the fault
#: watcher's objects (``render/objects/faults.py``) take its signal names and topology format from it.
RUNTIME = (
    "ascend_runtime.sim",
    "ascend_runtime.pdplanner",
    "ascend_runtime.proxy",
    "ascend_runtime.local",
    "ascend_runtime.balancer",
    "ascend_runtime.rollout",
    "ascend_runtime.checks",
    "ascend_runtime.hosts",
)


@pytest.mark.parametrize("layer", MODEL_LAYER)
def test_model_layer_imports_no_runtime_package(layer: str) -> None:
    offenders = sorted(
        f"{mod} -> {dep}" for mod, deps in GRAPH.items() if _in(layer, mod)
        for dep in deps if any(_in(runtime, dep) for runtime in RUNTIME)
    )
    assert not offenders, f"{layer} is the model layer and must not import a runtime package: {offenders}"


def test_deploy_holds_only_the_pulumi_layer() -> None:
    modules = sorted(m for m in GRAPH if _in("ascend_runtime.deploy", m))
    assert modules == ["ascend_runtime.deploy", "ascend_runtime.deploy.components", "ascend_runtime.deploy.image",
                       "ascend_runtime.deploy.node_labels", "ascend_runtime.deploy.program"]


def _cycle_from(start: str) -> list[str] | None:
    """A shortest import chain from ``start`` back to itself, or None (breadth-first over GRAPH)."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for mod in frontier:
            for dep in sorted(GRAPH[mod]):
                if dep == start:
                    chain = [mod]
                    while chain[-1] != start:
                        chain.append(parents[chain[-1]])
                    return [start, *reversed(chain[:-1]), start]
                if dep not in parents and dep != start:
                    parents[dep] = mod
                    nxt.append(dep)
        frontier = nxt
    return None


def _is_package_reexport(chain: list[str]) -> bool:
    """A package ``__init__`` re-exporting its own submodules is not a circle between modules."""
    return all(_in(chain[0], m) or _in(m, chain[0]) for m in chain)


def test_checks_modules_do_not_import_each_other_in_a_circle() -> None:
    for mod in sorted(m for m in GRAPH if _in("ascend_runtime.checks", m)):
        chain = _cycle_from(mod)
        assert chain is None or _is_package_reexport(chain), " -> ".join(chain or [])


def test_graph_is_read() -> None:
    """The import reader sees real edges (so the tests above can fail)."""
    assert "ascend_runtime.render.objects" in GRAPH["ascend_runtime.render.manifests"]
    assert "ascend_runtime.checks.items" in GRAPH["ascend_runtime.checks.plan_files"]
