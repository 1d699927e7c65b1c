"""The two stack keys the playbooks need: hardware kind and inventory file.

Kept in one small function so it can switch to
``ascend_runtime.config.stack.load_stack`` once that lands.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.config.inventory import Inventory

PROJECT = "ascend-deepseek"
HARDWARE_KINDS = ("atlas-800i-a2", "cm384")


@dataclass(frozen=True)
class StackRef:
    """What a playbook run needs from a stack."""

    name: str
    hardware: str
    inventory_path: Path


def default_stacks_dir() -> Path:
    """``$ASCEND_STACKS_DIR``, else ``./stacks``."""
    return Path(os.environ.get("ASCEND_STACKS_DIR", "stacks"))


def read_stack(name: str, stacks_dir: Path | None = None) -> StackRef:
    """Read ``ascend-deepseek:hardware`` and ``ascend-deepseek:inventory`` from ``Pulumi.<name>.yaml``."""
    d = Path(stacks_dir) if stacks_dir else default_stacks_dir()
    path = d / f"Pulumi.{name}.yaml"
    if not path.is_file():
        raise ConfigError.single("--stack", "no such stack file", str(path))
    try:
        config = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("config") or {}
    except yaml.YAMLError as exc:
        raise ConfigError.single("--stack", f"invalid YAML: {exc}", source=str(path)) from None
    hardware = config.get(f"{PROJECT}:hardware")
    if hardware not in HARDWARE_KINDS:
        raise ConfigError.single(f"config.{PROJECT}:hardware", "unknown hardware kind", hardware,
                                 hint=f"one of {', '.join(HARDWARE_KINDS)}", source=str(path))
    inventory = config.get(f"{PROJECT}:inventory")
    if not isinstance(inventory, str) or not inventory:
        raise ConfigError.single(f"config.{PROJECT}:inventory", "missing inventory file name", inventory,
                                 source=str(path))
    return StackRef(name=name, hardware=hardware, inventory_path=d / inventory)


def load_inventory(path: Path) -> Inventory:
    """Load and validate an inventory file; ConfigError names the bad field."""
    from pydantic import ValidationError

    from ascend_runtime.config.errors import Problem

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise ConfigError.single("inventory", f"cannot read: {exc}", source=str(path)) from None
    except yaml.YAMLError as exc:
        raise ConfigError.single("inventory", f"invalid YAML: {exc}", source=str(path)) from None
    try:
        return Inventory.model_validate(data)
    except ValidationError as exc:
        problems = [Problem(".".join(str(p) for p in e["loc"]), e["msg"], e.get("input")) for e in exc.errors()]
        raise ConfigError(problems, str(path)) from None
