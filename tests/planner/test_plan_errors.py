"""Each category of invalid stack: `plan` exits 2 and names the key; nothing is planned."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner import load_plan

NS = "ascend-deepseek:"


def plan_cli(stacks: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ascend_runtime", "plan", "--stack", name, "--stacks-dir", str(stacks)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def set_key(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    section, _, field = key.partition(".")

    def edit(config: dict[str, Any]) -> None:
        if field:
            config.setdefault(NS + section, {})[field] = value
        else:
            config[NS + section] = value

    return edit


def expect_error(stack_copy: Callable[..., Path], name: str, path: str, *fragments: str, **edits: Any) -> str:
    stacks = stack_copy(name, **edits)
    result = plan_cli(stacks, name)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:" in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    with pytest.raises(ConfigError) as info:
        load_plan(name, stacks)
    assert any(p.path == path for p in info.value.problems)
    return result.stderr


def test_misspelt_key_is_named_with_suggestion(stack_copy: Callable[..., Path]) -> None:
    def misspell(config: dict[str, Any]) -> None:
        config[NS + "decode"]["tpp"] = config[NS + "decode"].pop("tp")

    expect_error(stack_copy, "a2-staging", "decode.tpp", "unknown key", "did you mean 'tp'", edit_config=misspell)


def test_unknown_top_level_key(stack_copy: Callable[..., Path]) -> None:
    expect_error(stack_copy, "a2-staging", "hardwre", "unknown key", "hardware", edit_config=set_key("hardwre", "cm384"))


def test_dp_times_tp_must_equal_npus(stack_copy: Callable[..., Path]) -> None:
    expect_error(stack_copy, "a2-staging", "decode.dp", "16 x 1 = 16", "4 x 8 = 32", edit_config=set_key("decode.dp", 16))


def test_ep_must_divide_expert_slots(stack_copy: Callable[..., Path]) -> None:
    expect_error(
        stack_copy, "a2-staging", "decode.ep", "270 expert slots", "set redundant_experts to 32",
        edit_config=set_key("decode.redundant_experts", 14),
    )


def test_duplicate_node_host_ip(stack_copy: Callable[..., Path]) -> None:
    def dup(inv: dict[str, Any]) -> None:
        inv["nodes"][3]["host_ip"] = inv["nodes"][1]["host_ip"]

    expect_error(stack_copy, "a2-staging", "inventory.nodes[3].host_ip", "listed twice", edit_inventory=dup)


def test_duplicate_device_ip(stack_copy: Callable[..., Path]) -> None:
    def dup(inv: dict[str, Any]) -> None:
        inv["nodes"][2]["devices"][5]["device_ip"] = inv["nodes"][0]["devices"][1]["device_ip"]

    expect_error(stack_copy, "a2-staging", "inventory.nodes[2].devices[5].device_ip", "listed twice", edit_inventory=dup)


def test_too_few_nodes(stack_copy: Callable[..., Path]) -> None:
    expect_error(stack_copy, "a2-staging", "decode.instances", "too few nodes", edit_config=set_key("decode.instances", 2))


def test_hbm_overflow_shows_numbers(stack_copy: Callable[..., Path]) -> None:
    stderr = expect_error(
        stack_copy, "a2-staging", "decode.max_num_seqs", "HBM overflow", "budget 61.44 GiB",
        edit_config=set_key("decode.max_num_seqs", 200),
    )
    assert "sequences fit" in stderr


def test_instance_spanning_super_pods(stack_copy: Callable[..., Path]) -> None:
    # 8 prefill nodes leave 4 free in pod 0; two 5-node decodes fill pod 1 to 10 of 12;
    # the third 5-node decode finds 6 usable nodes, but only across the two pods.
    def edit(config: dict[str, Any]) -> None:
        # ep 80 needs 64 redundant slots: on 0.11 they reach the engine without EPLB (init_redundancy_expert)
        config[NS + "engine"]["vllm_ascend_version"] = "0.11.0"
        config[NS + "prefill"].pop("eplb")
        d = config[NS + "decode"]
        d.update(instances=3, nodes_per_instance=5, dp=80, ep=80, redundant_experts=64)

    expect_error(stack_copy, "cm384-prod", "decode.nodes_per_instance", "span super pods", edit_config=edit)


def test_colliding_ports(stack_copy: Callable[..., Path]) -> None:
    expect_error(stack_copy, "a2-staging", "ports.kv_base", "collide", edit_config=set_key("ports.kv_base", 8001))


def test_an_instance_count_no_port_range_can_hold_names_the_count_not_the_ports(
        stack_copy: Callable[..., Path]) -> None:
    err = expect_error(stack_copy, "a2-staging", "decode.instances", "API ports", "lower decode.instances",
                       edit_config=set_key("decode.instances", 10**12))
    assert "ports.api_base" not in err  # the ports follow from the count; only the cause is reported


def test_device_count_must_match_hardware(stack_copy: Callable[..., Path]) -> None:
    def drop(inv: dict[str, Any]) -> None:
        inv["nodes"][4]["devices"].pop()

    expect_error(stack_copy, "a2-staging", "inventory.nodes[4].devices", "lists 7 devices", "have 8", edit_inventory=drop)


def test_mooncake_needs_prefill_tp_at_least_decode_tp(stack_copy: Callable[..., Path]) -> None:
    def edit(config: dict[str, Any]) -> None:
        config[NS + "prefill"].update(dp=16, tp=1)
        config[NS + "decode"].update(dp=16, tp=2)

    expect_error(stack_copy, "cm384-prod", "decode.tp", "prefill tp >= decode tp", edit_config=edit)


def test_a3_devices_need_super_pod_facts(stack_copy: Callable[..., Path]) -> None:
    def strip(inv: dict[str, Any]) -> None:
        inv["nodes"][0]["devices"][0].pop("super_pod_id")

    expect_error(stack_copy, "cm384-prod", "inventory.nodes[0].devices[0]", "super_pod_id", edit_inventory=strip)


def test_reserved_port_is_refused(stack_copy: Callable[..., Path]) -> None:
    expect_error(stack_copy, "a2-staging", "ports.api_base", "kubelet", edit_config=set_key("ports.api_base", 10250))


def test_derived_names_stay_labels_without_enumerating_instances() -> None:
    from ascend_runtime.config.loader import load_stack
    from ascend_runtime.planner.validation import check_names

    config = load_stack("a2-staging").config
    assert check_names(config) == []
    huge = config.model_copy(update={"decode": config.decode.model_copy(update={"instances": 10**60})})
    (problem,) = check_names(huge)  # returns at once: only the longest names are built
    assert problem.path == "decode.instances" and "63 characters" in problem.message
