"""Flexible node groups of ``pd_ratio.mode: auto``: their size, checks and placement.

A group is ``lcm(prefill.nodes_per_instance, decode.nodes_per_instance)`` whole nodes. On them the
Plan lays out both shapes: ``nodes / prefill.nodes_per_instance`` prefill instances and
``nodes / decode.nodes_per_instance`` decode instances. Only one shape runs at a time; which one is
the P:D planner's decision (docs/pd-planner.md). Flexible instances are named like fixed ones and
numbered after them (``prefill-1``, ``prefill-2``, ``decode-1`` ...), so every name rule holds.
Groups take the first free whole nodes after the fixed instances (inventory order; on super-pod
hardware inside one super pod unless ``allow_cross_super_pod``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ascend_runtime.config.errors import Problem
from ascend_runtime.config.stack import StackConfig

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class GroupShape:
    """Nodes of one group and instances of each shape on them."""

    nodes: int
    prefill: int
    decode: int

    def instances(self, role: str) -> int:
        """Instances of the ``role`` shape in one group."""
        return self.prefill if role == "prefill" else self.decode


def group_shape(config: StackConfig) -> GroupShape:
    """The shape every flexible group of ``config`` has."""
    npi_p, npi_d = config.prefill.nodes_per_instance, config.decode.nodes_per_instance
    nodes = npi_p * npi_d // math.gcd(npi_p, npi_d)
    return GroupShape(nodes, nodes // npi_p, nodes // npi_d)


def flex_groups(config: StackConfig) -> int:
    """Flexible groups the stack declares (0 unless ``pd_ratio.mode`` is auto)."""
    return config.pd_ratio.groups if config.pd_ratio.mode == "auto" else 0


def planned_instances(config: StackConfig, role: str) -> int:
    """Instances of ``role`` the Plan lays out: the fixed ones plus the ``role`` shape of every group."""
    return config.stage(role).instances + flex_groups(config) * group_shape(config).instances(role)  # type: ignore[arg-type]


def check_pd_ratio(config: StackConfig) -> list[Problem]:
    """``pd_ratio`` keys consistent with the stages: groups only in auto mode, minimums reachable."""
    pd = config.pd_ratio
    if pd.mode == "fixed":
        if pd.groups:
            return [Problem("pd_ratio.groups", "flexible groups need mode auto", pd.groups,
                            "set pd_ratio.mode: auto, or remove pd_ratio.groups")]
        return []
    problems: list[Problem] = []
    shape = group_shape(config)
    if pd.groups < 1:
        problems.append(Problem("pd_ratio.groups", "mode auto needs at least one flexible node group", pd.groups,
                                f"set pd_ratio.groups to 1 or more (each takes {shape.nodes} nodes)"))
    if pd.initial_prefill_groups > pd.groups:
        problems.append(Problem("pd_ratio.initial_prefill_groups", f"more than the {pd.groups} flexible groups",
                                pd.initial_prefill_groups, f"set it to {pd.groups} or less"))
    for role, key in (("prefill", "min_prefill"), ("decode", "min_decode")):
        most = planned_instances(config, role)
        value = getattr(pd, key)
        if value > most:
            problems.append(Problem(f"pd_ratio.{key}", f"the pool holds at most {most} {role} instances "
                                    f"({config.stage(role).instances} fixed + {pd.groups} groups x "  # type: ignore[arg-type]
                                    f"{shape.instances(role)})", value, f"set it to {most} or less"))
    fixed_p, fixed_d = config.prefill.instances, config.decode.instances
    if pd.groups >= 1 and not problems:
        # some split of the groups must satisfy both minimums
        ok = any(fixed_p + k * shape.prefill >= pd.min_prefill and fixed_d + (pd.groups - k) * shape.decode >= pd.min_decode
                 for k in range(pd.groups + 1))
        if not ok:
            problems.append(Problem("pd_ratio.min_prefill", "no split of the flexible groups meets both "
                                    f"min_prefill {pd.min_prefill} and min_decode {pd.min_decode}", pd.min_prefill,
                                    "lower min_prefill or min_decode, or add groups"))
    return problems


@dataclass
class FlexPlacement:
    """Placed flexible groups: one Assignment per instance of both shapes, and each group's layout."""

    assignments: list  # list[placement.Assignment], fixed instances' numbering continued per role
    groups: list[tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...], str]]  # name, nodes, P names, D names, initial


def place_flex_groups(config: StackConfig, inventory, hardware, states: list) -> FlexPlacement:  # type: ignore[no-untyped-def]
    """Place every flexible group on free whole nodes after the fixed instances; ConfigError when they do not fit.

    ``states``: the placement's node states (``placement.NodeState``); a group's nodes get the role it
    starts in, and the devices of that shape count as used. Both shapes use the lowest device ids.
    """
    from ascend_runtime.config.errors import ConfigError  # noqa: PLC0415
    from ascend_runtime.planner.placement import Assignment  # noqa: PLC0415 (placement imports validation)
    from ascend_runtime.planner.validation import devices_per_node  # noqa: PLC0415

    out = FlexPlacement([], [])
    count = flex_groups(config)
    if not count:
        return out
    shape = group_shape(config)
    per_node = {r: devices_per_node(config, r, hardware) for r in ROLES}  # type: ignore[arg-type]
    need = max(per_node.values())
    next_index = {r: config.stage(r).instances for r in ROLES}  # type: ignore[arg-type]
    pods: dict[int | None, list] = {}
    for st in states:
        pods.setdefault(st.node.super_pod_id if hardware.has_super_pods and not config.allow_cross_super_pod else None,
                        []).append(st)
    for g in range(count):
        initial = "prefill" if g < config.pd_ratio.initial_prefill_groups else "decode"
        chosen = None
        for pod in sorted(pods, key=lambda p: -1 if p is None else p):
            free = [st for st in pods[pod] if st.role is None and st.used == 0 and len(st.free) >= need]
            if len(free) >= shape.nodes:
                chosen = free[: shape.nodes]
                break
        if chosen is None:
            left = sum(1 for st in states if st.role is None and st.used == 0)
            raise ConfigError([Problem(
                "pd_ratio.groups", f"too few nodes: flexible group {g} needs {shape.nodes} free whole nodes "
                f"(lcm of prefill and decode nodes_per_instance) and {left} are left after the fixed instances"
                + (" in one super pod" if hardware.has_super_pods and not config.allow_cross_super_pod else ""),
                count, f"lower pd_ratio.groups to {g} or add nodes to the inventory")])
        names: dict[str, list[str]] = {r: [] for r in ROLES}
        for role in ROLES:
            npi = config.stage(role).nodes_per_instance  # type: ignore[arg-type]
            for j in range(shape.instances(role)):
                idx = next_index[role]
                next_index[role] += 1
                a = Assignment(role, idx)  # type: ignore[arg-type]
                for st in chosen[j * npi:(j + 1) * npi]:
                    a.nodes.append(st.node)
                    a.devices.append(list(st.free[: per_node[role]]))
                out.assignments.append(a)
                names[role].append(f"{role}-{idx}")
        for st in chosen:
            st.role, st.used = initial, per_node[initial]
            st.free = st.free[per_node[initial]:]
        out.groups.append((f"flex-{g}", tuple(st.node.name for st in chosen), tuple(names["prefill"]),
                           tuple(names["decode"]), initial))
    return out
