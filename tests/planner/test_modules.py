"""Per-module degrees: each vLLM-Ascend 0.23.0 rule refused naming its key, memory per module, rendering.

Every rule names its source in the released code (vllm-project/vllm-ascend, tag v0.23.0, package vllm_ascend):
ascend_config.py FinegrainedTPConfig / AscendConfig.__init__, ops/linear_op.py, distributed/parallel_state.py.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.config.model import ModelShape
from ascend_runtime.config.stack import StageConfig
from ascend_runtime.engine.conformance import plan_violations
from ascend_runtime.planner import load_plan
from ascend_runtime.planner.modules import (
    ModuleDegrees,
    module_collectives,
    module_weight_bytes,
    weight_bytes_per_npu,
)
from ascend_runtime.render.engine_args import additional_config

NS = "ascend-deepseek:"


def edit(role: str, **stage: Any) -> Callable[[dict[str, Any]], None]:
    def apply(config: dict[str, Any]) -> None:
        section = config[NS + role]
        for key, value in stage.items():
            if key == "modules":
                section.setdefault("modules", {}).update(value)
            else:
                section[key] = value
    return apply


# (case, role, stage edits, refused key, fragment naming the rule's source)
RULES = [
    ("divides dp (ascend_config.py FinegrainedTPConfig)", "decode", {"modules": {"mlp_tp": 5}},
     "decode.modules.mlp_tp", "must divide decode.dp 32"),
    ("lm_head divides dp", "decode", {"modules": {"lm_head_tp": 3}}, "decode.modules.lm_head_tp", "FinegrainedTPConfig"),
    ("o_proj only on decode (FinegrainedTPConfig is_kv_consumer)", "prefill", {"modules": {"o_proj_tp": 2}},
     "prefill.modules.o_proj_tp", "KV consumer"),
    ("o_proj needs tp 1 (FinegrainedTPConfig)", "decode",
     {"dp": 16, "tp": 2, "modules": {"o_proj_tp": 8}}, "decode.modules.o_proj_tp", "tensor_parallel_size 1"),
    ("o_proj needs graph mode (FinegrainedTPConfig enforce_eager)", "decode",
     {"graph_mode": False, "modules": {"o_proj_tp": 8}}, "decode.modules.o_proj_tp", "graph mode"),
    ("o_proj needs the recompute scheduler (AscendConfig.__init__)", "decode",
     {"recompute_scheduler": False, "modules": {"o_proj_tp": 8}}, "decode.modules.o_proj_tp", "recompute_scheduler_enable"),
    ("embedding TP needs the recompute scheduler (AscendConfig.__init__)", "prefill",
     {"modules": {"embedding_tp": 2}}, "prefill.modules.embedding_tp", "recompute_scheduler_enable"),
    ("shared expert DP needs tp > 1 (AscendConfig.__init__)", "decode",
     {"modules": {"shared_expert_dp": True}}, "decode.modules.shared_expert_dp", "tensor_parallel_size > 1"),
]


@pytest.mark.parametrize("case,role,stage,key,fragment", RULES, ids=[r[0] for r in RULES])
def test_each_rule_refuses_the_stack_naming_the_key(stack_copy: Callable[..., Path], case: str, role: str,
                                                    stage: dict[str, Any], key: str, fragment: str) -> None:
    stacks = stack_copy("a2-staging", edit_config=edit(role, **stage))
    with pytest.raises(ConfigError) as err:
        load_plan("a2-staging", str(stacks))
    text = str(err.value)
    assert key in text and fragment in text, text
    assert "v0.23.0" in text  # the rule cites the release


def test_mlp_tp_needs_dense_layers(stack_copy: Callable[..., Path]) -> None:
    def no_dense(config: dict[str, Any]) -> None:
        config[NS + "model"]["num_dense_layers"] = 0
    stacks = stack_copy("a2-staging", edit_config=no_dense)
    with pytest.raises(ConfigError, match=r"decode\.modules\.mlp_tp.*linear_op\.py"):
        load_plan("a2-staging", str(stacks))


def test_release_without_finegrained_tp_refuses(stack_copy: Callable[..., Path]) -> None:
    def old(config: dict[str, Any]) -> None:
        config[NS + "engine"]["vllm_ascend_version"] = "0.11.0"
    stacks = stack_copy("a2-staging", edit_config=old)
    with pytest.raises(ConfigError) as err:
        load_plan("a2-staging", str(stacks))
    assert "decode.modules.mlp_tp" in str(err.value) and "0.11.0" in str(err.value)


def test_cli_exits_2_naming_the_key_and_advise_json_is_refused(stack_copy: Callable[..., Path]) -> None:
    stacks = stack_copy("a2-staging", edit_config=edit("decode", modules={"o_proj_tp": 8}, graph_mode=False))
    run = subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", "a2-staging",
                          "--stacks-dir", str(stacks)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "decode.modules.o_proj_tp" in run.stderr and "Traceback" not in run.stderr
    run = subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", "a2-staging", "--advise",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--advise" in run.stderr


def test_valid_module_layouts_plan_and_render_the_release_keys(stack_copy: Callable[..., Path]) -> None:
    stacks = stack_copy("a2-staging", edit_config=edit(
        "decode", modules={"o_proj_tp": 8, "lm_head_tp": 8, "embedding_tp": 4, "mlp_tp": 8}))
    plan = load_plan("a2-staging", str(stacks))
    extra = additional_config(plan, plan.by_role("decode")[0])
    assert extra["finegrained_tp_config"] == {"oproj_tensor_parallel_size": 8, "lmhead_tensor_parallel_size": 8,
                                              "embedding_tensor_parallel_size": 4, "mlp_tensor_parallel_size": 8}
    assert "finegrained_tp_config" not in additional_config(plan, plan.by_role("prefill")[0])
    assert plan_violations(plan) == []  # every key is in the 0.23.0 surface


def test_shared_expert_dp_renders_on_a_tp_prefill(stack_copy: Callable[..., Path]) -> None:
    stacks = stack_copy("a2-staging", edit_config=edit("prefill", modules={"shared_expert_dp": True}))
    plan = load_plan("a2-staging", str(stacks))
    assert additional_config(plan, plan.by_role("prefill")[0])["enable_shared_expert_dp"] is True
    assert plan_violations(plan) == []
    base = load_plan("a2-staging", str(stack_copy("a2-staging")))
    # the shared expert is replicated over TP8: (58 + 1 MTP) MoE layers x 44.0M x 1 B x 7/8 more per NPU
    more = plan.by_role("prefill")[0].memory.weights_gib - base.by_role("prefill")[0].memory.weights_gib
    assert more == pytest.approx(59 * 3 * 7168 * 2048 * 7 / 8 / 2**30, abs=0.02)


def test_a2_staging_uses_the_seed_decode_layout() -> None:
    plan = load_plan("a2-staging", None)
    assert plan.config["decode"]["modules"]["mlp_tp"] == 8
    extra = additional_config(plan, plan.by_role("decode")[0])
    assert extra["finegrained_tp_config"] == {"mlp_tensor_parallel_size": 8}


def test_weights_per_module_follow_the_degrees() -> None:
    m = ModelShape()
    uni = module_weight_bytes(m, 1, ModuleDegrees())
    mod = module_weight_bytes(m, 1, ModuleDegrees(o_proj_tp=8, lm_head_tp=8, embedding_tp=8, mlp_tp=8))
    assert uni["o_proj"] == 61 * 128 * 128 * 7168  # W8A8: 1 B per weight
    assert mod["o_proj"] == uni["o_proj"] / 8 and mod["dense_ffn"] == uni["dense_ffn"] / 8
    assert mod["lm_head"] == 129280 * 7168 * 2 / 8 and mod["attention"] == uni["attention"]
    # the release's measured savings (Fine_grained_TP.md, A2 DP32, TP 8): o_proj 5.8 GB, LM head / embedding 1.51 GB,
    # FFN 0.9 GB; the model's are within 20% of each
    saved = {k: (uni[k] - mod[k]) / 2**30 for k in ("o_proj", "lm_head", "embedding", "dense_ffn")}
    for k, measured in {"o_proj": 5.8, "lm_head": 1.51, "embedding": 1.51, "dense_ffn": 0.9}.items():
        assert saved[k] == pytest.approx(measured, rel=0.20), (k, saved[k])
    # and the whole-NPU figure the planner uses agrees with the per-module sum
    stage = StageConfig(dp=32, tp=1, ep=32, modules={"mlp_tp": 8})
    base = StageConfig(dp=32, tp=1, ep=32)
    assert weight_bytes_per_npu(m, base) - weight_bytes_per_npu(m, stage) == pytest.approx(
        uni["dense_ffn"] - mod["dense_ffn"])


def test_collectives_per_step() -> None:
    m = ModelShape()
    c = module_collectives(m, 1, ModuleDegrees(mlp_tp=8, o_proj_tp=4), tokens=72, sampled_tokens=72)
    by = {(x.module, x.op): x for x in c}
    assert by[("mlp", "all_gather")].count == 3 and by[("mlp", "all_gather")].bytes_sent == 7 * 72 * 7168 * 2
    assert by[("o_proj", "reduce_scatter")].count == 61 and by[("o_proj", "all_to_all")].group == 4
    assert module_collectives(m, 1, ModuleDegrees(), 72, 72) == []


def test_advise_ranks_the_seed_decode_layout_above_uniform_dp32() -> None:
    from ascend_runtime.planner.advise import advice_lines, seed_decode
    from ascend_runtime.planner.engine_rules import graph_mode_on, recompute_on
    from ascend_runtime.engine.releases import release
    from ascend_runtime.config.stack import StackConfig

    plan = load_plan("a2-staging", None)
    config = StackConfig.model_validate(plan.config, strict=False)
    row = release(plan.vllm_ascend_version)
    seed, uni = seed_decode(config, row.version, graph_mode_on(config, "decode"), recompute_on(config, row, "decode"))
    assert seed.modules == ModuleDegrees(mlp_tp=8) and uni.modules == ModuleDegrees() and seed.dp == uni.dp == 32
    assert seed.tokens_per_s_per_npu > uni.tokens_per_s_per_npu and seed.step_s < uni.step_s
    lines = advice_lines(plan)
    text = "\n".join(lines)
    assert "ranks above uniform DP32" in text and "% tokens/s per NPU" in text
    decode = lines[next(i for i, line in enumerate(lines) if line.startswith("decode:")):]
    table = [line for line in decode if line[:4].strip().isdigit()]
    tps = [float(line.split()[-2 if "(stack)" not in line else -3]) for line in table]
    assert tps == sorted(tps, reverse=True)  # best first (all fit HBM here)
    assert "ascend-deepseek:decode:" in text and "mlp_tp: 8" in text  # the YAML to paste


def test_micro_batching_is_refused_and_never_advised_where_the_release_resets_enable_dbo(
        stack_copy: Callable[..., Path]) -> None:
    """vLLM-Ascend v0.23.0 vllm_ascend/platform.py _fix_incompatible_config resets enable_dbo to False on Ascend."""
    from ascend_runtime.planner.advise import advice_lines, honours_micro_batching

    stacks = stack_copy("a2-staging", edit_config=edit("prefill", micro_batching=True))
    with pytest.raises(ConfigError) as err:
        load_plan("a2-staging", str(stacks))
    text = str(err.value)
    assert "prefill.micro_batching" in text and "--enable-dbo" in text and "platform.py" in text, text
    assert not honours_micro_batching("0.23.0")
    advice = "\n".join(advice_lines(load_plan("a2-staging", None)))
    assert "micro-batching" not in advice and "micro_batching: true" not in advice
