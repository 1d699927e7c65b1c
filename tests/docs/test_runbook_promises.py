"""What the runbooks tell an operator to do is something the kit can do."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_replacing_a_node_never_suggests_taking_single_devices_out(tmp_path: Path) -> None:
    """replace-failed-node.md replaces the node whole, because the kit refuses a node with fewer devices
    than its hardware has (every instance spans whole nodes): the refusal is checked here too."""
    text = (ROOT / "docs/runbooks/replace-failed-node.md").read_text()
    assert "unusable" not in text and "replaced whole" in text
    stacks = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", stacks)
    inventory = stacks / "inventories" / "a2-staging.yaml"
    doc = yaml.safe_load(inventory.read_text())
    doc["nodes"][0]["devices"].pop()
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", "a2-staging", "--stacks-dir",
                           str(stacks)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "lists 7 devices" in done.stderr and "have 8" in done.stderr, done.stderr
