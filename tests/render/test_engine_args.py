"""Engine launch lines against the published recipes (facts file, section 2)."""

from __future__ import annotations

import json

import pytest

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner import Plan
from ascend_runtime.render.engine_args import engine_command


def flags(argv: list[str]) -> dict[str, str | bool]:
    """``--flag value`` / ``--switch`` pairs of an argv after ``vllm serve MODEL``."""
    out: dict[str, str | bool] = {}
    rest = argv[3:]
    i = 0
    while i < len(rest):
        key = rest[i]
        assert key.startswith("--"), key
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out[key] = rest[i + 1]
            i += 2
        else:
            out[key] = True
            i += 1
    return out


def test_recipe_a2_4_nodes_mooncake(plans: dict[str, Plan]) -> None:
    """Recipe followed: DeepSeek-R1 W8A8 on 4 A2 nodes, prefill DP2-TP8-EP16, decode DP4-TP4-EP16, with the
    Mooncake kv-transfer-config and FULL_DECODE_ONLY decode graphs of vllm-ascend v0.23.0
    (docs/source/tutorials/models/DeepSeek-V3.1.md, "Multi-Node PD Separation"). The kind stack has that shape."""
    plan = plans["kind"]
    p0, p1 = plan.by_role("prefill")[0].ranks
    d0, d1 = plan.by_role("decode")[0].ranks
    fp0, fp1, fd0, fd1 = (flags(engine_command(plan, r)) for r in (p0, p1, d0, d1))
    assert engine_command(plan, p0)[:2] == ["vllm", "serve"]
    for f in (fp0, fp1):
        assert (f["--data-parallel-size"], f["--data-parallel-size-local"], f["--tensor-parallel-size"]) == ("2", "1", "8")
        assert f["--enable-expert-parallel"] is True and f["--enforce-eager"] is True
        assert f["--data-parallel-address"] == p0.host_ip and f["--trust-remote-code"] is True
        kv = json.loads(str(f["--kv-transfer-config"]))
        assert kv["kv_connector"] == "MooncakeConnectorV1" and kv["kv_role"] == "kv_producer"
        # no module path: vLLM 0.23.0 would look "MooncakeConnectorV1" up as a class in it (conformance.py)
        assert "kv_connector_module_path" not in kv
        assert kv["kv_connector_extra_config"] == {"prefill": {"dp_size": 2, "tp_size": 8}, "decode": {"dp_size": 4, "tp_size": 4}}
        assert json.loads(str(f["--additional-config"]))["enable_flashcomm1"] is True
    assert "--headless" not in fp0 and "--data-parallel-start-rank" not in fp0 and fp0["--api-server-count"] == "1"
    assert fp1["--headless"] is True and fp1["--data-parallel-start-rank"] == "1" and "--port" not in fp1
    assert fp0["--data-parallel-rpc-port"] == fp1["--data-parallel-rpc-port"]
    for f in (fd0, fd1):
        assert (f["--data-parallel-size"], f["--data-parallel-size-local"], f["--tensor-parallel-size"]) == ("4", "2", "4")
        assert "--enforce-eager" not in f
        assert json.loads(str(f["--compilation-config"])) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
        extra = json.loads(str(f["--additional-config"]))
        assert extra["recompute_scheduler_enable"] is True and extra["weight_nz_mode"] == 1
        assert json.loads(str(f["--kv-transfer-config"]))["kv_role"] == "kv_consumer"
        assert f["--data-parallel-address"] == d0.host_ip
    assert fd1["--headless"] is True and fd1["--data-parallel-start-rank"] == "2"


def test_llmdatadist_dialect_on_0_11(edited_plan) -> None:
    """0.11.0 still ships LLMDataDistCMgrConnector (vllm_ascend/distributed/__init__.py, v0.11.0): torchair graphs,
    the PD rank table env and the RPC port env under 0.11's names."""
    plan = edited_plan("kind", lambda c: c["engine"].update(vllm_ascend_version="0.11.0", kv_connector="llmdatadist"))
    d0 = plan.by_role("decode")[0].ranks[0]
    f = flags(engine_command(plan, d0))
    kv = json.loads(str(f["--kv-transfer-config"]))
    assert kv["kv_connector"] == "LLMDataDistCMgrConnector"
    assert "kv_connector_module_path" not in kv
    assert "kv_connector_extra_config" not in kv
    assert json.loads(str(f["--additional-config"]))["torchair_graph_config"] == {"enabled": True}
    assert "--compilation-config" not in f


def test_recipe_large_ep_a3_mooncake(plans: dict[str, Plan]) -> None:
    """Recipe followed: "Large-EP recipe on A3: prefill DP2/TP8/EP16, decode DP64/TP1/EP64,
    HCCL_BUFFSIZE=1024 decode, 256 prefill" (facts file section 2), with the Mooncake
    kv-transfer-config of the vllm-ascend multi-node PD guide. cm384-prod has that shape."""
    plan = plans["cm384-prod"]
    prefill = plan.by_role("prefill")[0]
    decode = plan.by_role("decode")[0]
    fp = flags(engine_command(plan, prefill.ranks[0]))
    assert (fp["--data-parallel-size"], fp["--data-parallel-size-local"], fp["--tensor-parallel-size"]) == ("2", "2", "8")
    assert fp["--quantization"] == "ascend" and fp["--enforce-eager"] is True
    # vLLM 0.23 rewrites "deepseek_mtp" to "mtp" with a deprecation warning (vllm/config/speculative.py)
    assert json.loads(str(fp["--speculative-config"])) == {"num_speculative_tokens": 1, "method": "mtp"}
    engine_ids = set()
    for k, rank in enumerate(decode.ranks):
        f = flags(engine_command(plan, rank))
        assert (f["--data-parallel-size"], f["--data-parallel-size-local"], f["--tensor-parallel-size"]) == ("64", "16", "1")
        assert f["--enable-expert-parallel"] is True
        assert ("--headless" in f) == (k > 0)
        if k:
            assert f["--data-parallel-start-rank"] == str(16 * k)
        kv = json.loads(str(f["--kv-transfer-config"]))
        assert kv["kv_connector"] == "MooncakeConnectorV1" and kv["kv_role"] == "kv_consumer"
        assert "kv_connector_module_path" not in kv
        assert kv["kv_connector_extra_config"] == {
            "prefill": {"dp_size": 2, "tp_size": 8},
            "decode": {"dp_size": 64, "tp_size": 1},
        }
        assert int(kv["kv_port"]) >= 36000  # 16-die nodes
        engine_ids.add(kv["engine_id"])
    all_ids = [json.loads(str(flags(engine_command(plan, r))["--kv-transfer-config"]))["engine_id"] for r in plan.ranks]
    assert len(all_ids) == len(set(all_ids)), "engine_id must be unique"


def test_mooncake_rejects_prefill_tp_below_decode_tp(edited_plan) -> None:
    with pytest.raises(ConfigError, match="prefill tp >= decode tp"):
        edited_plan("cm384-prod", lambda c: (c["prefill"].update(dp=8, tp=2), c["decode"].update(dp=16, tp=4)))


def test_mtp_and_quantization_follow_the_stack(plans: dict[str, Plan], edited_plan) -> None:
    kind = flags(engine_command(plans["kind"], plans["kind"].ranks[0]))  # mtp off in the kind stack
    assert "--speculative-config" not in kind and kind["--quantization"] == "ascend"
    a2 = flags(engine_command(plans["a2-staging"], plans["a2-staging"].ranks[0]))
    assert json.loads(str(a2["--speculative-config"]))["method"] == "mtp"  # 0.23; 0.11 keeps deepseek_mtp
    plan = edited_plan("kind", lambda c: c["engine"].update(extra_args=["--no-enable-prefix-caching"]))
    assert engine_command(plan, plan.ranks[0])[-1] == "--no-enable-prefix-caching"


@pytest.mark.parametrize("stack", ("a2-staging", "cm384-prod", "kind", "local"))
def test_kv_extra_config_own_side_is_the_instance_shape(plans: dict[str, Plan], stack: str) -> None:
    """vLLM-Ascend v0.23.0 vllm_ascend/utils.py ``check_kv_extra_config`` refuses to start a producer whose
    ``prefill`` (a consumer whose ``decode``) dp_size / tp_size differ from its own parallel config; the
    worker reads both sides (kv_p2p/mooncake_connector.py ``_get_prefill_decode_size``)."""
    plan = plans[stack]
    for rank in plan.ranks:
        inst = plan.instance(rank.instance)
        kv = json.loads(str(flags(engine_command(plan, rank))["--kv-transfer-config"]))
        extra = kv["kv_connector_extra_config"]
        assert extra[inst.role] == {"dp_size": inst.dp, "tp_size": inst.tp}, (stack, rank.name)
        assert set(extra) == {"prefill", "decode"} and extra["prefill"]["tp_size"] >= extra["decode"]["tp_size"]
        assert kv["kv_role"] == ("kv_producer" if inst.role == "prefill" else "kv_consumer")
