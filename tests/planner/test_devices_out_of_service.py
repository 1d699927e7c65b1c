"""``devices_out_of_service``: an inventory node keeps every NPU listed and names the broken ones; the planner
never places on them (planner/service.py), and refuses naming the key when the stages then lack nodes."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ascend_runtime.faults.topology import Topology
from ascend_runtime.planner import load_plan
from ascend_runtime.render.environment import rank_env
from ascend_runtime.render.ranktables import rank_tables

from .test_plan_errors import NS, expect_error


def out_of_service(node: int, *devices: int) -> Callable[[dict[str, Any]], None]:
    def edit(inv: dict[str, Any]) -> None:
        inv["nodes"][node]["devices_out_of_service"] = list(devices)

    return edit


def with_spare(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """``edit`` plus a seventh node, a copy of the sixth with addresses of its own."""

    def both(inv: dict[str, Any]) -> None:
        edit(inv)
        spare = copy.deepcopy(inv["nodes"][5])
        spare.update(name="a2-node-07", host_ip="192.0.2.17")
        for dev in spare["devices"]:
            head, _, last = dev["device_ip"].rpartition(".")
            dev["device_ip"] = f"{head}.{int(last) + 40}"
        inv["nodes"].append(spare)

    return both


def test_a_cluster_stack_short_of_whole_nodes_is_refused_naming_the_node_and_the_key(
        stack_copy: Callable[..., Path]) -> None:
    err = expect_error(stack_copy, "a2-staging", "inventory.nodes[3].devices_out_of_service",
                       "a2-node-04 (device 5 out of service; 7 of 8 in service", "needs nodes with 8 usable devices",
                       "on the kubernetes target a node with a device out of service hosts no instance",
                       "replace-failed-node.md", edit_inventory=out_of_service(3, 5))
    assert "Traceback" not in err


def test_a_node_with_a_device_out_of_service_is_left_unused_and_a_spare_takes_its_place(
        stack_copy: Callable[..., Path]) -> None:
    plan = load_plan("a2-staging", stack_copy("a2-staging", edit_inventory=with_spare(out_of_service(3, 5))))
    nodes = {n.name: n for n in plan.nodes}
    assert nodes["a2-node-04"].role is None and nodes["a2-node-04"].devices_used == 0
    assert nodes["a2-node-04"].devices_out_of_service == (5,)
    assert nodes["a2-node-07"].role == "decode"
    assert all(r.node != "a2-node-04" for r in plan.ranks)
    doc = json.loads(plan.to_json())
    assert [n.get("devices_out_of_service") for n in doc["nodes"]] == [None, None, None, [5], None, None, None]
    # the fault watcher offers it as no spare: a node with a broken NPU is no place to move a group to
    topo = Topology.from_plan(plan)
    assert "a2-node-04" not in topo.spares and topo.node_role("a2-node-04") == "out-of-service"
    assert Topology.from_dict(json.loads(json.dumps(topo.to_dict()))) == topo


def test_partial_nodes_on_the_local_target_skip_the_device_in_rank_tables_and_device_lists(
        stack_copy: Callable[..., Path]) -> None:
    def four_per_node(config: dict[str, Any]) -> None:  # prefill on four nodes of four NPUs each, one decode
        config[NS + "prefill"].update(nodes_per_instance=4, devices_per_node=4, dp=4, tp=4, ep=16)
        config[NS + "decode"].update(instances=1)

    stacks = stack_copy("local", edit_config=four_per_node, edit_inventory=out_of_service(0, 1))
    plan = load_plan("local", stacks)
    (prefill,) = plan.by_role("prefill")
    first = prefill.ranks[0]
    assert first.device_ids == (0, 2, 3, 4)
    assert rank_env(plan, first)["ASCEND_RT_VISIBLE_DEVICES"] == "0,2,3,4"
    table = rank_tables(plan)["hccl-prefill-0"]
    listed = [d["device_id"] for d in table["server_list"][0]["device"]]
    assert listed == ["0", "2", "3", "4"]
    assert [d["rank_id"] for s in table["server_list"] for d in s["device"]] == [str(k) for k in range(16)]


def test_the_default_shape_on_the_local_target_is_refused(stack_copy: Callable[..., Path]) -> None:
    expect_error(stack_copy, "local", "inventory.nodes[9].devices_out_of_service", "7 of 8 in service",
                 "an instance takes devices_per_node in-service devices", edit_inventory=out_of_service(9, 0))


def test_an_unknown_or_repeated_device_is_refused(stack_copy: Callable[..., Path]) -> None:
    expect_error(stack_copy, "a2-staging", "inventory.nodes[2].devices_out_of_service[1]", "lists no device 8",
                 edit_inventory=out_of_service(2, 1, 8))
    expect_error(stack_copy, "a2-staging", "inventory.nodes[2].devices_out_of_service", "listed twice",
                 edit_inventory=out_of_service(2, 1, 1))
