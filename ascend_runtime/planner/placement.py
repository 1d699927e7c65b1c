"""Deterministic placement of instances onto nodes and devices.

Rules: each device is used at most once; prefill and decode never share a
node; an instance uses ``nodes_per_instance`` nodes with ``devices_per_node``
free devices each (lowest device ids first; devices out of service are never
free, and on a cluster their node offers none: ``planner/service.py``); on super-pod hardware an instance
stays inside one super pod unless the stack allows otherwise. Nodes are taken
in inventory order, super pods in ascending id, prefill instances first, so
the same inputs always give the same placement.

Device addresses (facts section 3): a placed device keeps both of its
addresses, the RoCE port IP (``device_ip``, every HCCL table) and on A3 the
VNIC IP (``vnic_ip``, the LLMDataDist PD table only). Placement refuses an
inventory whose devices carry ``vnic_ip`` on Atlas A2, and, when the
LLMDataDist connector renders the PD table on A3, placed devices without a
``vnic_ip`` (its ``device_ip`` is the RoCE port and must not stand in for it).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ascend_runtime.config.errors import ConfigError, Problem
from ascend_runtime.config.inventory import Device, Inventory, Node
from ascend_runtime.config.stack import Role, StackConfig
from ascend_runtime.hardware import HardwareSpec
from ascend_runtime.planner.service import out_of_service_problem, usable_devices
from ascend_runtime.planner.validation import ROLES, devices_per_node
from ascend_runtime.planner.versions import connector_dialect


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
    """Assign nodes and devices to every instance; raises ConfigError when they do not fit
    or the placed devices lack the addresses the rank tables need."""
    address_problems = inventory.hardware_problems(hardware.kind)
    if address_problems:
        raise ConfigError(address_problems)
    states = [NodeState(node, usable_devices(node, config.target)) for node in inventory.nodes]
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
    missing = _missing_vnic_ips(config, inventory, hardware, assignments)
    if missing:
        raise ConfigError(missing)
    return assignments, states


def _missing_vnic_ips(
    config: StackConfig, inventory: Inventory, hardware: HardwareSpec, assignments: list[Assignment]
) -> list[Problem]:
    """A3 + LLMDataDist: every placed device needs ``vnic_ip`` for the PD rank table (gen_ranktable.py reads
    ``hccn_tool -vnic -g`` on A3, vllm-ascend v0.11.0 examples/disaggregated_prefill_v1/gen_ranktable.py)."""
    if not hardware.has_super_pods:
        return []
    if connector_dialect(config.engine.vllm_ascend_version, config.engine.kv_connector) != "llmdatadist":
        return []
    where = {id(d): (i, j) for i, n in enumerate(inventory.nodes) for j, d in enumerate(n.devices)}
    problems = []
    for assignment in assignments:
        for node, devices in zip(assignment.nodes, assignment.devices):
            lacking = [d for d in devices if d.vnic_ip is None]
            if not lacking:
                continue
            i, j = where[id(lacking[0])]
            problems.append(
                Problem(
                    f"inventory.nodes[{i}].devices[{j}].vnic_ip",
                    f"the LLMDataDist PD rank table on {hardware.display_name} lists each device's VNIC IP "
                    f"(hccn_tool -i N -vnic -g), never its RoCE device_ip; node {node.name} has no vnic_ip for "
                    f"devices {', '.join(str(d.device_id) for d in lacking)}",
                    hint="run the facts playbook, which reads -vnic -g into vnic_ip",
                )
            )
    return problems


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
    out = out_of_service_problem(
        [(i, s.node, len(s.free)) for i, s in enumerate(states) if s.node.devices_out_of_service
         and s.role in (None, role) and len(s.node.devices) - s.used >= per_node and not s.fits(role, per_node)],
        role, f"{role}-{index}", per_node, config.target)
    if out is not None:
        return out
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
