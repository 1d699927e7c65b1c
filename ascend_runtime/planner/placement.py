"""Deterministic placement of instances onto nodes and devices.

Rules: each device is used at most once; prefill and decode never share a
node; an instance uses ``nodes_per_instance`` nodes with ``devices_per_node``
free devices each (lowest device ids first); on super-pod hardware an instance
stays inside one super pod unless the stack allows otherwise. Nodes are taken
in inventory order, super pods in ascending id, prefill instances first, so
the same inputs always give the same placement.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ascend_runtime.config.errors import ConfigError, Problem
from ascend_runtime.config.inventory import Device, Inventory, Node
from ascend_runtime.config.stack import Role, StackConfig
from ascend_runtime.hardware import HardwareSpec
from ascend_runtime.planner.validation import ROLES, devices_per_node


@dataclass
class NodeState:
    """Mutable bookkeeping of one node during placement."""

    node: Node
    free: list[Device]
    role: str | None = None
    used: int = 0

    def fits(self, role: str, count: int) -> bool:
        """True if an instance of ``role`` can take ``count`` devices here."""
        return self.role in (None, role) and len(self.free) >= count

    def take(self, role: str, count: int) -> list[Device]:
        """Claim the ``count`` lowest free devices for ``role``."""
        taken, self.free = self.free[:count], self.free[count:]
        self.role = role
        self.used += count
        return taken


@dataclass
class Assignment:
    """Nodes and devices chosen for one instance, in rank order."""

    role: Role
    index: int
    nodes: list[Node] = field(default_factory=list)
    devices: list[list[Device]] = field(default_factory=list)


def _pick_nodes(candidates: list[NodeState], role: str, count: int, per_node: int) -> list[NodeState] | None:
    chosen = []
    for state in candidates:
        if state.fits(role, per_node):
            chosen.append(state)
            if len(chosen) == count:
                return chosen
    return None


def place_instances(config: StackConfig, inventory: Inventory, hardware: HardwareSpec) -> tuple[list[Assignment], list[NodeState]]:
    """Assign nodes and devices to every instance; raises ConfigError when they do not fit."""
    states = [NodeState(node, sorted(node.devices, key=lambda d: d.device_id)) for node in inventory.nodes]
    pods: dict[int | None, list[NodeState]] = defaultdict(list)
    for state in states:
        pods[state.node.super_pod_id if hardware.has_super_pods else None].append(state)
    pod_order = sorted(pods, key=lambda p: -1 if p is None else p)
    assignments: list[Assignment] = []
    for role in ROLES:
        stage = config.stage(role)
        per_node = devices_per_node(config, role, hardware)
        for index in range(stage.instances):
            chosen = None
            if hardware.has_super_pods and not config.allow_cross_super_pod:
                for pod in pod_order:
                    chosen = _pick_nodes(pods[pod], role, stage.nodes_per_instance, per_node)
                    if chosen:
                        break
            else:
                chosen = _pick_nodes(states, role, stage.nodes_per_instance, per_node)
            if chosen is None:
                raise ConfigError([_no_room(config, states, pods, hardware, role, index, per_node)])
            assignment = Assignment(role, index)
            for state in chosen:
                assignment.nodes.append(state.node)
                assignment.devices.append(state.take(role, per_node))
            assignments.append(assignment)
    return assignments, states


def _no_room(
    config: StackConfig,
    states: list[NodeState],
    pods: dict[int | None, list[NodeState]],
    hardware: HardwareSpec,
    role: Role,
    index: int,
    per_node: int,
) -> Problem:
    stage = config.stage(role)
    usable = [s for s in states if s.fits(role, per_node)]
    need = stage.nodes_per_instance
    if hardware.has_super_pods and not config.allow_cross_super_pod and len(usable) >= need:
        free_by_pod = {p: sum(1 for s in members if s.fits(role, per_node)) for p, members in pods.items()}
        return Problem(
            f"{role}.nodes_per_instance",
            f"instance {role}-{index} needs {need} nodes inside one super pod, but would span super pods "
            f"(usable nodes per super pod: {free_by_pod})",
            need,
            "add nodes to one super pod, use fewer nodes per instance, or set allow_cross_super_pod: true",
        )
    wanted = {r: config.stage(r).instances * config.stage(r).nodes_per_instance for r in ROLES}
    return Problem(
        f"{role}.instances",
        f"too few nodes: instance {role}-{index} needs {need} more nodes with {per_node} free devices "
        f"and {len(usable)} are left (prefill asks for {wanted['prefill']} node slots, decode for {wanted['decode']}, "
        f"the inventory has {len(states)} nodes; prefill and decode never share a node)",
        stage.instances,
        f"lower {role}.instances to {index} or add nodes to the inventory",
    )
