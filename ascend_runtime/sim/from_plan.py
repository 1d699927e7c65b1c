"""Simulator options for one instance of a Plan (explicit `local` and `kind` targets only)."""

from __future__ import annotations

from ascend_runtime.planner.plan import InstancePlan, Plan
from ascend_runtime.sim.config import SimConfig

#: The stack gives link rates in GB/s (bytes); the simulator takes Gbit/s.
BITS_PER_BYTE = 8


def sim_config_from_plan(plan: Plan, instance: InstancePlan, bind_host: str | None = None) -> SimConfig:
    """The SimConfig that stands in for ``instance``: its shape, ports, leader address and the stack's simulator settings.

    ``bind_host`` overrides the listen address (a pod binds 0.0.0.0 on kind);
    the address announced for KV pulls stays the leader's host IP.
    """
    stage = plan.config[instance.role]
    sim = plan.config["simulator"]
    return SimConfig(
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
