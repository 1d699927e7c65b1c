import numpy as np
import pytest

from ascend_runtime.balancer.eplb_greedy import eplb_greedy, trivial_placement
from ascend_runtime.balancer.expert_map import placement_to_map, validate_map
from ascend_runtime.balancer.measure import balancedness, moved_slots, rank_loads, replica_counts
from ascend_runtime.balancer.placement import PlacementConfig, place_from_scratch, plan_placement
from ascend_runtime.balancer.trace import synthetic_trace

CASES = [(8, 8, None, None), (8, 9, None, None), (16, 5, None, None), (36, 2, None, None), (8, 9, 8, 2), (16, 5, 8, 4)]


@pytest.fixture(scope="module")
def trace():
    return synthetic_trace(3, layers=6, experts=64, skew=1.0, drift=0.1, seed=7)


@pytest.mark.parametrize("ranks,slots,groups,nodes", CASES)
def test_every_produced_map_validates(trace, ranks, slots, groups, nodes):
    first = place_from_scratch(trace[0], ranks, slots, groups, nodes)
    res = plan_placement(trace[1], ranks, slots, groups, nodes, previous=first, config=PlacementConfig(min_gain=0.0))
    for p in (first, res.placement):
        assert p.shape == (6, ranks * slots)
        assert validate_map(placement_to_map(p, ranks), 64, ranks, slots) == []
        assert (replica_counts(p, 64) >= 1).all()


def test_balancedness_definition():
    load = np.array([[4.0, 2.0, 2.0]])
    p = np.array([[0, 1, 0, 2]])  # rank0: e0/2 + e1 = 4, rank1: e0/2 + e2 = 4
    assert np.allclose(rank_loads(p, load, 2), [[4.0, 4.0]])
    assert balancedness(p, load, 2) == pytest.approx(1.0)
    # rank0 = 4/2 + 4 = 6, rank1 = 0 + 4/2 = 2: mean 4, max 6
    assert balancedness(np.array([[0, 1, 2, 0]]), np.array([[4.0, 4.0, 0.0]]), 2) == pytest.approx(4 / 6)


def test_beats_or_matches_greedy_on_skewed_load(trace):
    load = trace[0]
    ours = place_from_scratch(load, 16, 5)
    greedy = eplb_greedy(load, 16, 5)
    assert balancedness(ours, load, 16) >= balancedness(greedy, load, 16)
    assert balancedness(ours, load, 16) > balancedness(trivial_placement(6, 64, 16, 5), load, 16) + 0.1


def test_eplb_greedy_keeps_every_expert_and_slot_count(trace):
    for groups, nodes in ((None, None), (8, 2)):
        p = eplb_greedy(trace[0], 8, 9, groups, nodes)
        assert p.shape == (6, 72)
        assert (replica_counts(p, 64) >= 1).all()


def test_few_moves_when_load_barely_changes(trace):
    first = place_from_scratch(trace[0], 16, 5)
    nudged = trace[0] * (1 + 0.01 * np.random.default_rng(0).standard_normal(trace[0].shape))
    res = plan_placement(nudged, 16, 5, previous=first, config=PlacementConfig(min_gain=0.0))
    fresh = place_from_scratch(nudged, 16, 5)
    assert res.moved_slots <= 0.3 * first.size
    assert res.balancedness >= 0.99 * balancedness(fresh, nudged, 16)


def test_keeps_previous_below_min_gain(trace):
    first = place_from_scratch(trace[0], 16, 5)
    res = plan_placement(trace[0], 16, 5, previous=first, config=PlacementConfig(min_gain=0.05))
    assert res.kept_previous and res.moved_slots == 0
    assert np.array_equal(res.placement, first)


def test_moved_slots_ignores_order_within_rank():
    prev = np.array([[0, 1, 2, 3]])
    assert moved_slots(prev, np.array([[1, 0, 3, 2]]), 2, 4) == 0
    assert moved_slots(prev, np.array([[2, 1, 0, 3]]), 2, 4) == 2


def test_rejects_impossible_shapes():
    with pytest.raises(ValueError):
        place_from_scratch(np.ones((2, 64)), 8, 7)
    with pytest.raises(ValueError):
        place_from_scratch(np.ones((2, 64)), 8, 8, groups=8, nodes=3)
