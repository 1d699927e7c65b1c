"""Build the Plan from a stack: validate, place, assign ports, estimate memory.

``build_plan`` is a pure function of the loaded stack; ``load_plan`` reads
the stack files first. Both raise :class:`ConfigError` naming every problem.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ascend_runtime.config.errors import ConfigError, Problem
from ascend_runtime.config.loader import load_stack
from ascend_runtime.config.stack import Stack
from ascend_runtime.engine.releases import default_image
from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner.engine_rules import check_engine
from ascend_runtime.planner.flex import check_pd_ratio, place_flex_groups, planned_instances
from ascend_runtime.planner.frontend_sizing import check_front_end
from ascend_runtime.planner.hccl_buffer import check_hccl_buffers
from ascend_runtime.planner.memory import estimate_memory, expert_slots_per_rank
from ascend_runtime.planner import spares
from ascend_runtime.planner.placement import place_instances
from ascend_runtime.planner.plan import (
    FlexGroup,
    InstancePlan,
    NodePlan,
    Plan,
    PlannedDevice,
    RankPlan,
)
from ascend_runtime.planner.validation import (
    check_inventory,
    check_ports,
    check_stage_shapes,
    rank_api_ports,
)
from ascend_runtime.planner.versions import connector_dialect, target_release

__all__ = ["Plan", "build_plan", "load_plan", "plan_without"]


def _nodes_wanted(config) -> int:  # type: ignore[no-untyped-def]
    """Whole nodes the stages and flexible groups ask for (prefill and decode never share a node)."""
    from ascend_runtime.planner.flex import group_shape  # noqa: PLC0415

    fixed = sum(config.stage(role).instances * config.stage(role).nodes_per_instance for role in ("prefill", "decode"))
    pd = config.pd_ratio
    return fixed + (pd.groups * group_shape(config).nodes if pd.mode == "auto" and pd.groups > 0 else 0)


def build_plan(stack: Stack) -> Plan:
    """The Plan of a loaded stack; raises ConfigError before anything is placed when invalid.

    A node with devices out of service hands its ranks to a spare and nothing else moves
    (:mod:`ascend_runtime.planner.spares`, the rule the fault watcher moves an instance by); when no
    spare fits, the stages are placed around the node.
    """
    if any(n.devices_out_of_service for n in stack.inventory.nodes):
        try:
            plan = spares.plan_with_spares(stack, placed_plan)
        except (spares.NoSpare, ConfigError):
            return placed_plan(stack)  # placed around the nodes out, or refused naming them
        hardware = hardware_spec(stack.config.hardware)
        check_plan_invariants(plan, hardware.has_super_pods and not stack.config.allow_cross_super_pod)
        return plan
    return placed_plan(stack)


def plan_without(stack: Stack, out: Sequence[str]) -> Plan:
    """The Plan with the nodes ``out`` taken out of service, in this order: each hands its ranks to a spare
    (planner/spares.py), nothing else moves; what the fault watcher re-places a faulted instance by.
    Raises ConfigError, or :class:`~ascend_runtime.planner.spares.NoSpare` when a node finds no spare."""
    plan = spares.plan_with_spares(spares.with_nodes_out(stack, out), placed_plan, out)
    check_plan_invariants(plan, spares.confined(plan))
    return plan


def placed_plan(stack: Stack) -> Plan:
    """The Plan of ``stack`` placed in inventory order (``placement.py``), nodes out of service skipped."""
    config, inventory = stack.config, stack.inventory
    hardware = hardware_spec(config.hardware)
    release = target_release(config.engine.vllm_ascend_version)
    connector = connector_dialect(config.engine.vllm_ascend_version, config.engine.kv_connector)
    instance_count = planned_instances(config, "prefill") + planned_instances(config, "decode")  # both shapes of flexible groups
    problems = check_inventory(inventory, hardware)
    problems += check_engine(config, release, connector)
    problems += check_stage_shapes(config, hardware, connector)
    problems += check_pd_ratio(config)
    problems += check_hccl_buffers(config.model_dump(mode="json"))  # an explicit HCCL_BUFFSIZE holds MC2's window
    problems += check_front_end(config.model_dump(mode="json"))  # decode's API servers carry its token target
    ports = check_ports(config, hardware, connector, instance_count)
    if _nodes_wanted(config) > len(inventory.nodes):  # placement names the key that asks for the nodes: a port
        ports = [p for p in ports if not p.path.startswith("ports.")]  # range it overflows is no cause of its own
    problems += ports
    if problems:
        raise ConfigError(problems, stack.stack_file)
    assignments, states = place_instances(config, inventory, hardware)
    flex = place_flex_groups(config, inventory, hardware, states)  # pd_ratio auto: both shapes of each group
    assignments = [*assignments, *flex.assignments]
    kv_base = config.ports.kv_base or hardware.recommended_kv_port_base
    kv_next = kv_base  # Mooncake listens on kv_port + dp_rank * tp + tp_rank: one block of npus ports per instance
    instances = []
    for ordinal, assignment in enumerate(assignments):
        role = assignment.role
        stage = config.stage(role)
        kv_port, kv_next = kv_next, kv_next + stage.dp * stage.tp
        name = f"{role}-{assignment.index}"
        per_node = len(assignment.devices[0])
        dp_local = per_node // stage.tp
        ranks = []
        for k, (node, devices) in enumerate(zip(assignment.nodes, assignment.devices)):
            planned = tuple(
                PlannedDevice(
                    device_id=d.device_id,
                    device_ip=str(d.device_ip),
                    global_rank=k * per_node + j,
                    super_device_id=d.super_device_id,
                    super_pod_id=d.super_pod_id,
                    vnic_ip=str(d.vnic_ip) if d.vnic_ip is not None else None,
                )
                for j, d in enumerate(devices)
            )
            ranks.append(
                RankPlan(
                    instance=name,
                    role=role,
                    index=k,
                    node=node.name,
                    host_ip=str(node.host_ip),
                    nic=node.nic,
                    devices=planned,
                    dp_start_rank=k * dp_local,
                    dp_local=dp_local,
                    kv_port=kv_port,
                    kv_port_count=per_node,
                    engine_id=f"{stack.name}-{name}-{k}",
                    api_ports=rank_api_ports(config.ports.api_base, ordinal, instance_count, dp_local)
                    if config.serving == "rank" else (),
                )
            )
        pods = {n.super_pod_id for n in assignment.nodes}
        instances.append(
            InstancePlan(
                name=name,
                role=role,
                ordinal=ordinal,
                dp=stage.dp,
                tp=stage.tp,
                ep=stage.ep,
                npus=stage.dp * stage.tp,
                expert_slots_per_rank=expert_slots_per_rank(config.model, stage),
                redundant_experts=stage.redundant_experts,
                api_host=ranks[0].host_ip,
                api_port=config.ports.api_base + ordinal,
                dp_rpc_port=config.ports.dp_rpc_base + ordinal,
                llmdd_rpc_port=config.ports.rpc_base + ordinal,
                super_pod_id=pods.pop() if len(pods) == 1 else None,
                memory=estimate_memory(config.model, stage, hardware),
                ranks=tuple(ranks),
                serving=config.serving,
            )
        )
    standby = {n for (_, _, p, d, initial) in flex.groups for n in (d if initial == "prefill" else p)}
    plan = Plan(
        stack=stack.name,
        hardware=hardware.kind,
        target=config.target,
        kv_connector=connector,
        vllm_ascend_version=config.engine.vllm_ascend_version,
        config=config.model_dump(mode="json"),
        nodes=tuple(
            NodePlan(
                name=s.node.name,
                host_ip=str(s.node.host_ip),
                nic=s.node.nic,
                device_count=len(s.node.devices),
                super_pod_id=s.node.super_pod_id,
                role=s.role,
                devices_used=s.used,
                devices_out_of_service=tuple(sorted(s.node.devices_out_of_service)),
            )
            for s in states
        ),
        instances=tuple(sorted((i for i in instances if i.name not in standby), key=lambda i: (i.role != "prefill", i.ordinal))),
        flex_groups=tuple(FlexGroup(*g) for g in flex.groups),
        standby=tuple(i for i in instances if i.name in standby),
        proxy_host="127.0.0.1" if config.target == "local" else f"pd-proxy.{config.kubernetes.namespace}.svc",
        proxy_port=config.ports.proxy,
        secret_keys=stack.secret_keys,
        engine_image=config.engine.image or default_image(release.version, hardware.kind),
        source_inventory=inventory,
    )
    check_plan_invariants(plan, hardware.has_super_pods and not config.allow_cross_super_pod)
    spares.check(plan)  # the spare nodes the stack's spares key asks for
    return spares.with_spare_roles(plan)


def check_plan_invariants(plan: Plan, single_super_pod: bool) -> None:
    """Assert what every consumer relies on; a failure here is a planner bug, reported as ConfigError."""
    problems: list[Problem] = []
    used: set[tuple[str, int]] = set()
    roles: dict[str, str] = {}
    out_of_service = {(n.name, d) for n in plan.nodes for d in n.devices_out_of_service}
    for inst in plan.instances:
        ranks = [d.global_rank for r in inst.ranks for d in r.devices]
        if sorted(ranks) != list(range(inst.npus)):
            problems.append(Problem(f"plan.{inst.name}", "rank ids are not dense 0..npus-1", ranks))
        if single_super_pod and inst.super_pod_id is None and plan.hardware == "cm384":
            problems.append(Problem(f"plan.{inst.name}", "instance spans super pods"))
        for rank in inst.ranks:
            if roles.setdefault(rank.node, inst.role) != inst.role:
                problems.append(Problem(f"plan.{inst.name}", f"node {rank.node} hosts prefill and decode"))
            for dev in rank.devices:
                key = (rank.node, dev.device_id)
                if key in used:
                    problems.append(Problem(f"plan.{inst.name}", f"device {key} used twice"))
                if key in out_of_service:
                    problems.append(Problem(f"plan.{inst.name}", f"device {key} is out of service"))
                used.add(key)
    if problems:
        raise ConfigError(problems, "planner invariants")


def load_plan(stack_name: str, stacks_dir: str | os.PathLike[str] | None = None) -> Plan:
    """Load a stack by name and build its Plan."""
    return build_plan(load_stack(stack_name, stacks_dir))
