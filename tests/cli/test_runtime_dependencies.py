"""Everything the installed package imports at run time is a declared runtime dependency.

A module provided only by the test extras (jsonschema once was) makes a documented command crash with
ModuleNotFoundError after the README's install; this scans every import of ascend_runtime/ with ast.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: import name -> distribution name, where they differ
DISTRIBUTIONS = {"pydantic_core": "pydantic",  # pydantic pins its own core
                 "yaml": "pyyaml", "pulumi_kubernetes": "pulumi-kubernetes", "prometheus_client": "prometheus-client"}


def _declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~;\[ ]", dep, maxsplit=1)[0].strip().lower() for dep in project["dependencies"]}


#: Files the real engine's own interpreter runs (its virtual environment, ascend_runtime/local/vllm_engine/
#: engine.lock), never the kit's: their imports are checked against that lock instead.
ENGINE_SIDE = ("ascend_runtime/local/vllm_engine/make_model.py", "ascend_runtime/local/vllm_engine/shim/sitecustomize.py")


def _imported(engine_side: bool = False) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in (ROOT / "ascend_runtime").rglob("*.py"):
        if (str(path.relative_to(ROOT)) in ENGINE_SIDE) != engine_side:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top != "ascend_runtime" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_runtime_import_is_a_declared_dependency() -> None:
    declared = _declared()
    missing = {mod: where for mod, where in _imported().items()
               if DISTRIBUTIONS.get(mod, mod).lower().replace("_", "-") not in {d.replace("_", "-") for d in declared}}
    assert not missing, f"imported at run time but not in [project.dependencies]: {missing}"


def test_the_scan_sees_known_imports() -> None:
    imported = _imported()
    assert {"jsonschema", "pydantic", "aiohttp", "yaml"} <= set(imported)


def test_the_engine_side_scripts_import_only_what_the_engine_lock_installs() -> None:
    lock = ROOT / "ascend_runtime" / "local" / "vllm_engine" / "engine.lock"
    pins = {line.split("==")[0].strip().lower().replace("_", "-") for line in lock.read_text().splitlines()
            if line and not line.startswith("#")}
    imported = _imported(engine_side=True)
    assert {"safetensors", "tokenizers", "numpy"} <= set(imported), imported
    missing = {mod: where for mod, where in imported.items() if mod.replace("_", "-") not in pins}
    assert not missing, f"the engine's scripts import what its lock does not install: {missing}"
