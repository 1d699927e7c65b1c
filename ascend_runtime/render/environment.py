"""HCCL and runtime environment of one rank (facts file, section 4).

Values come from the Plan: HCCL_IF_IP is the host IP of the rank's node (engine
pods run with hostNetwork), the socket interface names are the node's NIC from
the inventory, ASCEND_RT_VISIBLE_DEVICES lists the rank's devices. MoE operator
switches are emitted only when the engine version reads them (see
:data:`ascend_runtime.render.engine_args.VERSION_TABLE`):

- All2All (``VLLM_ASCEND_ENABLE_MOE_ALL2ALL_SEQ=1``) on hardware whose MoE dispatch is all2all (CM384);
- fused MC2 dispatch/combine (``VLLM_ASCEND_ENABLE_FUSED_MC2=2``) on decode where dispatch is MC2 (A2);
- MLAPO (``VLLM_ASCEND_ENABLE_MLAPO``) 1 on decode, 0 on prefill (W8A8 weights only).

``engine.extra_env`` is applied last and may override anything except the
variables the cross-checks rely on (:data:`PINNED`).
"""

from __future__ import annotations

from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner.plan import Plan, RankPlan
from ascend_runtime.render.engine_args import connector, engine_release
from ascend_runtime.render.paths import ranktable_path
from ascend_runtime.render.ranktables import PD_TABLE

#: Published defaults (facts file section 2, large-EP recipe): HCCL_BUFFSIZE in MB per stage.
DEFAULT_BUFFSIZE_MB = {"prefill": 256, "decode": 1024}
OMP_NUM_THREADS = 10  # the published recipes' value
#: Variables that always follow the Plan; extra_env cannot change them.
PINNED = ("HCCL_IF_IP", "ASCEND_RT_VISIBLE_DEVICES", "HCCL_INTRA_ROCE_ENABLE", "HCCL_INTRA_PCIE_ENABLE")


def hccl_buffsize_mb(plan: Plan, role: str) -> int:
    """HCCL_BUFFSIZE of a stage: the stage's override, else the published default."""
    explicit = plan.config[role].get("hccl_buffsize_mb")
    return int(explicit) if explicit else DEFAULT_BUFFSIZE_MB[role]


def hccl_intra(plan: Plan, role: str) -> str:
    """``pcie`` or ``roce``: the HCCL path inside a node for a stage."""
    return plan.config[role].get("hccl_intra") or "pcie"


def moe_switches(plan: Plan, role: str) -> dict[str, str]:
    """MoE operator switches for a stage on the Plan's hardware and engine version."""
    release = engine_release(plan.vllm_ascend_version)
    dispatch = hardware_spec(plan.hardware).moe_dispatch
    env: dict[str, str] = {}
    if dispatch == "all2all" and release.moe_all2all_env:
        env[release.moe_all2all_env] = "1"
    if release.fused_mc2_env:
        env[release.fused_mc2_env] = "2" if role == "decode" and dispatch == "mc2" else "0"
    if release.mlapo_env and plan.config["model"]["quantization"] == "w8a8":
        env[release.mlapo_env] = "1" if role == "decode" else "0"
    return env


def rank_env(plan: Plan, rank: RankPlan) -> dict[str, str]:
    """Every environment variable of a rank's engine process, sorted by name."""
    engine = plan.config["engine"]
    intra = hccl_intra(plan, rank.role)
    env: dict[str, str] = {
        "HCCL_IF_IP": rank.host_ip,
        "HCCL_SOCKET_IFNAME": rank.nic,
        "GLOO_SOCKET_IFNAME": rank.nic,
        "TP_SOCKET_IFNAME": rank.nic,
        "HCCL_BUFFSIZE": str(hccl_buffsize_mb(plan, rank.role)),
        "HCCL_CONNECT_TIMEOUT": str(engine["hccl_connect_timeout_s"]),
        "HCCL_OP_EXPANSION_MODE": "AIV",
        "HCCL_INTRA_ROCE_ENABLE": "1" if intra == "roce" else "0",
        "HCCL_INTRA_PCIE_ENABLE": "1" if intra == "pcie" else "0",
        "OMP_PROC_BIND": "false",
        "OMP_NUM_THREADS": str(OMP_NUM_THREADS),
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "TASK_QUEUE_ENABLE": "1",
        "VLLM_USE_V1": "1",
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(d) for d in rank.device_ids),
    }
    if connector(plan).needs_rank_table:
        env["DISAGGREGATED_PREFILL_RANK_TABLE_PATH"] = ranktable_path(PD_TABLE)
        rpc_env = engine_release(plan.vllm_ascend_version).llmdd_rpc_port_env
        if rpc_env:
            env[rpc_env] = str(plan.instance(rank.instance).llmdd_rpc_port)
    if engine.get("dynamic_eplb"):
        env["DYNAMIC_EPLB"] = "true"
    env.update(moe_switches(plan, rank.role))
    for key, value in (engine.get("extra_env") or {}).items():
        if key not in PINNED:
            env[key] = str(value)
    return dict(sorted(env.items()))
