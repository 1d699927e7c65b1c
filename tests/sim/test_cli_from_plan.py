"""`ascend-deploy sim --stack` and the flag round trip used by the kind manifests."""

from __future__ import annotations

import pytest

from ascend_runtime.cli import build_parser
from ascend_runtime.cli.commands.sim import config_from_args
from ascend_runtime.perf.from_plan import sim_config_from_plan
from ascend_runtime.perf.sim_flags import argv_from_config
from ascend_runtime.planner import load_plan


@pytest.mark.parametrize("stack", ["local", "kind"])
def test_flags_round_trip_every_instance(stack: str) -> None:
    plan = load_plan(stack)
    for inst in plan.instances:
        config = sim_config_from_plan(plan, inst)
        args = build_parser().parse_args(["sim", *argv_from_config(config)])
        assert config_from_args(args) == config


def test_prefix_cache_switches_round_trip_with_vllms_flag_names() -> None:
    """On by default like vLLM 0.23.0; off is written as ``--no-enable-prefix-caching``."""
    base = ["sim", "--role", "prefill", "--instance", "p", "--port", "18000", "--kv-port", "28000"]
    on = config_from_args(build_parser().parse_args(base))
    assert on.enable_prefix_caching and on.block_size == 128
    off = config_from_args(build_parser().parse_args([*base, "--no-enable-prefix-caching", "--block-size", "64"]))
    assert (off.enable_prefix_caching, off.block_size) == (False, 64)
    argv = argv_from_config(off)
    assert "--no-enable-prefix-caching" in argv and "--enable-prefix-caching" not in argv
    assert config_from_args(build_parser().parse_args(["sim", *argv])) == off
    assert "--no-enable-prefix-caching" not in argv_from_config(on)


def test_stack_option_takes_the_plan_and_converts_the_link_rate() -> None:
    plan = load_plan("local")
    args = build_parser().parse_args(["sim", "--stack", "local", "--instance", "decode-1"])
    config = config_from_args(args)
    inst = plan.instance("decode-1")
    assert (config.role, config.host, config.port, config.kv_port) == ("decode", inst.api_host, inst.api_port, inst.ranks[0].kv_port)
    assert (config.npus, config.dp, config.ep, config.redundant_experts) == (32, 32, 32, inst.redundant_experts)
    assert config.link_gbps == plan.config["simulator"]["link_gbps"] * 8  # stack GB/s -> simulator Gbit/s


def test_stack_option_refuses_real_targets_and_unknown_instances() -> None:
    with pytest.raises(ValueError, match="runs real engines"):
        config_from_args(build_parser().parse_args(["sim", "--stack", "a2-staging", "--instance", "decode-0"]))
    with pytest.raises(ValueError, match="not in the Plan"):
        config_from_args(build_parser().parse_args(["sim", "--stack", "local", "--instance", "decode-9"]))
