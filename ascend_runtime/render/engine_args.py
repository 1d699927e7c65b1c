"""The ``vllm serve`` command line of one rank, in the dialect of the targeted release.

What a release reads comes from :mod:`ascend_runtime.engine.releases` (the rule
table, each entry citing its upstream file) and is checked against the
release's extracted surface by the conformance tests (tests/engine/). This
module does not branch on version numbers: it asks the release row how each
concern is spelt (graph mode, redundant experts, EPLB, operator options).

Recipe values (the upstream tutorials of vLLM-Ascend v0.23.0:
docs/source/tutorials/models/DeepSeek-V3.1.md "Multi-Node PD Separation",
docs/source/user_guide/feature_guide/expert_parallelism_load_balancer.md):
seed 1024 on every DP rank, MTP with one speculative token, decode graphs
``FULL_DECODE_ONLY``, the recompute scheduler on decode, EPLB intervals per
role (prefill 50/5, decode 600/50 steps).
"""

from __future__ import annotations

import json
import math
from typing import Any

from ascend_runtime.engine.releases import Connector, EngineRelease, release
from ascend_runtime.planner.engine_rules import extra_additional_config, merge_config
from ascend_runtime.planner.modules import ModuleDegrees, additional_config_entries
from ascend_runtime.planner.frontend_sizing import decode_front_end
from ascend_runtime.planner.plan import InstancePlan, Plan, RankPlan

SEED = 1024  # every DP rank of an instance must sample the same way; the recipes use 1024
MTP_SPEC_TOKENS = 1
#: EPLB intervals (engine steps) per role when the stage leaves them unset (EPLB guide, v0.23.0: "P node" 50/5,
#: "D node or colocation" 600/50).
EPLB_INTERVALS = {"prefill": (50, 5), "decode": (600, 50)}
#: Requests/s one API server process is planned for when sizing --api-server-count from
#: slo.expected_request_rate (a planning assumption of this kit, not an upstream figure; docs/rendering.md).
REQUESTS_PER_API_SERVER = 50.0


def engine_release(plan: Plan) -> EngineRelease:
    """The rule row of the Plan's release."""
    return release(plan.vllm_ascend_version)


def connector(plan: Plan) -> Connector:
    """The KV connector of the Plan's dialect in its release."""
    return engine_release(plan).connector(plan.kv_connector)


def _json(value: Any) -> str:
    """Compact, key-sorted JSON: deterministic and one shell word after quoting."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _set_path(config: dict[str, Any], path: str, value: Any) -> None:
    """Set ``section.key`` (or ``key``) in a nested ``--additional-config`` dict."""
    *sections, key = path.split(".")
    node = config
    for section in sections:
        node = node.setdefault(section, {})
    node[key] = value


def graph_mode(plan: Plan, role: str) -> bool:
    """Graph mode of a stage (default: on for decode, off for prefill)."""
    explicit = plan.config[role].get("graph_mode")
    return role == "decode" if explicit is None else bool(explicit)


def recompute_scheduler(plan: Plan, role: str) -> bool:
    """Recompute scheduler of a stage: decode only; on by default where the release has it (recipe)."""
    if role != "decode" or "recompute_scheduler" not in engine_release(plan).config_keys:
        return False
    explicit = plan.config[role].get("recompute_scheduler")
    return True if explicit is None else bool(explicit)


def fused_mc2_mode(plan: Plan, role: str) -> int:
    """Fused MC2 of a stage: 2 (``dispatch_gmm_combine_decode``) on W8A8 decode where the release reads it, else 0.

    vLLM-Ascend 0.23 consults the switch only in its A3 dispatch selection
    (vllm_ascend/ascend_forward_context.py ``_select_a3_moe_comm_method``, v0.23.0); the A2 selection ignores it,
    so it is 0 there. Mode 2 is for decode nodes with W8A8 MoE weights (vllm_ascend/envs.py, v0.23.0); with MTP
    the engine uses it only when the MTP layer is W8A8 too and falls back to MC2 otherwise.
    """
    row = engine_release(plan)
    w8a8 = plan.config["model"]["quantization"] == "w8a8"
    return 2 if role == "decode" and w8a8 and plan.hardware in row.fused_mc2_hardware else 0


def eplb_settings(plan: Plan, role: str) -> dict[str, Any] | None:
    """The stage's EPLB as data: policy type, intervals; None when the stage has no EPLB."""
    eplb = plan.config[role].get("eplb")
    if not eplb:
        return None
    heat, algo = EPLB_INTERVALS[role]
    return {
        "policy": eplb["policy"],
        "heat_collection_interval": eplb.get("heat_collection_interval") or heat,
        "algorithm_execution_interval": eplb.get("algorithm_execution_interval") or algo,
    }


def api_server_count(plan: Plan, inst: InstancePlan) -> int | None:
    """API server processes of an instance's leader.

    vLLM 0.23 defaults it to data_parallel_size on the leader (vllm/entrypoints/cli/serve.py), 32 or 64
    processes for a large-EP decode. Decode: the count that carries the instance's output token target at
    the measured capacity of one process (planner/frontend_sizing.py; an explicit key below it is refused
    when the Plan is built). Prefill, which answers one token per request: the stage's key, else
    ``slo.expected_request_rate`` shared across the role's instances, else 1.
    """
    if inst.role == "decode":
        front = decode_front_end(plan.config)
        return front.count if front is not None else 1
    stage = plan.config[inst.role]
    if stage.get("api_server_count"):
        return int(stage["api_server_count"])
    rate = (plan.config.get("slo") or {}).get("expected_request_rate")
    if not rate:
        return 1
    per_instance = rate / max(stage["instances"], 1)
    return max(1, min(inst.dp, math.ceil(per_instance / REQUESTS_PER_API_SERVER)))


def kv_transfer_config(plan: Plan, rank: RankPlan, engine_id: str | None = None) -> dict[str, Any]:
    """``--kv-transfer-config`` of a rank (the rank's own kv_port and engine_id from the Plan; ``engine_id``:
    another one, a DP rank's own under ``serving: rank``, :func:`rank_engine_id`).

    No ``kv_connector_module_path``: the release registers the connector by name from its
    ``vllm.general_plugins`` entry point, and vLLM 0.23.0 would look the registry *name* up as a class in
    an explicit module path, which the Mooncake module does not define (engine/conformance.py
    ``kv_transfer_violations``)."""
    conn = connector(plan)
    config: dict[str, Any] = {
        "kv_connector": conn.kv_connector,
        "kv_buffer_device": "npu",
        "kv_role": "kv_producer" if rank.role == "prefill" else "kv_consumer",
        "kv_parallel_size": 1,
        "kv_port": str(rank.kv_port),
        "engine_id": rank.engine_id if engine_id is None else engine_id,
    }
    if conn.extra_config:
        prefill, decode = plan.config["prefill"], plan.config["decode"]
        config["kv_connector_extra_config"] = {
            "prefill": {"dp_size": prefill["dp"], "tp_size": prefill["tp"]},
            "decode": {"dp_size": decode["dp"], "tp_size": decode["tp"]},
        }
    return config


def additional_config(plan: Plan, inst: InstancePlan) -> dict[str, Any]:
    """``--additional-config`` of an instance, every key spelt as its release reads it."""
    row = engine_release(plan)
    keys = row.config_keys
    stage = plan.config[inst.role]
    extra: dict[str, Any] = {}
    if graph_mode(plan, inst.role) and row.graph == "torchair":
        _set_path(extra, keys["graph"], True)
        if stage.get("graph_capture_sizes"):
            _set_path(extra, keys["graph_batch_sizes"], list(stage["graph_capture_sizes"]))
    if recompute_scheduler(plan, inst.role):
        _set_path(extra, keys["recompute_scheduler"], True)
    if stage.get("multistream_overlap_shared_expert"):
        _set_path(extra, keys["multistream_shared_expert"], True)
    if "mlapo" in keys and plan.config["model"]["quantization"] == "w8a8":
        # MLAPO on decode only (recipe; 0.23 applies it to KV consumers only, attention/utils.py enabling_mlapo)
        _set_path(extra, keys["mlapo"], inst.role == "decode")
    if "fused_mc2" in keys:
        mode = fused_mc2_mode(plan, inst.role)
        if mode:
            _set_path(extra, keys["fused_mc2"], mode)
    if "weight_nz" in keys and plan.config["model"]["quantization"] == "w8a8":
        _set_path(extra, keys["weight_nz"], 1)  # 1: NZ layout for quantised weights (ascend_config.py weight_nz_mode)
    if "flashcomm1" in keys and inst.role == "prefill" and inst.tp > 1:
        _set_path(extra, keys["flashcomm1"], True)  # recipe: FlashComm1 on TP prefill nodes
    eplb = eplb_settings(plan, inst.role)
    if eplb is not None:
        _set_path(extra, keys["dynamic_eplb"], True)
        if "eplb_heat_interval" in keys:
            _set_path(extra, keys["eplb_heat_interval"], eplb["heat_collection_interval"])
            _set_path(extra, keys["eplb_algorithm_interval"], eplb["algorithm_execution_interval"])
        else:
            _set_path(extra, keys["eplb_update_interval"], eplb["heat_collection_interval"])
        if row.eplb_policies:
            _set_path(extra, keys["eplb_policy"], row.eplb_policies[eplb["policy"]])
        if "eplb_heat_stage" in keys:
            _set_path(extra, keys["eplb_heat_stage"], inst.role)
    if inst.redundant_experts and (eplb is not None or row.redundancy == "init_redundancy_expert"):
        _set_path(extra, keys["redundant_experts"], inst.redundant_experts)
    # per-module degrees: finegrained_tp_config / enable_shared_expert_dp (vllm_ascend/ascend_config.py, v0.23.0;
    # the planner refuses them on releases without these keys, planner/modules.py)
    extra.update(additional_config_entries(ModuleDegrees.from_json(stage.get("modules"))))
    return extra


def compilation_config(plan: Plan, inst: InstancePlan) -> dict[str, Any] | None:
    """``--compilation-config`` of an aclgraph release when the stage runs graphs."""
    if engine_release(plan).graph != "aclgraph" or not graph_mode(plan, inst.role):
        return None
    config: dict[str, Any] = {"cudagraph_mode": "FULL_DECODE_ONLY"}
    sizes = plan.config[inst.role].get("graph_capture_sizes")
    if sizes:
        config["cudagraph_capture_sizes"] = sorted(set(sizes))
    return config


def engine_command(plan: Plan, rank: RankPlan) -> list[str]:
    """argv of ``vllm serve`` for one rank: the leader serves the API, the others run ``--headless``."""
    inst = plan.instance(rank.instance)
    model = plan.config["model"]
    argv = ["vllm", "serve", model["weights_path"]]
    if rank.is_leader:
        argv += ["--host", "0.0.0.0", "--port", str(inst.api_port)]
        servers = api_server_count(plan, inst)
        if servers is not None:
            argv += ["--api-server-count", str(servers)]
    else:
        argv.append("--headless")  # no API server: --api-server-count is refused with --headless (cli/serve.py)
    argv += ["--served-model-name", model["name"]]
    argv += [
        "--data-parallel-size", str(inst.dp),
        "--data-parallel-size-local", str(rank.dp_local),
        "--data-parallel-address", inst.api_host,
        "--data-parallel-rpc-port", str(inst.dp_rpc_port),
    ]
    if not rank.is_leader:
        argv += ["--data-parallel-start-rank", str(rank.dp_start_rank)]
    return argv + _engine_options(plan, inst, kv_transfer_config(plan, rank))


def rank_engine_id(plan: Plan, instance: str, dp_rank: int) -> str:
    """The KV connector engine_id of one DP rank's server (``serving: rank``): ``<stack>-<instance>-dp<rank>``.

    vLLM appends ``_dp<local DP rank>`` to the engine_id in every DP engine process (vllm/v1/engine/core.py
    ``EngineCoreProc.run_engine_core``, v0.23.0); a ``--data-parallel-rank`` server's one engine has local rank 0,
    so servers sharing the node's engine_id would all be ``<id>_dp0``: each rank gets its own.
    """
    return f"{plan.stack}-{instance}-dp{dp_rank}"


def rank_serving_command(plan: Plan, rank: RankPlan, dp_rank: int, api_port: int) -> list[str]:
    """argv of the ``vllm serve`` of one DP rank of a node group under ``serving: rank`` (docs/rank-serving.md).

    vLLM's external load-balancer mode, as vLLM-Ascend v0.23.0's per-rank launcher spells it
    (examples/external_online_dp/run_dp_template.sh; docs/source/tutorials/models/DeepSeek-V3.1.md, "Multi-Node
    PD Separation"): ``--port`` the rank's own, ``--data-parallel-size`` the instance's DP, ``--data-parallel-rank``
    the global rank (it implies ``data_parallel_external_lb``, vllm/engine/arg_utils.py ``create_engine_config``,
    vLLM v0.23.0), ``--data-parallel-address`` / ``--data-parallel-rpc-port`` rank 0's front end, which runs the DP
    coordinator and takes every engine's handshake (vllm/v1/engine/utils.py ``launch_core_engines``). No
    ``--data-parallel-size-local`` (asserted 1 or None with a rank) nor ``--data-parallel-start-rank``.
    ``--api-server-count``: vLLM defaults it to 1 in external LB mode (vllm/entrypoints/cli/serve.py), and
    takes an explicit count there too; a decode rank whose own token target needs more than one process
    (planner/frontend_sizing.py, sized per rank under ``serving: rank``) gets that count.
    """
    inst = plan.instance(rank.instance)
    if dp_rank not in rank.dp_ranks:
        raise ValueError(f"{rank.name} runs DP ranks {rank.dp_ranks.start}..{rank.dp_ranks.stop - 1}, not {dp_rank}")
    model = plan.config["model"]
    argv = ["vllm", "serve", model["weights_path"], "--host", "0.0.0.0", "--port", str(api_port),
            "--served-model-name", model["name"],
            "--data-parallel-size", str(inst.dp),
            "--data-parallel-rank", str(dp_rank),
            "--data-parallel-address", inst.api_host,
            "--data-parallel-rpc-port", str(inst.dp_rpc_port)]
    if inst.role == "decode":
        front = decode_front_end(plan.config)
        if front is not None and front.count > 1:
            argv += ["--api-server-count", str(front.count)]
    kv = kv_transfer_config(plan, rank, rank_engine_id(plan, inst.name, dp_rank))
    return argv + _engine_options(plan, inst, kv)


def _engine_options(plan: Plan, inst: InstancePlan, kv: dict[str, Any]) -> list[str]:
    """The options after the DP ones, equal on every rank of an instance but for ``kv`` (its KV transfer config)."""
    row = engine_release(plan)
    model = plan.config["model"]
    stage = plan.config[inst.role]
    argv = ["--tensor-parallel-size", str(inst.tp)]
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
        argv += ["--speculative-config", _json({"num_speculative_tokens": MTP_SPEC_TOKENS, "method": row.mtp_method})]
    if stage.get("micro_batching"):
        argv.append("--enable-dbo")
    compilation = compilation_config(plan, inst)
    if compilation:
        argv += ["--compilation-config", _json(compilation)]
    argv += ["--kv-transfer-config", _json(kv)]
    # --additional-config keys of engine.extra_args merged into the kit's: a second option would replace it
    user = extra_additional_config(list(plan.config["engine"].get("extra_args") or []))
    extra = merge_config(additional_config(plan, inst), user.values)
    if extra:
        argv += ["--additional-config", _json(extra)]
    argv += user.rest
    return argv
