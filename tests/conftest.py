"""Fixtures: Plans of the committed stacks, and of edited copies in a temp stacks dir."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from ascend_runtime.planner import Plan, load_plan

STACKS = Path(__file__).resolve().parents[1] / "stacks"
NS = "ascend-deepseek:"
STACK_NAMES = ("a2-staging", "cm384-prod", "kind", "local")


@pytest.fixture(scope="session")
def plans() -> dict[str, Plan]:
    """Plans of the committed stacks by name."""
    return {name: load_plan(name) for name in STACK_NAMES}


@pytest.fixture
def edited_plan(tmp_path: Path) -> Callable[..., Plan]:
    """``edited_plan(stack, edit)``: load the Plan of a copy of ``stack`` after ``edit(cfg)``.

    ``cfg`` is the stack's project config with the namespace stripped; the call raises what
    ``load_plan`` raises (ConfigError for a refused stack).
    """
    counter = iter(range(1_000_000))

    def make(name: str, edit: Callable[[dict[str, Any]], None]) -> Plan:
        target = tmp_path / f"stacks{next(counter)}"
        shutil.copytree(STACKS, target)
        stack_file = target / f"Pulumi.{name}.yaml"
        doc = yaml.safe_load(stack_file.read_text())
        cfg = {k[len(NS):]: v for k, v in doc["config"].items() if k.startswith(NS)}
        edit(cfg)
        others = {k: v for k, v in doc["config"].items() if not k.startswith(NS)}
        doc["config"] = {**others, **{NS + k: v for k, v in cfg.items()}}
        stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        return load_plan(name, target)

    return make


@pytest.fixture
def with_stage_setting() -> Callable[[Plan, str, str, Any], Plan]:
    """``with_stage_setting(plan, role, key, value)``: ``plan`` with ``config[role][key] = value`` set after
    validation: a Plan carrying a setting the stack rules refuse, to test the render-time conformance check
    that stands behind them."""
    import copy
    import dataclasses

    def make(plan: Plan, role: str, key: str, value: Any) -> Plan:
        config = copy.deepcopy(plan.config)
        config[role][key] = value
        return dataclasses.replace(plan, config=config)

    return make
