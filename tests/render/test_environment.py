"""HCCL / runtime environment per rank, cross-checked against the rank tables and the Plan."""

from __future__ import annotations

import pytest

from ascend_runtime.planner import Plan
from ascend_runtime.render.engine_args import additional_config
from ascend_runtime.render.environment import PINNED, rank_env
from ascend_runtime.render.ranktables import PD_TABLE, instance_table_name, rank_tables

STACKS = ("a2-staging", "cm384-prod", "kind", "local")


@pytest.mark.parametrize("stack", STACKS)
def test_table_env_and_plan_agree_for_every_rank(plans: dict[str, Plan], stack: str) -> None:
    """Devices in the rank's table entry == ASCEND_RT_VISIBLE_DEVICES == Plan; HCCL_IF_IP == server_id == node IP."""
    plan = plans[stack]
    tables = rank_tables(plan)
    node_ip = {n.name: n.host_ip for n in plan.nodes}
    for rank in plan.ranks:
        env = rank_env(plan, rank)
        visible = [int(x) for x in env["ASCEND_RT_VISIBLE_DEVICES"].split(",")]
        assert visible == list(rank.device_ids)
        assert env["HCCL_IF_IP"] == rank.host_ip == node_ip[rank.node]
        table = tables[instance_table_name(rank.instance)]
        (server,) = [s for s in table["server_list"] if s["server_id"] == env["HCCL_IF_IP"]]
        assert [int(d["device_id"]) for d in server["device"]] == visible
        assert [d["device_ip"] for d in server["device"]] == [d.device_ip for d in rank.devices]
        if PD_TABLE in tables:
            listed = [
                int(d["device_id"])
                for d in tables[PD_TABLE][f"{rank.role}_device_list"]
                if d["server_id"] == env["HCCL_IF_IP"]
            ]
            assert listed == visible


@pytest.mark.parametrize("stack", STACKS)
def test_hccl_basics(plans: dict[str, Plan], stack: str) -> None:
    plan = plans[stack]
    for rank in plan.ranks:
        env = rank_env(plan, rank)
        for key in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            assert env[key] == rank.nic
        assert env["HCCL_BUFFSIZE"] == str(plan.hccl_buffers[rank.role].value_mb)  # tests/planner/test_hccl_buffer.py
        assert env["HCCL_CONNECT_TIMEOUT"] == str(plan.config["engine"]["hccl_connect_timeout_s"])
        assert env["HCCL_OP_EXPANSION_MODE"] == "AIV"
        assert env["OMP_PROC_BIND"] == "false" and int(env["OMP_NUM_THREADS"]) > 0
        assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
        assert env["TASK_QUEUE_ENABLE"] == "1"
        assert "VLLM_USE_V1" not in env  # vLLM 0.23 has no V0 engine and no such switch (vllm/envs.py)
        assert ("DYNAMIC_EPLB" in env) == bool(plan.config[rank.role].get("eplb"))
        assert list(env) == sorted(env)


def test_llmdatadist_env_names_on_0_11(plans: dict[str, Plan], edited_plan) -> None:
    plan = edited_plan("a2-staging", lambda c: (
        c["engine"].update(vllm_ascend_version="0.11.0", kv_connector="llmdatadist"),
        c["prefill"].pop("eplb"),
        c["decode"].update(max_num_batched_tokens=256),
        c["decode"].pop("modules", None),  # finegrained_tp_config is 0.23-only (planner/modules.py)
    ))
    env = rank_env(plan, plan.ranks[0])
    assert env["DISAGGREGATED_PREFILL_RANK_TABLE_PATH"] == "/etc/ascend-deploy/ranktables/pd-llmdatadist.json"
    assert env["VLLM_ASCEND_LLMDD_RPC_PORT"] == str(plan.instances[0].llmdd_rpc_port)
    assert env["VLLM_USE_V1"] == "1"  # still read by vLLM 0.11 (vllm/envs.py)
    mooncake = rank_env(plans["cm384-prod"], plans["cm384-prod"].ranks[0])
    assert not {"DISAGGREGATED_PREFILL_RANK_TABLE_PATH", "VLLM_ASCEND_LLMDD_RPC_PORT"} & set(mooncake)


def test_overrides_buffsize_intra_and_extra_env(edited_plan) -> None:
    def edit(cfg):
        cfg["decode"].update(hccl_buffsize_mb=1100, hccl_intra="roce")  # full-mesh MC2 window: 1012 MB
        cfg["engine"]["extra_env"] = {"HCCL_EXEC_TIMEOUT": "204", "HCCL_IF_IP": "10.0.0.1", "HCCL_OP_EXPANSION_MODE": "HOST",
                                      "HCCL_INTRA_ROCE_ENABLE": "0"}

    plan = edited_plan("a2-staging", edit)
    decode = rank_env(plan, plan.by_role("decode")[0].ranks[1])
    prefill = rank_env(plan, plan.by_role("prefill")[0].ranks[0])
    assert decode["HCCL_BUFFSIZE"] == "1100" and prefill["HCCL_BUFFSIZE"] == "256"
    assert (decode["HCCL_INTRA_ROCE_ENABLE"], decode["HCCL_INTRA_PCIE_ENABLE"]) == ("1", "0")
    assert (prefill["HCCL_INTRA_ROCE_ENABLE"], prefill["HCCL_INTRA_PCIE_ENABLE"]) == ("0", "1")
    assert decode["HCCL_EXEC_TIMEOUT"] == "204" and decode["HCCL_OP_EXPANSION_MODE"] == "HOST"
    assert decode["HCCL_IF_IP"] != "10.0.0.1" and "HCCL_IF_IP" in PINNED


def test_hccl_intra_pair_per_hardware_kind(plans: dict[str, Plan], edited_plan) -> None:
    """The pair as the vLLM-Ascend v0.23.0 recipes set it (planner/hccl_pair.py cites the lines): A2 PCIE=1 /
    ROCE=0 (the A2 multi-node DP recipes), A3 neither (the A3 PD recipes), so that cm384 stays off the A2
    hierarchical-MC2 path (vllm_ascend/utils.py is_hierarchical_communication_enabled reads exactly these two).
    An explicit ``<stage>.hccl_intra`` renders the pair on either kind; extra_env cannot set it."""
    pair = ("HCCL_INTRA_PCIE_ENABLE", "HCCL_INTRA_ROCE_ENABLE")
    for stack in ("a2-staging", "local", "kind"):
        for rank in plans[stack].ranks:
            env = rank_env(plans[stack], rank)
            assert (env[pair[0]], env[pair[1]]) == ("1", "0"), (stack, rank.name)
    for rank in plans["cm384-prod"].ranks:
        assert not set(pair) & set(rank_env(plans["cm384-prod"], rank)), rank.name

    def edit(cfg):
        cfg["decode"]["hccl_intra"] = "roce"
        cfg["engine"]["extra_env"] = {"HCCL_INTRA_PCIE_ENABLE": "1"}

    plan = edited_plan("cm384-prod", edit)
    decode = rank_env(plan, plan.by_role("decode")[0].ranks[0])
    prefill = rank_env(plan, plan.by_role("prefill")[0].ranks[0])
    assert (decode[pair[0]], decode[pair[1]]) == ("0", "1")
    assert not set(pair) & set(prefill)  # the pinned pair stays unset; extra_env does not reach it


def test_eplb_stage_sets_env_on_its_ranks_only(plans: dict[str, Plan]) -> None:
    plan = plans["cm384-prod"]  # prefill has eplb, decode has none
    for rank in plan.ranks:
        assert rank_env(plan, rank).get("DYNAMIC_EPLB") == ("true" if rank.role == "prefill" else None)


def test_operator_switches_per_release(plans: dict[str, Plan], edited_plan) -> None:
    """0.23 reads MLAPO and fused MC2 from --additional-config (the env fallback is deprecated,
    ascend_config.py _get_config_value) and consults fused MC2 only on A3 (ascend_forward_context.py
    _select_a3_moe_comm_method; the A2 selection ignores it), so: A2 none, A3 decode 2."""
    for stack, fused_decode in (("a2-staging", None), ("cm384-prod", 2)):
        plan = plans[stack]
        for inst in plan.instances:
            extra = additional_config(plan, inst)
            assert extra["enable_mlapo"] is (inst.role == "decode"), (stack, inst.name)
            assert extra.get("enable_fused_mc2") == (fused_decode if inst.role == "decode" else None), (stack, inst.name)
            for rank in inst.ranks:
                env = rank_env(plan, rank)
                assert not {"VLLM_ASCEND_ENABLE_FUSED_MC2", "VLLM_ASCEND_ENABLE_MLAPO",
                            "VLLM_ASCEND_ENABLE_FLASHCOMM1"} & set(env), (stack, rank.name)
    old = edited_plan("a2-staging", lambda c: (
        c["engine"].update(vllm_ascend_version="0.11.0"), c["prefill"].pop("eplb"),
        c["decode"].update(max_num_batched_tokens=256), c["decode"].pop("modules", None),  # 0.23-only keys
    ))
    for rank in old.ranks:  # 0.11 has no fused MC2 switch; FlashComm1 is an env var there
        env = rank_env(old, rank)
        assert "VLLM_ASCEND_ENABLE_FUSED_MC2" not in env
        assert env["VLLM_ASCEND_ENABLE_MLAPO"] == ("1" if rank.role == "decode" else "0")  # env only in 0.11
        if rank.role == "prefill":
            assert env["VLLM_ASCEND_ENABLE_FLASHCOMM1"] == "1"
    assert all("enable_mlapo" not in additional_config(old, inst) for inst in old.instances)


def test_engine_ready_timeout_is_the_startup_budget(plans: dict[str, Plan], edited_plan) -> None:
    """vLLM v0.23.0 API server processes (--api-server-count > 1) wait VLLM_ENGINE_READY_TIMEOUT_S (default 600 s,
    vllm/v1/engine/core_client.py) for engines that are still loading: the kit gives them its startup budget."""
    for stack in ("a2-staging", "cm384-prod"):
        plan = plans[stack]
        budget = plan.config["kubernetes"]["startup_probe_seconds"]
        assert {rank_env(plan, r)["VLLM_ENGINE_READY_TIMEOUT_S"] for r in plan.ranks} == {str(budget)}
    assert plans["a2-staging"].config["kubernetes"]["startup_probe_seconds"] != \
        plans["cm384-prod"].config["kubernetes"]["startup_probe_seconds"]  # so the value follows the stack
    longer = edited_plan("a2-staging", lambda c: (
        c["kubernetes"].update(startup_probe_seconds=7000),
        c["engine"].update(extra_env={"VLLM_ENGINE_READY_TIMEOUT_S": "900"}),
    ))
    assert rank_env(longer, longer.ranks[0])["VLLM_ENGINE_READY_TIMEOUT_S"] == "900"  # extra_env still wins
    old = edited_plan("a2-staging", lambda c: (
        c["engine"].update(vllm_ascend_version="0.11.0"), c["prefill"].pop("eplb"),
        c["decode"].update(max_num_batched_tokens=256), c["decode"].pop("modules", None),
    ))
    assert all("VLLM_ENGINE_READY_TIMEOUT_S" not in rank_env(old, r) for r in old.ranks)  # not in vLLM 0.11
