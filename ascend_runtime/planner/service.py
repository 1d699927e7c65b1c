"""Devices out of service: which NPUs of a node the planner may place on, and the refusal when too few are left.

An inventory node lists every NPU its hardware has (``check_inventory`` refuses fewer) and names the broken
ones in ``devices_out_of_service`` (logical device ids, ``config/inventory.py``). What a node then offers:

* target ``local`` (simulated NPUs): every listed device not out of service. A stage whose
  ``devices_per_node`` fits in what is left is placed there, lowest device ids first, skipping the ones out
  of service; a stage that needs more (the default shape takes all 8 or 16) skips the node;
* targets ``kubernetes`` and ``kind``: nothing. On a cluster the device plugin, not the Plan, picks the NPUs a
  pod gets (docs/kubernetes.md, "Engine instances"), and the fault watcher judges whole nodes: an NPU the
  plugin reports unhealthy drains every instance on its node (docs/faults.md). A node with an NPU out of
  service therefore hosts no instance there, and is no spare either.

When the stages then need more nodes than are left, :func:`out_of_service_problem` names the node whose
devices are out of service, so the refusal says what to change (docs/runbooks/replace-failed-node.md).
"""

from __future__ import annotations

from collections.abc import Sequence

from ascend_runtime.config.errors import Problem
from ascend_runtime.config.inventory import Device, Node

#: The target on which a node with devices out of service still hosts instances on the rest.
PARTIAL_NODE_TARGET = "local"


def usable_devices(node: Node, target: str) -> list[Device]:
    """The devices of ``node`` the planner may place on, by device id (see the module docstring)."""
    if node.devices_out_of_service and target != PARTIAL_NODE_TARGET:
        return []
    return sorted(node.in_service, key=lambda d: d.device_id)


def why_unusable(target: str) -> str:
    """Why a node with devices out of service offers what :func:`usable_devices` says, for messages."""
    if target == PARTIAL_NODE_TARGET:
        return "an instance takes devices_per_node in-service devices on each of its nodes"
    return (f"on the {target} target a node with a device out of service hosts no instance (the device plugin picks "
            "a pod's NPUs, and the fault watcher drains whole nodes)")


def out_of_service_problem(nodes: Sequence[tuple[int, Node, int]], role: str, instance: str, per_node: int,
                           target: str) -> Problem | None:
    """The refusal when ``instance`` finds too few nodes and devices out of service are why.

    ``nodes``: (inventory index, node, devices it still offers) of the nodes that could host ``role`` were
    their devices back in service; empty: out of service is not why, and None is returned.
    """
    if not nodes:
        return None
    index, first, _ = nodes[0]
    listed = ", ".join(
        f"{n.name} (device {', '.join(map(str, sorted(n.devices_out_of_service)))} out of service; "
        f"{len(n.in_service)} of {len(n.devices)} in service, {free} free for the Plan)" for _, n, free in nodes)
    return Problem(
        f"inventory.nodes[{index}].devices_out_of_service",
        f"instance {instance} needs nodes with {per_node} usable devices for {role}, and these nodes would serve but "
        f"for devices out of service: {listed}; {why_unusable(target)}",
        sorted(first.devices_out_of_service),
        "add a node in its place (docs/runbooks/replace-failed-node.md), or repair the device and remove it from "
        f"devices_out_of_service, or plan fewer {role} instances",
    )
