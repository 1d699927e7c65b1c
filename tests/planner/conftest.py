"""Fixtures that copy a committed stack into a temp stacks dir and let a test break it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

STACKS = Path(__file__).resolve().parents[2] / "stacks"


@pytest.fixture
def stack_copy(tmp_path: Path) -> Callable[..., Path]:
    """``stack_copy(name, edit_config=fn, edit_inventory=fn)`` -> a stacks dir holding an edited copy."""

    def make(
        name: str,
        edit_config: Callable[[dict[str, Any]], None] | None = None,
        edit_inventory: Callable[[dict[str, Any]], None] | None = None,
    ) -> Path:
        target = tmp_path / "stacks"
        shutil.copytree(STACKS, target, dirs_exist_ok=True)
        stack_file = target / f"Pulumi.{name}.yaml"
        doc = yaml.safe_load(stack_file.read_text())
        if edit_config:
            edit_config(doc["config"])
        stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        inv_file = target / doc["config"]["ascend-deepseek:inventory"]
        inv = yaml.safe_load(inv_file.read_text())
        if edit_inventory:
            edit_inventory(inv)
        inv_file.write_text(yaml.safe_dump(inv, sort_keys=False))
        return target

    return make
