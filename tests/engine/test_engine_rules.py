"""Engine rules no surface shows (ascend_runtime.engine.releases, planner/engine_rules.py), one test each.

Each rule's upstream source is named in the module that models it; these tests
pin the numbers the released code computes.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.engine.releases import decode_graph_tokens
from ascend_runtime.planner import Plan
from ascend_runtime.render.engine_args import additional_config, engine_command
from ascend_runtime.render.environment import rank_env


def _paths(err: ConfigError) -> list[str]:
    return [p.path for p in err.problems]


def _arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# -- decode graph sizing ---------------------------------------------------------------------------------------------


def test_torchair_graph_rule_matches_upstream_numbers() -> None:
    """0.11.0 torchair, KV consumer with MTP: (n + ceil(n/16) + ceil(2n/256)) * 2 tokens."""
    assert decode_graph_tokens("0.11.0", 72, 1, True, "atlas-800i-a2", 1).tokens == 156
    assert decode_graph_tokens("0.11.0", 96, 1, True, "cm384", 1).tokens == 206
    assert decode_graph_tokens("0.11.0", 28, 1, True, "atlas-800i-a2", 1).tokens == 2 * (28 + 2 + 1)
    # on A3 with TP the size is rounded to a multiple of tp
    assert decode_graph_tokens("0.11.0", 30, 1, True, "cm384", 4).tokens % 4 == 0
    # no MTP: one graph of max_num_seqs
    assert decode_graph_tokens("0.11.0", 72, 0, True, "atlas-800i-a2", 1).tokens == 72


def test_aclgraph_rule_is_one_full_decode_step() -> None:
    assert decode_graph_tokens("0.23.0", 72, 1, True, "atlas-800i-a2", 1).tokens == 144
    assert decode_graph_tokens("0.23.0", 96, 1, True, "cm384", 1).tokens == 192


@pytest.mark.parametrize(("stack", "version", "seqs", "need"), [
    ("a2-staging", "0.23.0", 72, 144), ("cm384-prod", "0.23.0", 96, 192),
    ("a2-staging", "0.11.0", 72, 156), ("cm384-prod", "0.11.0", 96, 206),
])
def test_decode_token_budget_below_the_graph_is_refused(edited_plan, stack, version, seqs, need) -> None:
    """The stacks' old decode budget (tokens == seqs) crashes or halves decode; the planner refuses it."""

    def edit(cfg):
        cfg["engine"]["vllm_ascend_version"] = version
        cfg["decode"].update(max_num_seqs=seqs, max_num_batched_tokens=seqs)
        if version == "0.11.0":
            cfg["prefill"].pop("eplb", None)

    with pytest.raises(ConfigError) as err:
        edited_plan(stack, edit)
    problem = next(p for p in err.value.problems if p.path == "decode.max_num_batched_tokens")
    assert f"needs {need} tokens" in problem.message and str(need) in problem.hint


def test_committed_decode_budgets_fit_the_graph(plans: dict[str, Plan]) -> None:
    for plan in plans.values():
        stage = plan.config["decode"]
        need = decode_graph_tokens(plan.vllm_ascend_version, stage["max_num_seqs"], 1 if stage["mtp"] else 0, True,
                                   plan.hardware, stage["tp"]).tokens
        assert stage["max_num_batched_tokens"] >= need, plan.stack


def test_aclgraph_decode_renders_full_decode_only(plans: dict[str, Plan]) -> None:
    plan = plans["a2-staging"]
    decode = plan.by_role("decode")[0]
    argv = engine_command(plan, decode.ranks[0])
    assert json.loads(_arg(argv, "--compilation-config")) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert "--enforce-eager" not in argv
    prefill_argv = engine_command(plan, plan.by_role("prefill")[0].ranks[0])
    assert "--enforce-eager" in prefill_argv and "--compilation-config" not in prefill_argv


# -- image per hardware ----------------------------------------------------------------------------------------------


def test_image_follows_hardware(plans: dict[str, Plan]) -> None:
    assert plans["cm384-prod"].engine_image == "quay.io/ascend/vllm-ascend:v0.23.0-a3"
    assert plans["a2-staging"].engine_image == "quay.io/ascend/vllm-ascend:v0.23.0"


@pytest.mark.parametrize(("stack", "image"), [
    ("cm384-prod", "quay.io/ascend/vllm-ascend:v0.23.0"),
    ("a2-staging", "quay.io/ascend/vllm-ascend:v0.23.0-a3"),
    ("a2-staging", "quay.io/ascend/vllm-ascend:v0.11.0"),
])
def test_wrong_image_is_refused(edited_plan, stack, image) -> None:
    with pytest.raises(ConfigError) as err:
        edited_plan(stack, lambda c: c["engine"].update(image=image))
    assert "engine.image" in _paths(err.value)


# -- redundant experts reach the engine ------------------------------------------------------------------------------


def test_redundant_experts_reach_0_23_through_dynamic_eplb(plans: dict[str, Plan]) -> None:
    plan = plans["cm384-prod"]
    for inst in plan.instances:
        extra = additional_config(plan, inst)
        env = rank_env(plan, inst.ranks[0])
        if inst.redundant_experts:
            assert extra["eplb_config"]["num_redundant_experts"] == inst.redundant_experts
            assert extra["eplb_config"]["dynamic_eplb"] is True
            assert extra["eplb_config"]["eplb_heat_collection_stage"] == inst.role
            assert env["DYNAMIC_EPLB"] == "true"
            # slots per rank the Plan sized memory for = what the engine places
            assert (256 + inst.redundant_experts) // inst.ep == inst.expert_slots_per_rank
        else:
            assert "eplb_config" not in extra and "DYNAMIC_EPLB" not in env


def test_redundant_experts_without_eplb_are_refused_on_0_23(edited_plan) -> None:
    with pytest.raises(ConfigError) as err:
        edited_plan("cm384-prod", lambda c: c["prefill"].pop("eplb"))
    assert "prefill.eplb" in _paths(err.value)


def test_eplb_on_ep1_is_refused(edited_plan) -> None:
    def edit(cfg):
        cfg["prefill"].update(ep=1, redundant_experts=0)

    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", edit)
    assert "prefill.eplb" in _paths(err.value)


def test_0_11_gets_init_redundancy_expert_per_stage(edited_plan) -> None:
    def edit(cfg):
        cfg["engine"]["vllm_ascend_version"] = "0.11.0"
        for role in ("prefill", "decode"):
            cfg[role].pop("eplb", None)
        cfg["decode"]["redundant_experts"] = 64

    plan = edited_plan("cm384-prod", edit)
    seen = {inst.role: additional_config(plan, inst) for inst in plan.instances}
    assert seen["prefill"]["init_redundancy_expert"] == 16
    assert seen["decode"]["init_redundancy_expert"] == 64
    assert seen["decode"]["torchair_graph_config"] == {"enabled": True}
    assert "eplb_config" not in seen["decode"]


def test_moved_engine_keys_name_the_new_key(edited_plan) -> None:
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: c["engine"].update(dynamic_eplb=True))
    assert "prefill.eplb" in str(err.value)


# -- connectors, ports and ids ---------------------------------------------------------------------------------------


def test_unsupported_release_is_refused_listing_supported(edited_plan) -> None:
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: c["engine"].update(vllm_ascend_version="0.9.1"))
    problem = err.value.problems[0]
    assert problem.path == "engine.vllm_ascend_version"
    assert "0.23.0" in problem.hint and "0.11.0" in problem.hint


def test_llmdatadist_is_refused_on_0_23(edited_plan) -> None:
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: c["engine"].update(kv_connector="llmdatadist"))
    assert err.value.problems[0].path == "engine.kv_connector"


def test_mooncake_needs_prefill_tp_at_least_decode_tp(edited_plan) -> None:
    def edit(cfg):
        cfg["decode"].update(dp=2, tp=16, ep=32, nodes_per_instance=4)

    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", edit)
    assert "decode.tp" in _paths(err.value)


def test_kv_ports_and_engine_ids_as_the_connector_computes_them(plans: dict[str, Plan]) -> None:
    """Mooncake listens on kv_port + dp_rank * tp + tp_rank: no two ranks on one host share a port,
    every rank of an instance shares kv_port, engine ids are unique (the connector asserts a remote
    engine id differs from its own)."""
    for plan in plans.values():
        per_host: dict[str, set[int]] = defaultdict(set)
        ids = [r.engine_id for r in plan.ranks]
        assert len(ids) == len(set(ids)), plan.stack
        for inst in plan.instances:
            assert len({r.kv_port for r in inst.ranks}) == 1
            tp = inst.tp
            for rank in inst.ranks:
                ports = {rank.kv_port + (rank.dp_start_rank + j) * tp + t for j in range(rank.dp_local) for t in range(tp)}
                assert ports == set(rank.kv_listen_ports)
                assert not per_host[rank.host_ip] & ports, (plan.stack, rank.name)
                per_host[rank.host_ip] |= ports


def test_headless_ranks_get_no_api_server_count(plans: dict[str, Plan]) -> None:
    """vLLM 0.23 refuses --api-server-count with --headless (vllm/entrypoints/cli/serve.py)."""
    plan = plans["cm384-prod"]
    for rank in plan.ranks:
        argv = engine_command(plan, rank)
        if rank.is_leader:
            assert int(_arg(argv, "--api-server-count")) >= 1
        else:
            assert "--headless" in argv and "--api-server-count" not in argv and "--port" not in argv


def test_recompute_scheduler_only_on_decode(edited_plan, plans: dict[str, Plan]) -> None:
    plan = plans["a2-staging"]
    assert additional_config(plan, plan.by_role("decode")[0])["recompute_scheduler_enable"] is True
    assert "recompute_scheduler_enable" not in additional_config(plan, plan.by_role("prefill")[0])
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: c["prefill"].update(recompute_scheduler=True))
    assert "prefill.recompute_scheduler" in _paths(err.value)


def test_extra_args_flag_of_no_release_is_refused(edited_plan) -> None:
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: c["engine"].update(extra_args=["--no-enable-prefix-caching", "--swap-space", "4"]))
    # --swap-space was removed before vLLM 0.23; the valid flag before it passes
    assert _paths(err.value) == ["engine.extra_args[1]"]


# -- the EPLB guide's "not recommended" cases are refused ------------------------------------------------------------


def test_eplb_on_short_prompt_prefill_is_refused(edited_plan) -> None:
    """Guide (expert_parallelism_load_balancer.md, v0.23.0): not on P nodes with input shorter than 1024 tokens."""
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: c["throughput_check"].update(input_len=512))
    assert "prefill.eplb" in _paths(err.value)
    edited_plan("a2-staging", lambda c: c["throughput_check"].update(input_len=1024))  # at the threshold: accepted


def test_eplb_on_decode_with_few_experts_per_die_is_refused(edited_plan) -> None:
    """Guide: not on D nodes with <= 8 experts per die (EP32: 8; EP64: 4)."""
    for stack in ("a2-staging", "cm384-prod"):
        def edit(cfg):
            cfg["decode"].update(eplb={"mode": "dynamic"}, redundant_experts=cfg["decode"]["ep"])

        with pytest.raises(ConfigError) as err:
            edited_plan(stack, edit)
        assert "decode.eplb" in _paths(err.value)


def test_eplb_guide_accepts_decode_with_more_than_8_experts_per_die() -> None:
    from ascend_runtime.config.loader import load_stack
    from ascend_runtime.planner.engine_rules import _eplb_guide

    config = load_stack("a2-staging").config
    decode = config.decode.model_copy(update={"ep": 16, "dp": 16})
    assert _eplb_guide(config.model_copy(update={"decode": decode}), "decode") == []
    assert _eplb_guide(config, "decode")  # ep 32: 8 per die


# -- checks against the released vLLM-Ascend sources (VLLM_ASCEND_SRC=/path/to/vllm-ascend tag checkout) ----------

import ast  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

from ascend_runtime.engine.releases import RELEASES  # noqa: E402
from ascend_runtime.render.engine_args import fused_mc2_mode  # noqa: E402

VLLM_ASCEND_SRC = Path(os.environ.get("VLLM_ASCEND_SRC", "/nonexistent"))
#: vLLM-Ascend device types (vllm_ascend/utils.py AscendDeviceType) -> the kit's hardware kinds.
SOC_HARDWARE = {"a2": "atlas-800i-a2", "a3": "cm384"}
needs_src = pytest.mark.skipif(not (VLLM_ASCEND_SRC / "vllm_ascend" / "platform.py").is_file(),
                               reason="VLLM_ASCEND_SRC does not point at a vllm-ascend v0.23.0 checkout")


def test_fused_mc2_is_rendered_only_on_a3_decode(plans: dict[str, Plan]) -> None:
    """A2's MoE dispatch selection never reads the switch (ascend_forward_context.py, v0.23.0)."""
    for plan in plans.values():
        for inst in plan.instances:
            got = additional_config(plan, inst).get("enable_fused_mc2")
            want = 2 if (plan.hardware == "cm384" and inst.role == "decode"
                         and plan.config["model"]["quantization"] == "w8a8") else None
            assert got == want, (plan.stack, inst.name, got)
            assert fused_mc2_mode(plan, inst.role) == (want or 0)


@needs_src
def test_fused_mc2_hardware_is_where_the_release_reads_it() -> None:
    mod = ast.parse((VLLM_ASCEND_SRC / "vllm_ascend" / "ascend_forward_context.py").read_text())
    readers = set()
    for fn in mod.body:
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("_select_") and fn.name.endswith("_moe_comm_method"):
            soc = fn.name.removeprefix("_select_").removesuffix("_moe_comm_method")
            if "enable_fused_mc2" in ast.unparse(fn):
                readers.add(soc)
    assert readers, "no _select_<soc>_moe_comm_method reads enable_fused_mc2: the rule's source moved"
    assert RELEASES["0.23.0"].fused_mc2_hardware == {SOC_HARDWARE[s] for s in readers if s in SOC_HARDWARE}


def _reset_by_platform() -> set[str]:
    """Engine-config attributes ``_fix_incompatible_config`` resets (``<x>.<attr> = <constant>``).

    Keys of the JSON-valued configs (``speculative_config.quantization``, ``kv_transfer_config.*``) are not
    ``vllm serve`` flags and are left out.
    """
    mod = ast.parse((VLLM_ASCEND_SRC / "vllm_ascend" / "platform.py").read_text())
    fix = next(n for n in ast.walk(mod) if isinstance(n, ast.FunctionDef) and n.name == "_fix_incompatible_config")
    return {t.attr for n in ast.walk(fix) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets if isinstance(t, ast.Attribute)
            and not any(s in ast.unparse(t.value) for s in ("speculative_config", "kv_transfer_config"))}


@needs_src
def test_ignored_flags_are_those_the_platform_resets(plans: dict[str, Plan], with_stage_setting) -> None:
    """Every flag the kit can render is either left alone by vLLM-Ascend or listed in ``ignored_flags``."""
    reset = _reset_by_platform()
    assert "enable_dbo" in reset
    row = RELEASES["0.23.0"]
    assert {f.removeprefix("--").replace("-", "_") for f in row.ignored_flags} <= reset
    variants = list(plans.values()) + [with_stage_setting(plans["a2-staging"], "prefill", "micro_batching", True)]
    rendered = {w.split("=", 1)[0] for p in variants if p.vllm_ascend_version == "0.23.0"
                for r in p.ranks for w in engine_command(p, r) if w.startswith("--")}
    assert "--enable-dbo" in rendered
    for flag in rendered:
        if flag.removeprefix("--").replace("-", "_") in reset:
            assert flag in row.ignored_flags, f"vLLM-Ascend 0.23.0 resets {flag}; list it in ignored_flags"


# -- balance scheduling: refused in PD-disaggregated mode ------------------------------------------------------------

BALANCE_ENV_CASES = [  # (engine.extra_env value, refused)
    ("1", True), ("2", True), (" 1 ", True), ("0", False), ("00", False), ("yes", True), ("", True),
    ({"secret": "balance"}, True),
]
BALANCE_ARGS_CASES = [  # (engine.extra_args, the refused word's index or None)
    (["--additional-config", '{"enable_balance_scheduling": true}'], 1),
    (['--additional-config={"enable_balance_scheduling": 1}'], 0),
    (["--additional_config", '{"enable_balance_scheduling": "false"}'], 1),  # a non-empty string is true upstream
    (["--additional-config.enable_balance_scheduling", "true"], 1),
    (["--additional-config.enable_balance_scheduling=true"], 0),
    (["--additional-config", '{"enable_balance_scheduling": true}', "--additional-config", "{}"], None),  # last wins
    (["--additional-config", '{"enable_balance_scheduling": false}'], None),
    (["--additional-config.enable_balance_scheduling", "false", "--additional-config",
      '{"enable_balance_scheduling": true}'], None),  # the dotted form is merged last, so it wins
]


def test_balance_scheduling_env_is_refused_naming_the_key(edited_plan) -> None:
    """vllm_ascend/platform.py check_and_update_config (v0.23.0, lines 677-684): ValueError unless kv_both;
    the variable is bool(int(...)) (envs.py line 105)."""
    for value, refused in BALANCE_ENV_CASES:
        edit = lambda c, v=value: c["engine"].setdefault("extra_env", {}).update(VLLM_ASCEND_BALANCE_SCHEDULING=v)  # noqa: E731
        if not refused:
            edited_plan("a2-staging", edit)
            continue
        with pytest.raises(ConfigError) as err:
            edited_plan("a2-staging", edit)
        assert _paths(err.value) == ["engine.extra_env.VLLM_ASCEND_BALANCE_SCHEDULING"], value


def test_balance_scheduling_additional_config_is_refused_naming_the_word(edited_plan) -> None:
    """The --additional-config key decides over the variable (ascend_config.py _get_config_value, v0.23.0)."""
    for args, index in BALANCE_ARGS_CASES:
        edit = lambda c, a=args: c["engine"].update(extra_args=a)  # noqa: E731
        if index is None:
            edited_plan("a2-staging", edit)
            continue
        with pytest.raises(ConfigError) as err:
            edited_plan("a2-staging", edit)
        assert _paths(err.value) == [f"engine.extra_args[{index}]"], args
        assert "enable_balance_scheduling" in str(err.value) and "PD-disaggregated" in str(err.value)
    # the key given off overrides the variable; the variable given on with no key is refused
    def both(c, on: bool):  # noqa: ANN001
        c["engine"].update(extra_args=["--additional-config", json.dumps({"enable_balance_scheduling": on})],
                           extra_env={"VLLM_ASCEND_BALANCE_SCHEDULING": "1"})

    edited_plan("a2-staging", lambda c: both(c, False))
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: both(c, True))
    assert _paths(err.value) == ["engine.extra_args[1]"]


def test_balance_scheduling_rule_only_where_the_release_has_it(edited_plan) -> None:
    """0.11.0 has neither the key nor the variable: the rule does not apply there."""
    def edit(cfg):  # noqa: ANN001
        cfg["engine"]["vllm_ascend_version"] = "0.11.0"
        cfg["prefill"].pop("eplb", None)
        cfg["decode"].update(max_num_batched_tokens=256)
        for role in ("prefill", "decode"):
            cfg[role].pop("modules", None)  # 0.23.0-only keys
        cfg["engine"].setdefault("extra_env", {})["VLLM_ASCEND_BALANCE_SCHEDULING"] = "1"

    assert edited_plan("a2-staging", edit).vllm_ascend_version == "0.11.0"


@needs_src
def test_balance_scheduling_check_is_where_the_rule_cites_it() -> None:
    text = (VLLM_ASCEND_SRC / "vllm_ascend" / "platform.py").read_text().splitlines()
    block = "\n".join(text[676:685])
    assert "if ascend_config.enable_balance_scheduling:" in block and 'kv_role != "kv_both"' in block
    assert "only supports PD-mixed mode" in block
    envs = (VLLM_ASCEND_SRC / "vllm_ascend" / "envs.py").read_text().splitlines()[104]
    assert '"VLLM_ASCEND_BALANCE_SCHEDULING": lambda: bool(int(os.getenv("VLLM_ASCEND_BALANCE_SCHEDULING", "0")))' in envs


# -- engine.extra_args never replaces what the kit renders -----------------------------------------------------------


def test_every_option_the_kit_renders_is_guarded(plans) -> None:
    from ascend_runtime.planner.engine_rules import KIT_OPTIONS, _option_name

    seen = set()
    for plan in plans.values():
        for rank in plan.ranks:
            seen |= {w for w in engine_command(plan, rank) if w.startswith("-")}
    assert seen - {"--additional-config"} <= KIT_OPTIONS, seen - KIT_OPTIONS
    assert {_option_name(w) for w in ("--max_num_seqs=4", "--no-enforce-eager", "--compilation-config.level",
                                      "-tp", "--kv-transfer-config={}")} <= KIT_OPTIONS


@pytest.mark.parametrize("args, index", [
    (["--kv-transfer-config", "{}"], 0),
    (["--no-enable-prefix-caching", "--max_num_seqs=4"], 1),
    (["--no-enforce-eager"], 0),
    (["--compilation-config.cudagraph_mode", "NONE"], 0),
    (["-tp", "2"], 0),
])
def test_extra_args_repeating_a_rendered_option_are_refused(edited_plan, args, index) -> None:
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: c["engine"].update(extra_args=args))
    assert f"engine.extra_args[{index}]" in _paths(err.value)


def test_extra_additional_config_is_merged_into_the_kits_one(edited_plan) -> None:
    args = ["--no-enable-prefix-caching", "--additional-config", json.dumps({"x": {"a": 1}}),
            "--additional_config.x.b=2", "--additional-config.y", "text"]
    plan = edited_plan("a2-staging", lambda c: c["engine"].update(extra_args=args))
    inst = plan.by_role("decode")[0]
    rank = next(r for r in plan.ranks if r.instance == inst.name)
    argv = engine_command(plan, rank)
    assert argv.count("--additional-config") == 1 and argv[-1] == "--no-enable-prefix-caching"
    merged = json.loads(_arg(argv, "--additional-config"))
    kit = additional_config(plan, inst)
    assert merged == {**kit, "x": {"a": 1, "b": 2}, "y": "text"} and kit  # the kit's keys stay


@pytest.mark.parametrize("args", [["--additional-config", "{not json"], ["--additional-config", "[1]"],
                                  ["--additional-config"]])
def test_extra_additional_config_that_is_no_object_is_refused(edited_plan, args) -> None:
    with pytest.raises(ConfigError) as err:
        edited_plan("a2-staging", lambda c: c["engine"].update(extra_args=args))
    assert any(p.startswith("engine.extra_args[") for p in _paths(err.value))


def test_dotted_additional_config_keys_stay_as_written() -> None:
    """vLLM 0.23.0 turns `_` into `-` only before the first `.` (utils/argparse_utils.py): the key is the user's."""
    from ascend_runtime.planner.engine_rules import extra_additional_config

    got = extra_additional_config(["--additional_config.ascend_x.some_key=1", "--max_num_seqs", "4"])
    assert got.values == {"ascend_x": {"some_key": 1}} and got.rest == ["--max_num_seqs", "4"]
    assert got.origin == {"ascend_x": 0} and got.problems == []
