"""What the runbooks tell an operator to do is something the kit can do."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _plan(stacks: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", "a2-staging", "--stacks-dir",
                           str(stacks)], capture_output=True, text=True, timeout=120)


def test_a_broken_npu_is_taken_out_of_service_as_the_runbook_says(tmp_path: Path) -> None:
    """replace-failed-node.md keeps every NPU listed and names the broken one in ``devices_out_of_service``: a
    node listing fewer devices is refused, the key is honoured, and the refusal it quotes is the planner's."""
    text = (ROOT / "docs/runbooks/replace-failed-node.md").read_text()
    assert "devices_out_of_service: [5]" in text and "refuses fewer" in text
    stacks = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", stacks)
    inventory = stacks / "inventories" / "a2-staging.yaml"
    original = yaml.safe_load(inventory.read_text())
    doc = yaml.safe_load(inventory.read_text())
    doc["nodes"][0]["devices"].pop()
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = _plan(stacks)
    assert done.returncode == 2 and "lists 7 devices" in done.stderr and "devices_out_of_service" in done.stderr, done.stderr
    original["nodes"][3]["devices_out_of_service"] = [5]
    inventory.write_text(yaml.safe_dump(original, sort_keys=False))
    done = _plan(stacks)
    quoted = ("inventory.nodes[3].devices_out_of_service: instance decode-0 needs nodes with 8 usable devices for "
              "decode, and these nodes would serve but for devices out of service: a2-node-04 (device 5 out of "
              "service; 7 of 8 in service")  # as the runbook quotes it, whitespace aside
    assert done.returncode == 2 and " ".join(quoted.split()) in " ".join(done.stderr.split()), done.stderr
    assert " ".join(quoted.split()) in " ".join(text.split())
