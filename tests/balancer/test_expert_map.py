import copy

import numpy as np

from ascend_runtime.balancer.expert_map import (
    map_to_placement,
    placement_to_map,
    validate_map,
)


def good_map():
    return placement_to_map(np.array([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 2, 3]]), 3)


def test_round_trip():
    p, ranks, slots = map_to_placement(good_map(), 4)
    assert (ranks, slots) == (3, 2) and p.tolist() == [[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, 2, 3]]
    assert validate_map(good_map(), 4) == []


def test_lost_expert_unequal_slots_out_of_range_duplicate():
    lost = good_map()
    lost["layer_list"][0]["device_list"][1]["device_expert"] = [0, 1]  # expert 2, 3 gone in layer 0
    assert any("loses logical experts [2, 3]" in p for p in validate_map(lost, 4))
    unequal = good_map()
    unequal["layer_list"][1]["device_list"][2]["device_expert"].append(1)
    assert any("equal slot counts" in p for p in validate_map(unequal, 4))
    out = good_map()
    out["layer_list"][0]["device_list"][2]["device_expert"] = [0, 4]
    assert any("out of range" in p for p in validate_map(out, 4))
    dup = copy.deepcopy(good_map())
    dup["layer_list"][0]["device_list"][2]["device_expert"] = [1, 1]
    assert any("twice" in p for p in validate_map(dup, 4))
    assert validate_map({"layer_list": "x"}, 4)
    assert any("expected 4" in p for p in validate_map(good_map(), 4, ranks=4))
