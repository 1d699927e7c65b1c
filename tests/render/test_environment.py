"""HCCL / runtime environment per rank, cross-checked against the rank tables and the Plan."""

from __future__ import annotations

import pytest

from ascend_runtime.planner import Plan
from ascend_runtime.render.environment import PINNED, rank_env
from ascend_runtime.render.ranktables import PD_TABLE, rank_tables, ranktables_for_rank

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
        table = tables[ranktables_for_rank(plan, rank)[0]]
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
        assert [env["HCCL_INTRA_ROCE_ENABLE"], env["HCCL_INTRA_PCIE_ENABLE"]].count("1") == 1
        assert {env["HCCL_INTRA_ROCE_ENABLE"], env["HCCL_INTRA_PCIE_ENABLE"]} == {"0", "1"}
        assert env["HCCL_BUFFSIZE"] == ("256" if rank.role == "prefill" else "1024")
        assert env["HCCL_CONNECT_TIMEOUT"] == str(plan.config["engine"]["hccl_connect_timeout_s"])
        assert env["HCCL_OP_EXPANSION_MODE"] == "AIV"
        assert env["OMP_PROC_BIND"] == "false" and int(env["OMP_NUM_THREADS"]) > 0
        assert env["PYTORCH_NPU_ALLOC_CONF"] == "expandable_segments:True"
        assert env["TASK_QUEUE_ENABLE"] == "1" and env["VLLM_USE_V1"] == "1"
        assert "DYNAMIC_EPLB" not in env
        assert list(env) == sorted(env)


def test_llmdatadist_env_names_per_version(plans: dict[str, Plan], edited_plan) -> None:
    plan = plans["a2-staging"]  # 0.9.1: VLLM_LLMDD_RPC_PORT
    env = rank_env(plan, plan.ranks[0])
    assert env["DISAGGREGATED_PREFILL_RANK_TABLE_PATH"] == "/etc/ascend-deploy/ranktables/pd-llmdatadist.json"
    assert env["VLLM_LLMDD_RPC_PORT"] == str(plan.instances[0].llmdd_rpc_port)
    newer = edited_plan("a2-staging", lambda c: c["engine"].update(vllm_ascend_version="0.10.1"))
    env = rank_env(newer, newer.ranks[0])
    assert "VLLM_LLMDD_RPC_PORT" not in env and env["VLLM_ASCEND_LLMDD_RPC_PORT"] == "5557"
    mooncake = rank_env(plans["cm384-prod"], plans["cm384-prod"].ranks[0])
    assert not {"DISAGGREGATED_PREFILL_RANK_TABLE_PATH", "VLLM_ASCEND_LLMDD_RPC_PORT"} & set(mooncake)


def test_overrides_buffsize_intra_and_extra_env(edited_plan) -> None:
    def edit(cfg):
        cfg["decode"].update(hccl_buffsize_mb=600, hccl_intra="roce")
        cfg["engine"]["extra_env"] = {"HCCL_EXEC_TIMEOUT": "204", "HCCL_IF_IP": "10.0.0.1", "HCCL_OP_EXPANSION_MODE": "HOST"}

    plan = edited_plan("a2-staging", edit)
    decode = rank_env(plan, plan.by_role("decode")[0].ranks[1])
    prefill = rank_env(plan, plan.by_role("prefill")[0].ranks[0])
    assert decode["HCCL_BUFFSIZE"] == "600" and prefill["HCCL_BUFFSIZE"] == "256"
    assert (decode["HCCL_INTRA_ROCE_ENABLE"], decode["HCCL_INTRA_PCIE_ENABLE"]) == ("1", "0")
    assert (prefill["HCCL_INTRA_ROCE_ENABLE"], prefill["HCCL_INTRA_PCIE_ENABLE"]) == ("0", "1")
    assert decode["HCCL_EXEC_TIMEOUT"] == "204" and decode["HCCL_OP_EXPANSION_MODE"] == "HOST"
    assert decode["HCCL_IF_IP"] != "10.0.0.1" and "HCCL_IF_IP" in PINNED


def test_dynamic_eplb_sets_env(edited_plan) -> None:
    plan = edited_plan("cm384-prod", lambda c: c["engine"].update(dynamic_eplb=True))
    assert all(rank_env(plan, r)["DYNAMIC_EPLB"] == "true" for r in plan.ranks)


def test_moe_switches_all2all_on_cm384(edited_plan) -> None:
    """All2All on CM384 where the version reads the switch (0.9.1 .. 0.10.0)."""
    plan = edited_plan(
        "cm384-prod", lambda c: c["engine"].update(vllm_ascend_version="0.9.1", kv_connector="llmdatadist")
    )
    for rank in plan.ranks:
        assert rank_env(plan, rank)["VLLM_ASCEND_ENABLE_MOE_ALL2ALL_SEQ"] == "1"


def test_moe_switches_fused_mc2_decode_and_mlapo_decode_only(plans: dict[str, Plan], edited_plan) -> None:
    a2 = edited_plan("a2-staging", lambda c: c["engine"].update(vllm_ascend_version="0.12.0", kv_connector="mooncake"))
    for rank in a2.ranks:
        env = rank_env(a2, rank)
        assert env["VLLM_ASCEND_ENABLE_FUSED_MC2"] == ("2" if rank.role == "decode" else "0")
        assert env["VLLM_ASCEND_ENABLE_MLAPO"] == ("1" if rank.role == "decode" else "0")
        assert "VLLM_ASCEND_ENABLE_MOE_ALL2ALL_SEQ" not in env
    cm = plans["cm384-prod"]  # 0.11.0 on all2all hardware: no fused MC2 anywhere, MLAPO on decode only
    for rank in cm.ranks:
        env = rank_env(cm, rank)
        assert env.get("VLLM_ASCEND_ENABLE_FUSED_MC2", "0") == "0"
        assert env["VLLM_ASCEND_ENABLE_MLAPO"] == ("1" if rank.role == "decode" else "0")
    old = plans["a2-staging"]  # 0.9.1 reads neither switch
    assert not {"VLLM_ASCEND_ENABLE_FUSED_MC2", "VLLM_ASCEND_ENABLE_MLAPO"} & set(rank_env(old, old.ranks[-1]))
