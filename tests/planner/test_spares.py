"""Spare nodes (planner/spares.py): the ``spares`` key's guarantee, and a spare taking a faulted node's place by the
planner's own rules, from an inventory edit or from the fault watcher, with nothing else moving."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.config.loader import load_stack
from ascend_runtime.planner import load_plan, plan_without
from ascend_runtime.planner.spares import NoSpare, spare_roles
from ascend_runtime.render.ranktables import rank_tables
from tests.spare_nodes import cm384_spares, local_spares

from .test_plan_errors import NS, expect_error


def decode_spares(count: int = 1) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        config[NS + "spares"] = {"decode": count}

    return edit


def with_cm384_spares(inv: dict[str, Any]) -> None:
    cm384_spares(inv)


def test_spares_are_kept_per_super_pod_and_refused_when_the_inventory_has_none(stack_copy: Callable[..., Path]) -> None:
    plan = load_plan("cm384-prod", stack_copy("cm384-prod", edit_config=decode_spares(), edit_inventory=with_cm384_spares))
    assert spare_roles(plan) == {"cm384-sp0-spare1": "decode", "cm384-sp1-spare1": "decode"}
    assert {n.name: n.role for n in plan.nodes}["cm384-sp0-spare1"] is None
    nodes = json.loads(plan.to_json())["nodes"]  # the Plan says which node is kept for what, only on spares
    assert {n["name"]: n["spare_for"] for n in nodes if "spare_for" in n} == spare_roles(plan)
    expect_error(stack_copy, "cm384-prod", "spares.decode", "1 spare node(s) for decode wanted in super pod 0",
                 "add 1 node(s) in super pod 0 to the inventory", edit_config=decode_spares())


def test_a_faulted_decode_node_hands_its_rank_to_the_spare_of_its_super_pod(stack_copy: Callable[..., Path]) -> None:
    stacks = stack_copy("cm384-prod", edit_config=decode_spares(), edit_inventory=with_cm384_spares)
    plan = load_plan("cm384-prod", stacks)
    moved = plan_without(load_stack("cm384-prod", stacks), ["cm384-sp0-node10"])
    changed = [(a, b) for a, b in zip(plan.instances, moved.instances) if a != b]
    assert [a.name for a, _ in changed] == ["decode-0"], "only the faulted node's instance moves"
    before, after = changed[0]
    assert after.nodes == ("cm384-sp0-node09", "cm384-sp0-spare1", "cm384-sp0-node11", "cm384-sp0-node12")
    assert after.api_url == before.api_url and after.super_pod_id == 0
    for old, new in zip(before.ranks, after.ranks):  # same rank index, DP ranks, KV ports and engine id
        assert (new.index, new.dp_start_rank, new.kv_port, new.engine_id) == (old.index, old.dp_start_rank,
                                                                                old.kv_port, old.engine_id)
    spare = after.ranks[1]
    assert spare.host_ip == "192.0.2.201" and {d.super_pod_id for d in spare.devices} == {0}
    assert [d.global_rank for d in spare.devices] == [d.global_rank for d in before.ranks[1].devices]
    nodes = {n.name: n for n in moved.nodes}
    assert nodes["cm384-sp0-node10"].role is None and nodes["cm384-sp0-node10"].devices_used == 0
    assert nodes["cm384-sp0-spare1"].role == "decode" and nodes["cm384-sp0-spare1"].devices_used == 16
    assert spare_roles(moved) == {"cm384-sp1-spare1": "decode"}
    table = next(iter(t for n, t in rank_tables(moved).items() if "decode-0" in n), None)
    if table is not None:  # the engines that read one: the spare's server, device IPs and super device ids
        servers = [s["server_id"] for s in table["server_list"]]
        assert "192.0.2.201" in servers and "192.0.2.110" not in servers


def test_the_leader_node_moves_the_api(stack_copy: Callable[..., Path]) -> None:
    stacks = stack_copy("cm384-prod", edit_config=decode_spares(), edit_inventory=with_cm384_spares)
    moved = plan_without(load_stack("cm384-prod", stacks), ["cm384-sp1-node05"])
    inst = moved.instance("decode-2")
    assert inst.nodes[0] == "cm384-sp1-spare1" and inst.api_url == "http://192.0.2.211:" + str(inst.api_port)


def test_the_inventory_edit_after_a_move_gives_the_plan_the_watcher_acted_on(stack_copy: Callable[..., Path]) -> None:
    def broken_npu(inv: dict[str, Any]) -> None:
        cm384_spares(inv)
        inv["nodes"][9]["devices_out_of_service"] = [3]

    watcher = plan_without(load_stack("cm384-prod", stack_copy("cm384-prod", edit_config=decode_spares(),
                                                               edit_inventory=with_cm384_spares)), ["cm384-sp0-node10"])
    edited = load_plan("cm384-prod", stack_copy("cm384-prod", edit_config=decode_spares(), edit_inventory=broken_npu))
    assert edited.instances == watcher.instances
    assert [dataclasses.replace(n, devices_out_of_service=()) for n in edited.nodes] == \
        [dataclasses.replace(n, devices_out_of_service=()) for n in watcher.nodes]


def test_no_spare_in_the_super_pod_names_the_node_and_the_keys(stack_copy: Callable[..., Path]) -> None:
    stack = load_stack("cm384-prod", stack_copy("cm384-prod", edit_config=decode_spares(), edit_inventory=with_cm384_spares))
    with pytest.raises(NoSpare) as info:
        plan_without(stack, ["cm384-sp0-node03"])  # a prefill node: the spares are kept for decode
    assert info.value.problem.path == "inventory.nodes[2].devices_out_of_service"
    assert "spares.prefill or spares.shared" in info.value.problem.hint
    with pytest.raises(NoSpare):  # the second decode fault of super pod 0 finds its spare taken
        plan_without(stack, ["cm384-sp0-node10", "cm384-sp0-node11"])


def test_local_spares_and_the_order_nodes_are_taken_out_in(stack_copy: Callable[..., Path]) -> None:
    def two_spares(inv: dict[str, Any]) -> None:
        local_spares(inv, 2)

    stack = load_stack("local", stack_copy("local", edit_inventory=two_spares))
    first = plan_without(stack, ["sim-node-07", "sim-node-03"])  # the watcher took node 7 out first
    assert first.instance("decode-1").nodes[0] == "sim-node-11" and first.instance("decode-0").nodes[0] == "sim-node-12"
    second = plan_without(stack, ["sim-node-03", "sim-node-07"])
    assert second.instance("decode-0").nodes[0] == "sim-node-11"
    assert first.instance("decode-1").api_url.startswith("http://127.0.1.11:")


def test_a_flexible_groups_node_moves_both_shapes_and_the_group(stack_copy: Callable[..., Path]) -> None:
    def one_group(config: dict[str, Any]) -> None:
        config[NS + "decode"].update(instances=1, nodes_per_instance=2, dp=16, ep=16, max_num_seqs=8,
                                     max_num_batched_tokens=8)
        config[NS + "pd_ratio"] = {"mode": "auto", "groups": 1}

    stacks = stack_copy("local", edit_config=one_group)
    stack = load_stack("local", stacks)
    (group,) = load_plan("local", stacks).flex_groups
    moved = plan_without(stack, [group.nodes[0]])
    (after,) = moved.flex_groups
    assert after.nodes == ("sim-node-07", group.nodes[1])
    for name in (*group.prefill, *group.decode):  # the running shape and the standby one, on the same devices
        assert moved.instance(name).nodes == after.nodes
    nodes = {n.name: n for n in moved.nodes}
    assert nodes["sim-node-07"].devices_used == 8 and nodes[group.nodes[0]].role is None
