"""HCCL and runtime environment of one rank (facts file, section 4).

Values come from the Plan: HCCL_IF_IP is the host IP of the rank's node (engine
pods run with hostNetwork), the socket interface names are the node's NIC from
the inventory, ASCEND_RT_VISIBLE_DEVICES lists the rank's devices. Engine
switches are emitted only under the name the targeted release reads
(:data:`ascend_runtime.engine.releases.RELEASES` ``env_switches``). HCCL_BUFFSIZE is the stage's value from
:mod:`ascend_runtime.planner.hccl_buffer` (its MC2 window + margin, or the stack's, refused below the window);
the intra-node pair follows :mod:`ascend_runtime.planner.hccl_pair` (PCIE=1 / ROCE=0 on A2, unset on A3).

- MLAPO (``VLLM_ASCEND_ENABLE_MLAPO``, 0.11) 1 on decode, 0 on prefill (W8A8 weights only; it costs memory);
- FlashComm1 (``VLLM_ASCEND_ENABLE_FLASHCOMM1``) on TP prefill where the release reads it as an env var
  (0.11; 0.23 takes ``enable_flashcomm1`` in --additional-config instead);
- 0.23 reads MLAPO and fused MC2 from ``--additional-config`` (``enable_mlapo``, ``enable_fused_mc2``;
  the env fallback is deprecated, vllm_ascend/ascend_config.py ``_get_config_value``):
  :func:`ascend_runtime.render.engine_args.additional_config` renders them, not this module;
- ``DYNAMIC_EPLB=true`` on a stage with EPLB (asserted by EplbConfig, vllm_ascend/ascend_config.py v0.23.0);
- ``VLLM_ENGINE_READY_TIMEOUT_S`` = the startup budget (``kubernetes.startup_probe_seconds``, default 3600 s)
  where vLLM reads it (0.23): with ``--api-server-count`` > 1 the API server processes start before the engines
  have loaded the weights and give up after it (vllm/v1/engine/core_client.py, vLLM v0.23.0; default 600 s,
  which vLLM-Ascend's own multi-node CI raises to 1800, tests/e2e/nightly/multi_node/scripts/run.sh v0.23.0).

The published recipes' other settings and why the kit differs from some of them: docs/rendering.md,
"Against the vLLM-Ascend v0.23.0 recipes".

Variables the engine does not read but CANN/HCCL, torch and torch_npu do are
listed in :data:`RUNTIME_ENV` with their reader; the conformance tests check
every other name against the release's surface.

``engine.extra_env`` is applied last and may override anything except the
variables the cross-checks rely on (:data:`PINNED`). Its plain strings are
values here; its Secret references (:mod:`ascend_runtime.config.secrets`) are
not: :func:`rank_env` leaves those variables out (the engine container's env
carries them as ``valueFrom.secretKeyRef``), :func:`secret_env_references`
lists them.
"""

from __future__ import annotations

from typing import Any

from ascend_runtime.config.secrets import env_references, plain_env
from ascend_runtime.engine.surface import load_surface
from ascend_runtime.planner.hccl_pair import IntraPath, intra_env
from ascend_runtime.planner.hccl_pair import hccl_intra as stage_intra
from ascend_runtime.planner.plan import Plan, RankPlan
from ascend_runtime.render.engine_args import connector, engine_release, fused_mc2_mode
from ascend_runtime.render.paths import ranktable_path
from ascend_runtime.render.ranktables import PD_TABLE

#: Variables read by CANN (HCCL, the runtime), torch or torch_npu rather than by vLLM / vLLM-Ascend,
#: with their reader (CANN HCCL environment variable reference; torch_npu docs; the v0.23.0 recipes).
RUNTIME_ENV = {
    "HCCL_IF_IP": "HCCL", "HCCL_SOCKET_IFNAME": "HCCL", "HCCL_BUFFSIZE": "HCCL", "HCCL_CONNECT_TIMEOUT": "HCCL",
    "HCCL_EXEC_TIMEOUT": "HCCL", "HCCL_OP_EXPANSION_MODE": "HCCL", "HCCL_INTRA_ROCE_ENABLE": "HCCL",
    "HCCL_INTRA_PCIE_ENABLE": "HCCL", "GLOO_SOCKET_IFNAME": "torch.distributed (gloo)",
    "TP_SOCKET_IFNAME": "torch_npu / HCCL", "OMP_PROC_BIND": "OpenMP", "OMP_NUM_THREADS": "OpenMP",
    "PYTORCH_NPU_ALLOC_CONF": "torch_npu", "TASK_QUEUE_ENABLE": "torch_npu", "ASCEND_RT_VISIBLE_DEVICES": "CANN runtime",
}

V1_SWITCH = "VLLM_USE_V1"
#: Seconds a front end waits for its engines' first ready message (vllm/envs.py, vLLM v0.23.0; absent in 0.11).
ENGINE_READY_TIMEOUT = "VLLM_ENGINE_READY_TIMEOUT_S"
#: Startup budget of an engine when the stack does not set ``kubernetes.startup_probe_seconds`` (s).
DEFAULT_STARTUP_TIMEOUT_S = 3600
OMP_NUM_THREADS = 10  # the published recipes' value
#: Variables that always follow the Plan; extra_env cannot change them.
PINNED = ("HCCL_IF_IP", "VLLM_HOST_IP", "ASCEND_RT_VISIBLE_DEVICES", "HCCL_INTRA_ROCE_ENABLE", "HCCL_INTRA_PCIE_ENABLE")


def startup_budget_s(plan: Plan) -> int:
    """Seconds an engine may take to load and come up: ``kubernetes.startup_probe_seconds`` or 3600.

    The same budget bounds the startup probe (Kubernetes), the headless ranks' wait for their leader (the
    launch scripts) and the engine's own wait for its cores (:data:`ENGINE_READY_TIMEOUT`).
    """
    kube = plan.config.get("kubernetes") or {}
    return int(kube.get("startup_probe_seconds") or DEFAULT_STARTUP_TIMEOUT_S)


def hccl_buffsize_mb(plan: Plan, role: str) -> int:
    """HCCL_BUFFSIZE of a stage (MB): the stage's override, else its MC2 window need with the kit's margin
    (:mod:`ascend_runtime.planner.hccl_buffer`)."""
    return plan.hccl_buffers[role].value_mb


def hccl_intra(plan: Plan, role: str) -> IntraPath | None:
    """``pcie``, ``roce`` or None (the pair unset, the A3 default): the HCCL path inside a node for a stage
    (:mod:`ascend_runtime.planner.hccl_pair`)."""
    return stage_intra(plan.config, role)


def moe_switches(plan: Plan, role: str) -> dict[str, str]:
    """Operator switches (env vars) for a stage on the Plan's hardware, as its release names them."""
    switches = engine_release(plan).env_switches
    w8a8 = plan.config["model"]["quantization"] == "w8a8"
    env: dict[str, str] = {}
    if "fused_mc2" in switches:
        env[switches["fused_mc2"]] = str(fused_mc2_mode(plan, role))
    if "mlapo" in switches and w8a8:
        env[switches["mlapo"]] = "1" if role == "decode" else "0"
    if "flashcomm1" in switches and role == "prefill":
        env[switches["flashcomm1"]] = "1" if int(plan.config["prefill"]["tp"]) > 1 else "0"
    if "dynamic_eplb" in switches and plan.config[role].get("eplb"):
        env[switches["dynamic_eplb"]] = "true"
    return env


def rank_env(plan: Plan, rank: RankPlan) -> dict[str, str]:
    """Every environment variable of a rank's engine process, sorted by name."""
    engine = plan.config["engine"]
    env: dict[str, str] = {
        "HCCL_IF_IP": rank.host_ip,
        # vLLM's own address (vllm/utils/network_utils.py get_ip, vLLM 0.23.0): unset, it is the interface of
        # the default route, which on a multi-NIC host (hostNetwork) need not be the Plan's host IP; the
        # Mooncake connector advertises it as its handshake host to the other stage (kv_p2p/mooncake_connector.py
        # side_channel_host = get_ip(), v0.23.0), and the NetworkPolicies admit the Plan's host IPs only
        "VLLM_HOST_IP": rank.host_ip,
        "HCCL_SOCKET_IFNAME": rank.nic,
        "GLOO_SOCKET_IFNAME": rank.nic,
        "TP_SOCKET_IFNAME": rank.nic,
        "HCCL_BUFFSIZE": str(hccl_buffsize_mb(plan, rank.role)),
        "HCCL_CONNECT_TIMEOUT": str(engine["hccl_connect_timeout_s"]),
        "HCCL_OP_EXPANSION_MODE": "AIV",
        # the pair as the release's recipes set it on the hardware: PCIE=1 / ROCE=0 on A2 (DeepSeek-R1.md and
        # DeepSeek-V3.1.md section 5.2, v0.23.0), neither on A3 (the A3 PD scripts of DeepSeek-V3.1.md section 5.3
        # and features/pd_disaggregation_mooncake_multi_node.md, v0.23.0); lines cited in planner/hccl_pair.py
        **intra_env(hccl_intra(plan, rank.role)),
        "OMP_PROC_BIND": "false",
        "OMP_NUM_THREADS": str(OMP_NUM_THREADS),
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "TASK_QUEUE_ENABLE": "1",
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(d) for d in rank.device_ids),
    }
    if connector(plan).needs_rank_table:
        env["DISAGGREGATED_PREFILL_RANK_TABLE_PATH"] = ranktable_path(PD_TABLE)
        rpc_env = engine_release(plan).llmdd_rpc_port_env
        if rpc_env:
            env[rpc_env] = str(plan.instance(rank.instance).llmdd_rpc_port)
    surface_env = load_surface(plan.vllm_ascend_version).env_vars
    if V1_SWITCH in surface_env:
        env[V1_SWITCH] = "1"  # the V1 engine switch, in vllm/envs.py up to 0.11; removed with V0 since
    if ENGINE_READY_TIMEOUT in surface_env:
        # vLLM v0.23.0 vllm/v1/engine/core_client.py: API server processes (--api-server-count > 1, started by
        # vllm/entrypoints/cli/serve.py run_multi_api_server before the engines are up) wait this long for the
        # engines' ready messages, i.e. for the weight load; the default 600 s is shorter than a DeepSeek-R1 load
        env[ENGINE_READY_TIMEOUT] = str(startup_budget_s(plan))
    env.update(moe_switches(plan, rank.role))
    for key, value in plain_env(engine.get("extra_env")).items():
        if key not in PINNED:
            env[key] = value
    for key in secret_env_references(plan):
        env.pop(key, None)  # the container env sets it from the Secret; a script export would override it
    return dict(sorted(env.items()))


def secret_env_references(plan: Plan) -> dict[str, dict[str, Any]]:
    """``engine.extra_env`` variables backed by a Secret: name -> reference (never a value), sorted."""
    refs = env_references(plan.config["engine"].get("extra_env"))
    return {k: refs[k] for k in sorted(refs) if k not in PINNED}


def secret_env_names(plan: Plan) -> list[str]:
    """Names of the Secret-backed engine variables (the launch scripts name them, export nothing)."""
    return list(secret_env_references(plan))
