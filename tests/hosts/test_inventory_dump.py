"""The facts playbook's inventory writer: a shipped inventory whose hosts match is written back byte for
byte (its leading comments, such as an address plan, kept), and a change keeps those comments too."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ascend_runtime.config.inventory import Inventory
from ascend_runtime.hosts.facts import HEADER, dump_inventory, leading_comments

INVENTORIES = sorted((Path(__file__).resolve().parents[2] / "stacks" / "inventories").glob("*.yaml"))


@pytest.mark.parametrize("path", INVENTORIES, ids=[p.name for p in INVENTORIES])
def test_a_shipped_inventory_round_trips_byte_for_byte(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert leading_comments(text), f"{path.name} has no leading comment block"
    assert dump_inventory(Inventory.model_validate(yaml.safe_load(text)), text) == text


def test_a_change_keeps_the_leading_comments() -> None:
    path = next(p for p in INVENTORIES if p.name == "cm384-prod.yaml")
    text = path.read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    doc["nodes"][0]["devices"][0]["device_ip"] = "198.51.100.250"
    out = dump_inventory(Inventory.model_validate(doc), text)
    assert out != text and out.startswith(leading_comments(text)) and "198.51.100.250" in out
    # a file without a comment block (or a new one) gets the kit's header
    assert dump_inventory(Inventory.model_validate(doc), "ssh: {}\n").startswith(HEADER)
    assert dump_inventory(Inventory.model_validate(doc)).startswith(HEADER)
