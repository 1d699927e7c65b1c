"""HCCL_BUFFSIZE as a Plan rule: the MC2 dispatch/combine window of each stage, the rendered value that
covers it, and the refusal of an explicit value below it (planner/hccl_buffer.py).

The expected windows are written out here from the torch_npu ``npu_moe_distribute_dispatch_v2`` API page
(Ascend/op-plugin docs/context/torch_npu-npu_moe_distribute_dispatch_v2.md, "HCCL_BUFFSIZE"), apart from the
module, so that a slip in the module's arithmetic shows.
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner import Plan, load_plan
from ascend_runtime.planner.hccl_buffer import (
    MARGIN,
    PUBLISHED_MB,
    ROUND_MB,
    check_hccl_buffers,
    mc2_tokens_per_die,
    stage_buffer,
)
from ascend_runtime.render.environment import rank_env

ROOT = Path(__file__).resolve().parents[2]
NS = "ascend-deepseek:"
#: Every committed stack.
STACKS = tuple(sorted(p.name[len("Pulumi."):-len(".yaml")] for p in (ROOT / "stacks").glob("Pulumi.*.yaml")))
MB = 2**20
H = 7168  # DeepSeek-V3/R1 hidden size; a token slot is 2H bytes (bf16 combine)


def a3_need(bs: int, ep: int, local: int, k: int = 8) -> int:
    """A3 ("fullmesh_v1"): 2 x (L x BS x EP x align512(align32(2H) + 64) + (K + 1) x BS x align512(2H)), MB up."""
    slot = -(-(2 * H + 64) // 512) * 512  # 2H = 14336 is a multiple of 32 and of 512
    return -(-2 * (local * bs * ep * slot + (k + 1) * bs * 2 * H) // MB)


def a2_hierarchy_need(bs: int, experts: int, k: int = 8) -> int:
    """A2 hierarchy: E x BS x (2H + 4 x align8(K) x 4) + 4 MB + 100 MB, MB up."""
    return -(-(experts * bs * (2 * H + 4 * 8 * 4) + 104 * MB) // MB)


def a2_fullmesh_need(bs: int, ep: int, local: int, k: int = 8) -> int:
    """A2 full mesh: 2 x (BS x EP x min(L, K) x 2H + 2 MB), MB up."""
    return -(-2 * (bs * ep * min(local, k) * 2 * H + 2 * MB) // MB)


def kit_value(need_mb: int, role: str) -> int:
    """The documented value: need + 25%, up to a multiple of 16 MB, at least the recipes' 256 / 1024."""
    return max({"prefill": 256, "decode": 1024}[role], math.ceil(math.ceil(need_mb * 1.25) / 16) * 16)


#: (stack, role) -> (tokens per die, MC2 window need in MB) for the committed stacks, from their keys:
#: decode max_num_seqs x (1 + 1 MTP token) / tp, prefill max_num_seqs x (1 + MTP) / tp (its MC2 steps).
EXPECTED = {
    ("cm384-prod", "decode"): (192, a3_need(192, 64, 4)),           # 96 seqs x 2, EP64, 256 / 64 experts
    ("cm384-prod", "prefill"): (4, a3_need(4, 16, 17)),             # 16 x 2 / tp 8, EP16, 272 / 16 experts
    ("a2-staging", "decode"): (144, a2_hierarchy_need(144, 256)),   # 72 x 2, PCIE=1 / ROCE=0 on A2
    ("a2-staging", "prefill"): (4, a2_hierarchy_need(4, 272)),
    ("local", "decode"): (72, a2_hierarchy_need(72, 256)),
    ("kind", "decode"): (8, a2_hierarchy_need(8, 256)),             # 32 seqs / tp 4
}


def test_expected_windows_by_hand() -> None:
    """The hand figures the module must reproduce (MB): cm384-prod decode outgrows the recipes' 1024."""
    assert (MARGIN, ROUND_MB, PUBLISHED_MB) == (0.25, 16, {"prefill": 256, "decode": 1024})  # as docs/rendering.md
    assert EXPECTED[("cm384-prod", "decode")][1] == 1440 and kit_value(1440, "decode") == 1808
    assert EXPECTED[("a2-staging", "decode")][1] == 613 and kit_value(613, "decode") == 1024
    assert EXPECTED[("cm384-prod", "prefill")][1] == 32 and EXPECTED[("a2-staging", "prefill")][1] == 120


@pytest.mark.parametrize(("stack", "role"), sorted(EXPECTED))
def test_window_of_committed_stacks(plans: dict[str, Plan], stack: str, role: str) -> None:
    tokens, need = EXPECTED[(stack, role)]
    buf = plans[stack].hccl_buffers[role]
    assert buf.window is not None and buf.window.tokens_per_die == tokens
    assert buf.need_mb == need
    assert buf.value_mb == kit_value(need, role) == buf.fitting_mb


@pytest.mark.parametrize("stack", STACKS)
def test_rendered_value_covers_the_need_on_every_rank(stack: str) -> None:
    """Every rank of every committed stack renders HCCL_BUFFSIZE >= its stage's MC2 window (with the margin
    when the stack sets none)."""
    plan = load_plan(stack)
    for rank in plan.ranks:
        buf = plan.hccl_buffers[rank.role]
        rendered = int(rank_env(plan, rank)["HCCL_BUFFSIZE"])
        assert rendered == buf.value_mb >= buf.need_mb, (stack, rank.name)
        if buf.explicit_mb is None:
            assert rendered >= buf.need_mb * (1 + MARGIN), (stack, rank.name)
    decode = plan.hccl_buffers["decode"]
    if (stack, "decode") in EXPECTED:
        assert decode.need_mb == EXPECTED[(stack, "decode")][1]


def _plan_cli(stacks: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", name, "--stacks-dir", str(stacks)],
                          capture_output=True, text=True, timeout=120)


def _set_decode(**values: Any) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        config[NS + "decode"].update(values)

    return edit


def test_decode_below_its_window_is_refused_naming_the_key_and_the_value(stack_copy: Callable[..., Path]) -> None:
    """cm384-prod's decode (192 tokens per die, EP64) with the recipes' 1024 MB: exit 2 naming
    decode.hccl_buffsize_mb, the need and the value that fits."""
    stacks = stack_copy("cm384-prod", edit_config=_set_decode(hccl_buffsize_mb=1024))
    result = _plan_cli(stacks, "cm384-prod")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "decode.hccl_buffsize_mb:" in result.stderr and "(got 1024)" in result.stderr, result.stderr
    assert "1440 MB" in result.stderr and "set it to 1808" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(ConfigError) as info:
        load_plan("cm384-prod", stacks)
    assert [p.path for p in info.value.problems] == ["decode.hccl_buffsize_mb"]


def test_explicit_value_at_the_need_is_kept(edited_plan: Callable[..., Plan]) -> None:
    plan = edited_plan("cm384-prod", lambda c: c["decode"].update(hccl_buffsize_mb=1440))
    decode = plan.by_role("decode")[0].ranks[0]
    assert rank_env(plan, decode)["HCCL_BUFFSIZE"] == "1440"


def test_more_sequences_grow_the_window_past_an_explicit_value(edited_plan: Callable[..., Plan]) -> None:
    """a2-staging decode on the full-mesh layout with 1100 MB set: fits at 72 sequences x 2 tokens (1012 MB),
    refused at 80 x 2 (1124 MB), naming the value that fits."""
    edited_plan("a2-staging", lambda c: c["decode"].update(hccl_intra="roce", hccl_buffsize_mb=1100))
    with pytest.raises(ConfigError) as info:
        edited_plan("a2-staging", lambda c: c["decode"].update(hccl_intra="roce", hccl_buffsize_mb=1100, max_num_seqs=80))
    (problem,) = [p for p in info.value.problems if p.path == "decode.hccl_buffsize_mb"]
    need = a2_fullmesh_need(160, 32, 8)
    assert need == 1124 and f"{need} MB" in problem.message and problem.value == 1100
    assert f"set it to {kit_value(need, 'decode')}" in problem.hint


def test_the_a2_full_mesh_layout_follows_the_pair(edited_plan: Callable[..., Plan]) -> None:
    """hccl_intra roce on A2: no hierarchical MC2, so the full-mesh rule (min(L, K) per token per rank)."""
    plan = edited_plan("a2-staging", lambda c: c["decode"].update(hccl_intra="roce"))
    buf = plan.hccl_buffers["decode"]
    assert buf.window is not None and buf.window.layout == "a2-fullmesh"
    assert buf.need_mb == a2_fullmesh_need(144, 32, 8) == 1012 and buf.value_mb == kit_value(1012, "decode") == 1280


def test_tokens_per_die_follow_the_engine(plans: dict[str, Plan]) -> None:
    """Largest listed graph when graph_capture_sizes is set; the 512 cap per TP rank; eager prefill's uniform
    decode step over tp (vllm_ascend/ascend_forward_context.py set_mc2_tokens_capacity, v0.23.0)."""
    config = plans["cm384-prod"].config
    assert mc2_tokens_per_die(config, "prefill") == 4
    sized = {**config, "decode": {**config["decode"], "graph_capture_sizes": [8, 64, 128]}}
    assert mc2_tokens_per_die(sized, "decode") == 128
    many = {**config, "decode": {**config["decode"], "max_num_seqs": 400}}
    assert mc2_tokens_per_die(many, "decode") == 512


def test_no_expert_parallelism_has_no_window(plans: dict[str, Plan]) -> None:
    config = plans["a2-staging"].config
    flat = {**config, "decode": {**config["decode"], "ep": 1, "hccl_buffsize_mb": 64}}
    buf = stage_buffer(flat, "decode")
    assert buf.window is None and buf.need_mb == 0 and buf.value_mb == 64 and "ep 1" in buf.no_window
    assert check_hccl_buffers(flat) == []


@pytest.mark.parametrize(("stack", "lines"), [
    ("cm384-prod", ("HCCL_BUFFSIZE decode: 1808 MB", "MC2 window 1440 MB", "HCCL_BUFFSIZE prefill: 256 MB")),
    ("a2-staging", ("HCCL_BUFFSIZE decode: 1024 MB", "MC2 window 613 MB", "MC2 window 120 MB")),
])
def test_plan_prints_the_need_and_the_value(stack: str, lines: tuple[str, ...]) -> None:
    result = subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", stack],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    for line in lines:
        assert line in result.stdout, result.stdout
