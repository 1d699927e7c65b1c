"""Merge facts collected by the facts playbook into the inventory, and write it byte-stably.

What is updated, per host:

- every step passed: the whole entry (NIC, versions, devices);
- only device-scoped failures (a device whose read failed, timed out, or gave
  an impossible value such as ``ipaddr:999.1.1.1``): the NIC, the versions and
  every other device; each failed device keeps the entry it had (none if it
  had none), so a bad reading is never written and a good one is not lost;
- any host-level failure (unreachable, host key refused, a host step such as
  the addresses or a version file failed): nothing, the entry stays as it was;
- a reading the inventory model refuses although its step passed (a VNIC
  reading the RoCE port's address, a device with no address): nothing either,
  since such a contradiction puts the host's other readings in doubt too. It
  is reported per host and device, never raised.

The file is written with the model's field order, no ``null`` values
and a fixed header, through a temp file and a rename, and only when its bytes
would change, so a re-run on unchanged hosts changes nothing.

Device addresses: ``device_ip`` / ``netmask`` come from ``hccn_tool -i N -ip -g``
(the RoCE port) on A2 and A3; ``vnic_ip`` from ``-vnic -g`` on A3 only (a
different address, used only by the LLMDataDist PD rank table). A ``vnic_ip``
is never kept on hardware without a VNIC, and a host whose VNIC reads the same
address as its RoCE port is reported, not written.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ascend_runtime.config.inventory import (
    VNIC_HARDWARE,
    Device,
    Inventory,
    Node,
    NodeVersions,
)
from ascend_runtime.hosts.engine import DEVICES_PER_NODE, RunReport, _get

#: The problem recorded for a host left as it was because a host-level step failed.
HOST_NOT_UPDATED = "not updated: the host has failed steps"
from ascend_runtime.files.read import INVENTORY, FileRefused, read_text
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


def _messages(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors())


def merge_node(node: Node, facts: dict[str, Any], spec: FactsSpec, hardware: str,
               failed_devices: frozenset[int] | set[int] = frozenset()) -> tuple[Node, list[str]]:
    """The node updated from its facts, and problems that kept fields from being set.

    A device in ``failed_devices`` (its step failed) keeps its old entry and
    the other devices are updated. Any other problem (NIC, versions, a device
    value the model refuses) leaves the whole node as it was.
    """
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
        try:
            update["versions"] = NodeVersions(**{k: _get(facts, ref) for k, ref in spec.versions.items()})
        except ValidationError as exc:
            problems.append(f"versions: {_messages(exc)}")
    if problems:
        return node, problems
    if spec.device:
        old = {d.device_id: d for d in node.devices}
        devices: list[Device] = []
        for dev_id in range(DEVICES_PER_NODE[hardware]):
            if dev_id in failed_devices:
                if dev_id in old:
                    devices.append(old[dev_id])
                continue
            dfacts = facts.get("devices", {}).get(dev_id, {})
            values = {k: _get(dfacts, ref) for k, ref in spec.device.items()}
            if not values.get("device_ip"):
                problems.append(f"device {dev_id}: no device IP")
                continue
            if hardware not in VNIC_HARDWARE:
                values.pop("vnic_ip", None)  # A2 has no VNIC: its one address is the RoCE port's
            for k in ("super_device_id", "super_pod_id"):
                if k in values:
                    values[k] = _int_or_none(values[k])
            try:
                devices.append(Device(device_id=dev_id, **{k: v for k, v in values.items() if v not in (None, "")}))
            except (ValidationError, TypeError, ValueError) as exc:
                problems.append(f"device {dev_id}: " + (_messages(exc) if isinstance(exc, ValidationError) else str(exc)))
        update["devices"] = devices
    if problems:
        return node, problems + ["not updated: fix the values above on the host (or the inventory) and re-run facts"]
    return node.model_copy(update=update), []


def failed_devices(report: RunReport, host: str) -> set[int] | None:
    """Device ids whose steps failed on ``host``; None when a host-level step failed (or the host did not run)."""
    failed: set[int] = set()
    for r in report.results:
        if r.host == host and r.status == "fail":
            if not r.failed_devices:
                return None
            failed.update(r.failed_devices)
    return failed


def apply_facts(inventory: Inventory, report: RunReport, spec: FactsSpec,
                hardware: str) -> tuple[Inventory, dict[str, list[str]]]:
    """A new inventory with the facts of every host that ran (see the module docstring); problems per host."""
    problems: dict[str, list[str]] = {}
    nodes = []
    for node in inventory.nodes:
        facts = report.facts.get(node.name)
        bad = failed_devices(report, node.name)
        if facts is None or bad is None:
            if facts is not None or node.name in report.failed_hosts():
                problems[node.name] = [HOST_NOT_UPDATED]
            nodes.append(node)
            continue
        new, issues = merge_node(node, facts, spec, hardware, bad)
        if issues:
            problems[node.name] = issues
        nodes.append(new)
    return inventory.model_copy(update={"nodes": nodes}), problems


def leading_comments(text: str) -> str:
    """The comment lines (``#``) at the top of a YAML file, with their newlines; "" when it starts otherwise."""
    out = []
    for line in text.splitlines(keepends=True):
        if not line.startswith("#"):
            break
        out.append(line if line.endswith("\n") else line + "\n")
    return "".join(out)


def dump_inventory(inventory: Inventory, previous: str | None = None) -> str:
    """The inventory as reviewable YAML: model field order, no nulls, no empty ``devices_out_of_service``, block style.

    previous: the file's current text; its leading comment block (an address plan, say) is kept, so a facts
    run on hosts that match changes no byte of a file in this format. Without one, :data:`HEADER`.
    """
    data = inventory.model_dump(mode="json", exclude_none=True)
    for node in data.get("nodes") or []:  # written only where a device is out of service (as a person writes it)
        if not node.get("devices_out_of_service"):
            node.pop("devices_out_of_service", None)
    header = leading_comments(previous) if previous else ""
    return (header or HEADER) + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=120,
                                               allow_unicode=True)


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` atomically (temp file + rename) unless the file already holds it; True if written."""
    path = Path(path)
    try:
        if read_text(path, INVENTORY) == text:
            return False
    except FileRefused as exc:
        if not exc.missing:  # a FIFO, a device or a directory where the inventory goes: never written over
            raise
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
