"""The model layer's inputs for a Plan's instances: the performance model's stage shape and simulator options.

``stage_shape`` feeds the performance model (proxy sizing, the P:D planner); ``sim_config_from_plan``
gives the simulator's options of one instance (explicit ``local`` and ``kind`` targets only), which the
simulator's CLI runs with and the renderer turns into the kind target's argv (:mod:`.sim_flags`).
"""

from __future__ import annotations

from ascend_runtime.perf.model import StageShape
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.planner.plan import InstancePlan, Plan

#: The stack gives link rates in GB/s (bytes); the simulator takes Gbit/s.
BITS_PER_BYTE = 8


def stage_shape(plan: Plan, role: str) -> StageShape:
    """Shape of the Plan's first ``role`` instance (degrees, batch limits per DP rank, nodes it spans);
    ValueError when the Plan has no ``role`` instance."""
    instances = plan.by_role(role)
    if not instances:
        raise ValueError(f"the Plan has no {role} instance")
    inst, stage = instances[0], plan.config[role]
    return StageShape(
        hardware=plan.hardware, role=role, dp=inst.dp, tp=inst.tp, redundant_experts=inst.redundant_experts,
        mtp=bool(stage["mtp"]), nodes=len(set(inst.nodes)), max_num_seqs=stage["max_num_seqs"],
        max_num_batched_tokens=stage["max_num_batched_tokens"], model=plan.config["model"]["name"],
    )


def sim_config_from_plan(plan: Plan, instance: InstancePlan, bind_host: str | None = None) -> SimConfig:
    """The SimConfig that stands in for ``instance``: its shape, ports, leader address and the stack's simulator settings.

    ``bind_host`` overrides the listen address (a pod binds 0.0.0.0 on kind);
    the address announced for KV pulls stays the leader's host IP. With ``serving: rank`` the simulator
    also gets every DP rank's own API address (:func:`rank_endpoints`); rank 0's is ``host:port``.
    """
    stage = plan.config[instance.role]
    sim = plan.config["simulator"]
    return SimConfig(
        rank_endpoints=rank_endpoints(instance, bind_host),
        role=instance.role,
        instance=instance.name,
        host=bind_host or instance.api_host,
        port=instance.api_port,
        kv_port=instance.ranks[0].kv_port,
        kv_host=instance.api_host,
        hardware=plan.hardware,
        npus=instance.npus,
        dp=instance.dp,
        tp=instance.tp,
        ep=instance.ep,
        nodes=len(instance.ranks),
        max_num_seqs=stage["max_num_seqs"],
        max_num_batched_tokens=stage["max_num_batched_tokens"],
        redundant_experts=instance.redundant_experts,
        mtp=stage["mtp"],
        speedup=sim["speedup"],
        startup_delay=sim["startup_delay_s"],
        link_gbps=sim["link_gbps"] * BITS_PER_BYTE,
        model=plan.config["model"]["name"],
        seed=instance.ordinal,
    )


def rank_endpoints(instance: InstancePlan, bind_host: str | None = None) -> tuple[str, ...]:
    """``host:port`` of each DP rank's API server in rank order (``serving: rank``), from the Plan's
    ``api_endpoints`` (each rank on its node's host IP); empty for ``serving: instance``.

    ``bind_host`` replaces every host (one process binds them all); ValueError when two ranks then share a
    port (ranks on different nodes reuse ports, so they need their own addresses)."""
    eps = [ep for ep in instance.api_endpoints if ep.dp_rank is not None]
    if not eps:
        return ()
    eps.sort(key=lambda ep: ep.dp_rank or 0)
    out = tuple(f"{bind_host or ep.host}:{ep.port}" for ep in eps)
    if len(set(out)) != len(out):
        raise ValueError(f"{instance.name}: with one listen address ({bind_host}) its DP ranks' API ports collide "
                         f"({', '.join(out)}); rank serving needs each node's own address")
    return out
