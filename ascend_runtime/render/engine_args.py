"""The ``vllm serve`` command line of one rank, for both KV connector dialects.

:data:`VERSION_TABLE` is the one place that says what a range of vLLM-Ascend
releases reads: which KV connector classes it has (LLMDataDist and/or Mooncake),
the name of the LLMDataDist RPC port variable, which MoE operator switches
exist as environment variables, and how ``--additional-config`` spells the
EPLB keys. :mod:`ascend_runtime.render.environment` reads the same table.

Sources (facts file section 2; vllm-ascend release notes v0.10.1rc1: #2450 renamed
``VLLM_LLMDD_RPC_PORT`` to ``VLLM_ASCEND_LLMDD_RPC_PORT``, #2612 removed
``VLLM_ASCEND_ENABLE_MOE_ALL2ALL_SEQ``; ``examples/disaggregated_prefill_v1/README.md``;
``mooncake_connector_deployment_guide.md``; the large-EP guide). The first releases
reading ``VLLM_ASCEND_ENABLE_MLAPO`` (0.11) and ``VLLM_ASCEND_ENABLE_FUSED_MC2`` (0.12)
are our reading, not confirmed by a release note; see docs/rendering.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ascend_runtime.planner.plan import InstancePlan, Plan, RankPlan
from ascend_runtime.planner.versions import Version, parse_version

SEED = 1024  # every DP rank of an instance must sample the same way; the recipes use 1024
MTP_CONFIG = {"num_speculative_tokens": 1, "method": "deepseek_mtp"}


@dataclass(frozen=True)
class Connector:
    """One KV connector class as ``--kv-transfer-config`` names it."""

    dialect: str
    kv_connector: str
    module_path: str
    needs_rank_table: bool
    extra_config: bool


LLMDATADIST = Connector(
    "llmdatadist", "LLMDataDistCMgrConnector", "vllm_ascend.distributed.llmdatadist_c_mgr_connector", True, False
)
MOONCAKE = Connector("mooncake", "MooncakeConnectorV1", "vllm_ascend.distributed.mooncake_connector", False, True)


@dataclass(frozen=True)
class EngineRelease:
    """What the vLLM-Ascend releases ``first`` .. ``last`` (inclusive) read."""

    first: Version
    last: Version
    connectors: tuple[Connector, ...]
    llmdd_rpc_port_env: str | None
    moe_all2all_env: str | None = None
    fused_mc2_env: str | None = None
    mlapo_env: str | None = None
    eplb_grouped: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)


#: The one version table, oldest first.
VERSION_TABLE: tuple[EngineRelease, ...] = (
    EngineRelease(
        (0, 9, 1), (0, 10, 0), (LLMDATADIST,), "VLLM_LLMDD_RPC_PORT",
        moe_all2all_env="VLLM_ASCEND_ENABLE_MOE_ALL2ALL_SEQ",
        notes=("MC2 dispatch/combine is chosen by the engine for decode; no switch",),
    ),
    EngineRelease(
        (0, 10, 1), (0, 10, 99), (LLMDATADIST,), "VLLM_ASCEND_LLMDD_RPC_PORT",
        notes=("VLLM_ASCEND_ENABLE_MOE_ALL2ALL_SEQ removed (#2612)",),
    ),
    EngineRelease(
        (0, 11, 0), (0, 11, 99), (LLMDATADIST, MOONCAKE), "VLLM_ASCEND_LLMDD_RPC_PORT",
        mlapo_env="VLLM_ASCEND_ENABLE_MLAPO",
    ),
    EngineRelease(
        (0, 12, 0), (0, 12, 99), (LLMDATADIST, MOONCAKE), "VLLM_ASCEND_LLMDD_RPC_PORT",
        fused_mc2_env="VLLM_ASCEND_ENABLE_FUSED_MC2", mlapo_env="VLLM_ASCEND_ENABLE_MLAPO",
    ),
    EngineRelease(
        (0, 13, 0), (99, 99, 99), (MOONCAKE,), None,
        fused_mc2_env="VLLM_ASCEND_ENABLE_FUSED_MC2", mlapo_env="VLLM_ASCEND_ENABLE_MLAPO", eplb_grouped=True,
        notes=("LLMDataDist removed in 0.13; EPLB keys grouped under eplb_config",),
    ),
)


def engine_release(version_text: str) -> EngineRelease:
    """The row of :data:`VERSION_TABLE` covering a version; ValueError below 0.9.1."""
    version = parse_version(version_text)
    for row in VERSION_TABLE:
        if row.first <= version <= row.last:
            return row
    raise ValueError(f"vLLM-Ascend {version_text} is not in the version table")


def connector(plan: Plan) -> Connector:
    """The KV connector of the Plan's dialect; ValueError if its version lacks it."""
    row = engine_release(plan.vllm_ascend_version)
    for conn in row.connectors:
        if conn.dialect == plan.kv_connector:
            return conn
    raise ValueError(f"vLLM-Ascend {plan.vllm_ascend_version} has no {plan.kv_connector} connector")


def _json(value: Any) -> str:
    """Compact, key-sorted JSON: deterministic and one shell word after quoting."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def graph_mode(plan: Plan, role: str) -> bool:
    """torchair graph mode of a stage (default: on for decode, off for prefill)."""
    explicit = plan.config[role].get("graph_mode")
    return role == "decode" if explicit is None else bool(explicit)


def kv_transfer_config(plan: Plan, rank: RankPlan) -> dict[str, Any]:
    """``--kv-transfer-config`` of a rank (the rank's own kv_port and engine_id from the Plan)."""
    conn = connector(plan)
    config: dict[str, Any] = {
        "kv_connector": conn.kv_connector,
        "kv_buffer_device": "npu",
        "kv_role": "kv_producer" if rank.role == "prefill" else "kv_consumer",
        "kv_parallel_size": 1,
        "kv_port": str(rank.kv_port),
        "engine_id": rank.engine_id,
        "kv_connector_module_path": conn.module_path,
    }
    if conn.extra_config:
        prefill, decode = plan.config["prefill"], plan.config["decode"]
        config["kv_connector_extra_config"] = {
            "prefill": {"dp_size": prefill["dp"], "tp_size": prefill["tp"]},
            "decode": {"dp_size": decode["dp"], "tp_size": decode["tp"]},
        }
    return config


def additional_config(plan: Plan, inst: InstancePlan) -> dict[str, Any]:
    """``--additional-config``: graph mode on decode, a static expert map, in-engine EPLB keys."""
    engine = plan.config["engine"]
    extra: dict[str, Any] = {}
    if graph_mode(plan, inst.role):
        extra["torchair_graph_config"] = {"enabled": True}
    if engine.get("expert_map_path"):
        extra["expert_map_path"] = engine["expert_map_path"]
    if engine.get("dynamic_eplb"):
        if engine_release(plan.vllm_ascend_version).eplb_grouped:
            extra["eplb_config"] = {"dynamic_eplb": True, "num_redundant_experts": inst.redundant_experts}
        else:
            extra["dynamic_eplb"] = True
            if inst.redundant_experts:
                extra["init_redundancy_expert"] = inst.redundant_experts
    return extra


def engine_command(plan: Plan, rank: RankPlan) -> list[str]:
    """argv of ``vllm serve`` for one rank: the leader serves the API, the others run ``--headless``."""
    inst = plan.instance(rank.instance)
    model = plan.config["model"]
    stage = plan.config[inst.role]
    argv = ["vllm", "serve", model["weights_path"], "--host", "0.0.0.0", "--port", str(inst.api_port)]
    if not rank.is_leader:
        argv.append("--headless")
    argv += ["--served-model-name", model["name"]]
    argv += [
        "--data-parallel-size", str(inst.dp),
        "--data-parallel-size-local", str(rank.dp_local),
        "--data-parallel-address", inst.api_host,
        "--data-parallel-rpc-port", str(inst.dp_rpc_port),
    ]
    if not rank.is_leader:
        argv += ["--data-parallel-start-rank", str(rank.dp_start_rank)]
    argv += ["--tensor-parallel-size", str(inst.tp)]
    if inst.ep > 1:
        argv.append("--enable-expert-parallel")
    argv += [
        "--seed", str(SEED),
        "--max-model-len", str(model["max_model_len"]),
        "--max-num-seqs", str(stage["max_num_seqs"]),
        "--max-num-batched-tokens", str(stage["max_num_batched_tokens"]),
        "--gpu-memory-utilization", str(stage["gpu_memory_utilization"]),
        "--trust-remote-code",
    ]
    if not graph_mode(plan, inst.role):
        argv.append("--enforce-eager")
    if model["quantization"] == "w8a8":
        argv += ["--quantization", "ascend"]
    if stage.get("mtp"):
        argv += ["--speculative-config", _json(MTP_CONFIG)]
    argv += ["--kv-transfer-config", _json(kv_transfer_config(plan, rank))]
    extra = additional_config(plan, inst)
    if extra:
        argv += ["--additional-config", _json(extra)]
    argv += list(plan.config["engine"].get("extra_args") or [])
    return argv
