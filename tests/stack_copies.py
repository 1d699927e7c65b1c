"""Copies of the committed stacks directory with one stack file edited, for tests that run the CLI or the
Pulumi program on a stack the committed ones do not hold."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

STACKS = Path(__file__).resolve().parents[1] / "stacks"


def edited_stacks(tmp_path: Path, stack: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """``tmp_path/stacks``: the committed stacks with ``Pulumi.<stack>.yaml``'s ``config`` mapping passed through
    ``edit`` (which changes it in place) and written back as YAML."""
    stacks = copied_stacks(tmp_path)
    path = stacks / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text())
    edit(doc["config"])
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return stacks


def stacks_with_text(tmp_path: Path, stack: str, old: str, new: str) -> Path:
    """``tmp_path/stacks``: the committed stacks with the first ``old`` of ``Pulumi.<stack>.yaml`` replaced by
    ``new`` as text (for spellings a YAML dump would not write)."""
    stacks = copied_stacks(tmp_path)
    path = stacks / f"Pulumi.{stack}.yaml"
    text = path.read_text()
    if old not in text:
        raise ValueError(f"{old!r} is not in {path}")
    path.write_text(text.replace(old, new, 1))
    return stacks


def copied_stacks(tmp_path: Path) -> Path:
    """``tmp_path/stacks``: a copy of the committed stacks directory."""
    return Path(shutil.copytree(STACKS, tmp_path / "stacks"))
