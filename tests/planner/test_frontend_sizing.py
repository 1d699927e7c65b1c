"""Decode's API server processes are sized from its output token target and the measured capacity of one
vLLM API server process (perf/frontend_capacity.py, planner/frontend_sizing.py)."""

from __future__ import annotations

import math

import pytest

from ascend_runtime.perf import frontend_capacity
from ascend_runtime.planner.frontend_sizing import check_front_end, decode_front_end


def _config(dp: int = 64, seqs: int = 96, tpot_ms: float = 50.0, count: int | None = None) -> dict:
    decode = {"instances": 4, "dp": dp, "max_num_seqs": seqs}
    if count is not None:
        decode["api_server_count"] = count
    return {"decode": decode, "slo": {"tpot_ms": tpot_ms}}


def test_the_target_is_every_slot_at_the_tpot_target_and_the_count_covers_it() -> None:
    front = decode_front_end(_config())
    assert front is not None
    assert front.streams == 6144 and front.target_tokens_per_s == pytest.approx(122_880)
    per = frontend_capacity.API_SERVER_TOKENS_PER_CPU_S * frontend_capacity.HOST_CORE_FACTOR \
        * frontend_capacity.TARGET_UTILISATION
    assert front.needed == math.ceil(122_880 / per) and front.count == front.needed
    assert front.count * front.tokens_per_server >= front.target_tokens_per_s  # one process never carries it
    assert front.margin >= 0
    assert "needed" in front.describe() and "--api-server-count" in front.describe()


def test_a_small_instance_needs_one_process() -> None:
    front = decode_front_end(_config(dp=1, seqs=8, tpot_ms=100))
    assert front is not None and front.needed == 1


def test_an_explicit_count_below_the_need_is_refused_naming_the_key_and_the_value_that_fits() -> None:
    need = decode_front_end(_config()).needed  # type: ignore[union-attr]
    (problem,) = check_front_end(_config(count=1))
    assert problem.path == "decode.api_server_count" and problem.value == 1
    assert f"to {need} or more" in problem.hint
    assert check_front_end(_config(count=need)) == []
    assert check_front_end(_config()) == []


def test_no_decode_stage_no_front_end() -> None:
    assert decode_front_end({"prefill": {"instances": 1}}) is None
    assert check_front_end({}) == []


@pytest.mark.parametrize("stack", ["cm384-prod", "a2-staging"])
def test_every_rendered_decode_leader_runs_the_api_servers_its_target_needs(stack: str) -> None:
    """The launch line of each decode leader carries --api-server-count covering its target: an instance
    whose target exceeds one process's capacity never renders one."""
    from ascend_runtime.planner import load_plan
    from ascend_runtime.render.engine_args import api_server_count

    plan = load_plan(stack, "stacks")
    front = decode_front_end(plan.config)
    assert front is not None and front.target_tokens_per_s > front.tokens_per_server  # one cannot carry it
    for inst in plan.by_role("decode"):
        count = api_server_count(plan, inst)
        assert count is not None and count >= front.needed >= 2
        assert count * front.tokens_per_server >= front.target_tokens_per_s


def test_a_stack_with_too_few_decode_api_servers_is_refused(tmp_path) -> None:
    import shutil

    from ascend_runtime.config.errors import ConfigError
    from ascend_runtime.planner import load_plan

    stacks = tmp_path / "stacks"
    shutil.copytree("stacks", stacks)
    path = stacks / "Pulumi.cm384-prod.yaml"
    path.write_text(path.read_text().replace("    max_num_seqs: 96\n", "    max_num_seqs: 96\n    api_server_count: 2\n", 1))
    with pytest.raises(ConfigError) as refused:
        load_plan("cm384-prod", str(stacks))
    assert "decode.api_server_count" in str(refused.value) and "22 or more" in str(refused.value)


def test_rank_serving_sizes_each_ranks_own_front_end() -> None:
    """With an API server per DP rank, the target is one rank's slots, not the instance's."""
    whole = decode_front_end(_config(dp=64, seqs=96, tpot_ms=50))
    per_rank = decode_front_end({**_config(dp=64, seqs=96, tpot_ms=50), "serving": "rank"})
    assert whole is not None and per_rank is not None
    assert per_rank.per_rank and per_rank.streams == 96 and per_rank.target_tokens_per_s == pytest.approx(1920)
    assert per_rank.needed == 1 < whole.needed
    assert "per DP rank" in per_rank.describe()
    # a rank whose own target exceeds one process still gets more than one
    heavy = decode_front_end({**_config(dp=2, seqs=4096, tpot_ms=50), "serving": "rank"})
    assert heavy is not None and heavy.needed > 1
    (problem,) = check_front_end({**_config(dp=2, seqs=4096, tpot_ms=50, count=1), "serving": "rank"})
    assert problem.path == "decode.api_server_count" and "DP rank" in problem.message


def test_a_decode_rank_that_needs_more_than_one_process_renders_them(tmp_path) -> None:
    """Under rank serving a rank's own front end is sized, and rendered when one process cannot carry it."""
    import shutil

    import yaml

    from ascend_runtime.planner import load_plan
    from ascend_runtime.render.engine_args import rank_serving_command

    stacks = tmp_path / "stacks"
    shutil.copytree("stacks", stacks)
    path = stacks / "Pulumi.cm384-prod.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["ascend-deepseek:serving"] = "rank"
    doc["config"].setdefault("ascend-deepseek:slo", {})["tpot_ms"] = 5  # 96 streams x 200 tok/s: over one process
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    plan = load_plan("cm384-prod", str(stacks))
    front = decode_front_end(plan.config)
    assert front is not None and front.per_rank and front.count > 1
    rank = plan.by_role("decode")[0].ranks[0]
    argv = rank_serving_command(plan, rank, rank.dp_start_rank, rank.api_ports[0])
    assert argv[argv.index("--api-server-count") + 1] == str(front.count)
    prefill = plan.by_role("prefill")[0].ranks[0]
    assert "--api-server-count" not in rank_serving_command(plan, prefill, prefill.dp_start_rank, prefill.api_ports[0])
