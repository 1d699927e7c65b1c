"""The planner's pool, SLOs and starting counts from a stack's Plan."""

from __future__ import annotations

from ascend_runtime.pdplanner.decide import Pool, Slo, StagePool
from ascend_runtime.perf.model import StageShape
from ascend_runtime.planner.plan import Plan


def stage_pool(plan: Plan, role: str) -> StagePool:
    """Shape of the Plan's first ``role`` instance and the whole nodes one instance takes."""
    instances = plan.by_role(role)
    if not instances:
        raise ValueError(f"the Plan has no {role} instance")
    inst, stage = instances[0], plan.config[role]
    shape = StageShape(
        hardware=plan.hardware, role=role, dp=inst.dp, tp=inst.tp, redundant_experts=inst.redundant_experts,
        mtp=bool(stage["mtp"]), nodes=len(set(inst.nodes)), max_num_seqs=stage["max_num_seqs"],
        max_num_batched_tokens=stage["max_num_batched_tokens"], model=plan.config["model"]["name"],
    )
    return StagePool(shape, int(stage["nodes_per_instance"]))


def pool_from_plan(plan: Plan) -> Pool:
    """Every node of the stack's inventory, with the Plan's prefill and decode instance shapes."""
    return Pool(len(plan.nodes), stage_pool(plan, "prefill"), stage_pool(plan, "decode"))


def slo_from_plan(plan: Plan) -> Slo:
    """The stack's ``slo`` (milliseconds) in seconds."""
    slo = plan.config["slo"]
    return Slo(float(slo["ttft_ms"]) / 1000.0, float(slo["tpot_ms"]) / 1000.0)


def counts_from_plan(plan: Plan) -> tuple[int, int]:
    """(prefill, decode) instances the Plan deploys."""
    return len(plan.by_role("prefill")), len(plan.by_role("decode"))
