"""What a playbook run needs from a stack: hardware kind, inventory file, staged-model variables.

Read with the same loader as the planner and the Pulumi program
(:func:`ascend_runtime.config.loader.load_stack`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.config.inventory import Inventory
from ascend_runtime.config.loader import load_stack, read_inventory


@dataclass(frozen=True)
class StackRef:
    """The stack facts a playbook run uses; ``variables`` seed the playbook's variables."""

    name: str
    hardware: str
    inventory_path: Path
    variables: dict[str, Any] = field(default_factory=dict)


def read_stack(name: str, stacks_dir: Path | None = None) -> StackRef:
    """Load ``Pulumi.<name>.yaml``; ConfigError names any invalid key (``vnic_ip`` on A2 included)."""
    stack = load_stack(name, stacks_dir)
    problems = stack.inventory.hardware_problems(stack.config.hardware)
    if problems:
        raise ConfigError(problems, stack.inventory_file)
    staging = stack.config.model_staging
    variables = {"model_dir": staging.dir, "model_files": dict(staging.files)} if staging else {}
    return StackRef(name=name, hardware=stack.config.hardware, inventory_path=Path(stack.inventory_file), variables=variables)


def load_inventory(path: Path, hardware: str | None = None) -> Inventory:
    """Load and validate an inventory file; ConfigError names the bad field.

    With ``hardware``, facts that contradict it (``vnic_ip`` on Atlas A2) are refused too.
    """
    inventory = read_inventory(path)
    problems = inventory.hardware_problems(hardware) if hardware else []
    if problems:
        raise ConfigError(problems, str(path))
    return inventory
