"""Spare nodes, and a spare taking the place of a node taken out of service.

**Spares.** A spare is an inventory node the Plan gives no role and whose devices are all in service
(``planner/service.py``): nothing runs there, and an instance whose node fails can move there. The stack's
``spares`` key reserves and guarantees them: ``spares.prefill`` / ``spares.decode`` nodes only that stage
may take, ``spares.shared`` more that either may; every other unused node is shared too. On super-pod
hardware whose instances stay inside one super pod (``allow_cross_super_pod: false``) the counts hold in
every super pod that hosts an instance of the stage (``shared``: any instance), because a spare in another
super pod cannot stand in there. Which node is which (:func:`spare_roles`): per super pod, the unused
in-service nodes in inventory order, first ``prefill`` of them, then ``decode``, the rest shared.

**Substitution** (:func:`substitute`). A node out of service keeps no rank; each such node that hosts
ranks in the *design* Plan (the Plan of the same stack with every device in service) hands them to one
spare, and nothing else moves: the first spare, in inventory order, reserved for the node's role, then
the first shared one, that offers the devices the node hosted (the placement's own ``NodeState.fits`` and
``_pick_nodes``), inside the node's super pod when instances stay in one. The ranks keep their index, DP
ranks, KV port block and engine id; the instance keeps its API, KV and RPC ports; its devices, node
address and NIC are the spare's, so rank tables, launch scripts and ``hccn.conf`` follow from the Plan as
for any other placement. On the local target a node with devices out of service that still offers what it
hosted keeps its ranks on its remaining devices (``usable_devices``).

Two callers, one rule: :func:`ascend_runtime.planner.build_plan` for an inventory that names devices out
of service, and the fault watcher (:func:`ascend_runtime.planner.plan_without`), which takes a faulted node
out at run time. So
the Plan after ``devices_out_of_service`` is set on a node the watcher moved an instance off is the Plan
the watcher acted on (with several nodes out, when they are given in the order the watcher took them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ascend_runtime.config.errors import ConfigError, Problem
from ascend_runtime.config.inventory import Device, Inventory, Node
from ascend_runtime.config.stack import Stack
from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner.placement import NodeState, _pick_nodes
from ascend_runtime.planner.plan import InstancePlan, NodePlan, Plan, PlannedDevice, RankPlan
from ascend_runtime.planner.service import out_of_service_problem, usable_devices

#: Spare kinds: reserved for one stage, or for either.
SHARED = "shared"
SPARE_KINDS = ("prefill", "decode", SHARED)


class NoSpare(Exception):
    """A node out of service hosts ranks and no spare can take them; ``problem`` says which node and why."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def spares_config(config: dict[str, Any]) -> dict[str, int]:
    """The ``spares`` counts of a Plan's config (JSON data); every kind 0 when the stack sets none."""
    raw = config.get("spares") or {}
    return {kind: int(raw.get(kind) or 0) for kind in SPARE_KINDS}


def confined(plan: Plan) -> bool:
    """True when instances stay inside one super pod (super-pod hardware without ``allow_cross_super_pod``)."""
    return hardware_spec(plan.config["hardware"]).has_super_pods and not plan.config.get("allow_cross_super_pod")


def _pod(plan: Plan, node: NodePlan) -> int | None:
    return node.super_pod_id if confined(plan) else None


def free_nodes(plan: Plan) -> list[NodePlan]:
    """Nodes the Plan leaves unused with every device in service (the spares), in inventory order."""
    return [n for n in plan.nodes if n.role is None and not n.devices_out_of_service]


def spare_roles(plan: Plan) -> dict[str, str]:
    """Spare node -> what it is kept for: ``prefill``, ``decode`` or ``shared`` (module docstring)."""
    want = spares_config(plan.config)
    taken: dict[tuple[int | None, str], int] = {}
    out: dict[str, str] = {}
    for node in free_nodes(plan):
        pod = _pod(plan, node)
        kind = next((k for k in ("prefill", "decode") if taken.get((pod, k), 0) < want[k]), SHARED)
        taken[(pod, kind)] = taken.get((pod, kind), 0) + 1
        out[node.name] = kind
    return out


def with_spare_roles(plan: Plan) -> Plan:
    """``plan`` with each node's ``spare_for`` (:func:`spare_roles`; None on a node that is no spare)."""
    kept = spare_roles(plan)
    return dataclasses.replace(plan, nodes=tuple(dataclasses.replace(n, spare_for=kept.get(n.name)) for n in plan.nodes))


def spare_problems(plan: Plan) -> list[Problem]:
    """``spares.<kind>`` counts the inventory cannot meet (per super pod when instances stay in one)."""
    want = spares_config(plan.config)
    if not any(want.values()):
        return []
    roles = spare_roles(plan)
    by_name = {n.name: n for n in plan.nodes}
    pods = sorted({_pod(plan, by_name[n]) for i in plan.all_instances for n in i.nodes}, key=lambda p: -1 if p is None else p)
    problems = []
    for kind in SPARE_KINDS:
        if not want[kind]:
            continue
        for pod in pods:
            if kind != SHARED and not any(i.role == kind and _pod(plan, by_name[i.nodes[0]]) == pod
                                          for i in plan.all_instances):
                continue
            have = sum(1 for n, k in roles.items() if k == kind and _pod(plan, by_name[n]) == pod)
            if have < want[kind]:
                where = f" in super pod {pod}" if pod is not None else ""
                problems.append(Problem(
                    f"spares.{kind}",
                    f"{want[kind]} spare node(s) for {'either stage' if kind == SHARED else kind} wanted{where}, the "
                    f"inventory leaves {have} unused with every device in service after placing the instances",
                    want[kind],
                    f"add {want[kind] - have} node(s){where} to the inventory (run the facts playbook on them) or lower "
                    f"spares.{kind}"))
    return problems


def planned_devices(devices: Sequence[Device], first_rank: int) -> tuple[PlannedDevice, ...]:
    """A rank's devices as the Plan lists them: inventory devices in order, global ranks from ``first_rank``."""
    return tuple(
        PlannedDevice(
            device_id=d.device_id,
            device_ip=str(d.device_ip),
            global_rank=first_rank + j,
            super_device_id=d.super_device_id,
            super_pod_id=d.super_pod_id,
            vnic_ip=str(d.vnic_ip) if d.vnic_ip is not None else None,
        )
        for j, d in enumerate(devices)
    )


def _moved_rank(rank: RankPlan, node: Node, devices: Sequence[Device]) -> RankPlan:
    """``rank`` on ``node`` with ``devices``: same index, DP ranks, KV ports and engine id."""
    first = min(d.global_rank for d in rank.devices)
    return dataclasses.replace(rank, node=node.name, host_ip=str(node.host_ip), nic=node.nic,
                               devices=planned_devices(devices, first))


def _moved_instance(inst: InstancePlan, ranks: Sequence[RankPlan]) -> InstancePlan:
    """``inst`` on ``ranks``: its API on the first rank's node, its super pod that of its devices (as build_plan)."""
    pods = {d.super_pod_id for r in ranks for d in r.devices}
    return dataclasses.replace(inst, ranks=tuple(ranks), api_host=ranks[0].host_ip,
                               super_pod_id=pods.pop() if len(pods) == 1 else None)


def _hosted(plan: Plan) -> dict[str, list[tuple[InstancePlan, RankPlan]]]:
    """Node -> the (instance, rank) pairs on it, both shapes of flexible groups, in ordinal order."""
    out: dict[str, list[tuple[InstancePlan, RankPlan]]] = {}
    for inst in sorted(plan.all_instances, key=lambda i: i.ordinal):
        for rank in inst.ranks:
            out.setdefault(rank.node, []).append((inst, rank))
    return out


def substitute(design: Plan, inventory: Inventory, out: Iterable[str] | None = None) -> Plan:
    """``design`` with every node whose devices are out of service in ``inventory`` handled (module docstring).

    ``design``: the Plan of the stack with every device in service; ``inventory``: the stack's inventory with
    the devices out of service; ``out``: the order in which nodes hand their ranks to spares (default:
    inventory order), the nodes the watcher took out first. Raises :class:`NoSpare` when a node's ranks find
    no spare. Shapes: the Plan's dataclasses; node and instance order unchanged.
    """
    nodes = {n.name: n for n in inventory.nodes}
    index = {n.name: i for i, n in enumerate(inventory.nodes)}
    target = design.target
    hosted = _hosted(design)
    plans = {n.name: n for n in design.nodes}
    kept = {name: spare_roles(design).get(name) for name in plans}
    order = list(out) if out is not None else [n.name for n in inventory.nodes]
    order += [n.name for n in inventory.nodes if n.name not in order]
    states = {name: NodeState(nodes[name], usable_devices(nodes[name], target), plans[name].role, 0)
              for name in plans}
    moved: dict[tuple[str, int], RankPlan] = {}
    node_role: dict[str, str | None] = {name: plans[name].role for name in plans}
    standby = {i.name for i in design.standby}
    for name in order:
        pairs = hosted.get(name, [])
        if not nodes[name].devices_out_of_service or not pairs:
            continue
        role = plans[name].role or pairs[0][0].role
        shapes = [[p for p in pairs if (p[0].name in standby) is s] for s in (False, True)]  # a flexible group's
        need = max(sum(len(r.devices) for _, r in ps) for ps in shapes)  # two shapes share the node's devices
        home = states[name]
        home.role = None  # it keeps its ranks if it still offers their devices (a partial node, local target)
        chosen = home if home.fits(role, need) else _spare_for(design, states, kept, plans[name], role, need)
        if chosen is None:
            raise NoSpare(_no_spare(design, nodes[name], index[name], pairs[0][0], need, target))
        if chosen is not home:
            node_role[name] = None
        devices = chosen.take(role, need)
        for ps in shapes:
            left = list(devices)
            for inst, rank in ps:
                mine, left = left[:len(rank.devices)], left[len(rank.devices):]
                moved[(inst.name, rank.index)] = _moved_rank(rank, chosen.node, mine)
        node_role[chosen.node.name] = role
    return _rebuilt(design, inventory, moved, node_role)


def _spare_for(design: Plan, states: dict[str, NodeState], kept: dict[str, str | None], node: NodePlan, role: str,
               need: int) -> NodeState | None:
    """The spare that takes ``node``'s ranks (``need`` devices): reserved for ``role`` first, then shared, in
    inventory order, in ``node``'s super pod when instances stay in one; None when none fits."""
    pod = _pod(design, node)
    spares = [states[n.name] for n in free_nodes(design)
              if _pod(design, n) == pod and states[n.name].used == 0 and states[n.name].role is None]
    ranked = [s for s in spares if kept[s.node.name] == role] + [s for s in spares if kept[s.node.name] == SHARED]
    picked = _pick_nodes(ranked, role, 1, need)
    return picked[0] if picked else None


def _no_spare(design: Plan, node: Node, index: int, inst: InstancePlan, need: int, target: str) -> Problem:
    """Why ``node``'s ranks found no spare: the devices-out-of-service refusal, naming the spares key."""
    problem = out_of_service_problem([(index, node, len(usable_devices(node, target)))], inst.role, inst.name, need,
                                     target)
    assert problem is not None
    where = f" in super pod {node.super_pod_id}" if confined(design) else ""
    return dataclasses.replace(problem, hint=f"{problem.hint}; or keep a spare node{where} for it "
                               f"(spares.{inst.role} or spares.shared, docs/faults.md)")


def _rebuilt(design: Plan, inventory: Inventory, moved: dict[tuple[str, int], RankPlan],
             node_role: dict[str, str | None]) -> Plan:
    """``design`` with the moved ranks, node roles and device counts, and the inventory's devices out of service."""
    def instance(inst: InstancePlan) -> InstancePlan:
        if not any((inst.name, r.index) in moved for r in inst.ranks):
            return inst
        return _moved_instance(inst, [moved.get((inst.name, r.index), r) for r in inst.ranks])

    instances = tuple(instance(i) for i in design.instances)
    standby = tuple(instance(i) for i in design.standby)
    used: dict[str, int] = {}
    for inst in instances:  # a standby shape shares its group's nodes: counted by the running shape
        for r in inst.ranks:
            used[r.node] = used.get(r.node, 0) + len(r.devices)
    out_ids = {n.name: tuple(sorted(n.devices_out_of_service)) for n in inventory.nodes}
    nodes = tuple(dataclasses.replace(n, role=node_role[n.name], devices_used=used.get(n.name, 0),
                                      devices_out_of_service=out_ids.get(n.name, ()), spare_for=None)
                  for n in design.nodes)
    renamed = {r.node: moved[k].node for k, r in _ranks_by_key(design).items() if k in moved}
    groups = tuple(dataclasses.replace(g, nodes=tuple(renamed.get(n, n) for n in g.nodes)) for g in design.flex_groups)
    return with_spare_roles(dataclasses.replace(design, nodes=nodes, instances=instances, standby=standby,
                                                flex_groups=groups, source_inventory=inventory))


def _ranks_by_key(plan: Plan) -> dict[tuple[str, int], RankPlan]:
    return {(i.name, r.index): r for i in plan.all_instances for r in i.ranks}


def with_nodes_out(stack: Stack, nodes: Iterable[str]) -> Stack:
    """``stack`` with every device of ``nodes`` out of service (what the watcher does to a faulted node)."""
    names = set(nodes)
    inventory = stack.inventory.model_copy(update={"nodes": [
        n.model_copy(update={"devices_out_of_service": sorted(d.device_id for d in n.devices)}) if n.name in names else n
        for n in stack.inventory.nodes]})
    return stack.model_copy(update={"inventory": inventory})


def in_service(stack: Stack) -> Stack:
    """``stack`` with every device in service (the design the substitution starts from)."""
    inventory = stack.inventory.model_copy(update={"nodes": [
        n.model_copy(update={"devices_out_of_service": []}) if n.devices_out_of_service else n
        for n in stack.inventory.nodes]})
    return stack.model_copy(update={"inventory": inventory})


def plan_with_spares(stack: Stack, build: Callable[[Stack], Plan], order: Iterable[str] | None = None) -> Plan:
    """The Plan of ``stack`` whose inventory names devices out of service: the design Plan (``build`` of the
    stack with every device in service) with spares in the place of the nodes out (:func:`substitute`).
    Raises ConfigError for the design's own problems, :class:`NoSpare` when a node finds no spare."""
    return substitute(build(in_service(stack)), stack.inventory, order)


def check(plan: Plan) -> None:
    """Raise ConfigError with :func:`spare_problems` (the counts the stack's ``spares`` asks for)."""
    problems = spare_problems(plan)
    if problems:
        raise ConfigError(problems)
