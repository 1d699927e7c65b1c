"""Merge facts collected by the facts playbook into the inventory, and write it byte-stably.

Only hosts whose every step succeeded are updated; the others keep their
entries as they were. The file is written with the model's field order, no
``null`` values and a fixed header, through a temp file and a rename, and only
when its bytes would change, so a re-run on unchanged hosts changes nothing.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from ascend_runtime.config.inventory import Device, Inventory, Node, NodeVersions
from ascend_runtime.hosts.engine import DEVICES_PER_NODE, RunReport, _get
from ascend_runtime.hosts.playbook import FactsSpec

HEADER = (
    "# Host inventory. Device, NIC and version facts are written by\n"
    "# `ascend-deploy playbook run facts`; review changes with git diff.\n"
)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def merge_node(node: Node, facts: dict[str, Any], spec: FactsSpec, hardware: str) -> tuple[Node, list[str]]:
    """The node updated from its facts, and problems that kept fields from being set."""
    problems: list[str] = []
    update: dict[str, Any] = {}
    if spec.addresses:
        addresses = _get(facts, f"{spec.addresses}.addresses") or {}
        nic = addresses.get(str(node.host_ip))
        if nic:
            update["nic"] = nic
        else:
            problems.append(f"host_ip {node.host_ip} is on no interface (found {', '.join(sorted(addresses)) or 'none'})")
    if spec.versions:
        update["versions"] = NodeVersions(**{k: _get(facts, ref) for k, ref in spec.versions.items()})
    if spec.device:
        devices: list[Device] = []
        for dev_id in range(DEVICES_PER_NODE[hardware]):
            dfacts = facts.get("devices", {}).get(dev_id, {})
            values = {k: _get(dfacts, ref) for k, ref in spec.device.items()}
            if not values.get("device_ip"):
                problems.append(f"device {dev_id}: no device IP")
                continue
            for k in ("super_device_id", "super_pod_id"):
                if k in values:
                    values[k] = _int_or_none(values[k])
            devices.append(Device(device_id=dev_id, **{k: v for k, v in values.items() if v not in (None, "")}))
        update["devices"] = devices
    if problems:
        return node, problems
    return node.model_copy(update=update), []


def apply_facts(inventory: Inventory, report: RunReport, spec: FactsSpec, hardware: str) -> tuple[Inventory, dict[str, list[str]]]:
    """A new inventory with the facts of every host that passed; problems per host otherwise."""
    failed = set(report.failed_hosts())
    problems: dict[str, list[str]] = {}
    nodes = []
    for node in inventory.nodes:
        facts = report.facts.get(node.name)
        if node.name in failed or facts is None:
            if facts is not None or node.name in failed:
                problems[node.name] = ["not updated: the host has failed steps"]
            nodes.append(node)
            continue
        new, issues = merge_node(node, facts, spec, hardware)
        if issues:
            problems[node.name] = issues
        nodes.append(new)
    return inventory.model_copy(update={"nodes": nodes}), problems


def dump_inventory(inventory: Inventory) -> str:
    """The inventory as reviewable YAML: model field order, no nulls, block style."""
    data = inventory.model_dump(mode="json", exclude_none=True)
    return HEADER + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120, allow_unicode=True)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` atomically (temp file + rename) unless the file already holds it; True if written."""
    path = Path(path)
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except FileNotFoundError:
        pass
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True
