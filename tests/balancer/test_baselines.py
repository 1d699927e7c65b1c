"""Baselines against upstream vLLM-Ascend: worked cases, and the upstream code itself when present."""

import importlib.util
import logging
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from ascend_runtime.balancer.baselines import flashlb, swift_balancer
from ascend_runtime.balancer.eplb_greedy import eplb_greedy
from ascend_runtime.balancer.measure import rank_loads, replica_counts

EXAMPLE = np.array([[600, 560, 120, 120, 20, 10, 10, 10]], dtype=float)  # PR #3042: 8 experts, 8 ranks x 2 slots
# a checkout of vllm-ascend v0.23.0 (e.g. `git archive v0.23.0` of the upstream repository), when available
UPSTREAM = Path(os.environ.get("VLLM_ASCEND_SRC", "/nonexistent")) / "vllm_ascend" / "eplb" / "core" / "policy"


def peak(placement, load, ranks):
    return float(rank_loads(placement, load, ranks).max())


def valid(placement, experts, ranks, slots):
    counts = replica_counts(placement, experts)
    per_rank = placement.reshape(placement.shape[0], ranks, slots)
    no_dup = all(len(set(row.tolist())) == slots for layer in per_rank for row in layer)
    return bool((counts >= 1).all()) and no_dup


def test_worked_case_peaks():
    assert peak(eplb_greedy(EXAMPLE, 8, 2), EXAMPLE, 8) == pytest.approx(232)
    tree = flashlb.place(EXAMPLE, 8, 2)
    first = flashlb.place(EXAMPLE, 8, 2, variant="pr3042")
    assert peak(first, EXAMPLE, 8) == pytest.approx(205)
    assert peak(tree, EXAMPLE, 8) == pytest.approx(200)
    assert valid(tree, 8, 8, 2) and valid(first, 8, 8, 2)
    # 196.67: the floor with even splits given with the worked case; every plan stays above it
    for p in (tree, first, eplb_greedy(EXAMPLE, 8, 2)):
        assert peak(p, EXAMPLE, 8) > 196.66


def test_worked_case_tree_decisions():
    tree = flashlb.place(EXAMPLE, 8, 2)
    assert replica_counts(tree, 8)[0].tolist() == [4, 4, 2, 2, 1, 1, 1, 1]
    assert sorted(map(sorted, tree.reshape(8, 2).tolist())) == [[0, 4], [0, 5], [0, 6], [0, 7], [1, 2], [1, 2], [1, 3], [1, 3]]


def test_swift_balancer_worked_case():
    start = swift_balancer.initial_placement(1, 8, 8, 2)
    assert start.tolist() == [[0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7]]
    p = swift_balancer.place(EXAMPLE, 8, 2)
    assert valid(p, 8, 8, 2)
    assert peak(p, EXAMPLE, 8) == pytest.approx(260)  # upstream's one-transfer-per-rank-pair limit binds
    assert replica_counts(p, 8)[0].tolist() == [5, 4, 1, 2, 1, 1, 1, 1]  # upstream's 2w/(k+2) weights
    # a balanced layer is left alone
    flat = np.full((1, 8), 100.0)
    assert (swift_balancer.place(flat, 8, 2) == start).all()


def test_history_and_previous():
    rng = np.random.default_rng(3)
    hist = rng.poisson(rng.gamma(1.0, 200.0, size=(1, 2, 16)), size=(5, 2, 16)).astype(float)
    p = flashlb.place(hist, 4, 5)
    assert p.shape == (2, 20) and valid(p, 16, 4, 5)
    assert (flashlb.place(hist, 4, 5, previous=p) == p).all()  # no improvement on its own plan: kept
    start = np.tile(np.arange(20) % 16, (2, 1))  # no expert twice on a rank
    s = swift_balancer.place(hist, 4, 5, previous=start, ranks_per_node=2)
    assert valid(s, 16, 4, 5) and not (s == start).all()
    # node mode: replicas stay inside the node that held the expert
    start = start.reshape(2, 2, 10)
    for layer in range(2):
        for node in range(2):
            assert set(s.reshape(2, 2, 10)[layer, node].tolist()) <= set(start[layer, node].tolist())
    with pytest.raises(ValueError):
        flashlb.place(hist, 2, 5)


# ---------------------------------------------------------------- the upstream code itself


def _stub(name, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


@pytest.fixture(scope="module")
def upstream():
    """Import upstream policy modules with their NPU/vLLM imports stubbed (numba's njit as identity)."""
    if not (UPSTREAM / "policy_flashlb.py").exists():
        pytest.skip(f"upstream tree {UPSTREAM} absent")
    pytest.importorskip("scipy")
    saved = dict(sys.modules)

    def njit(*a, **k):
        return a[0] if a and callable(a[0]) and not k else (lambda f: f)

    if importlib.util.find_spec("numba") is None:
        _stub("numba", njit=njit)
    if importlib.util.find_spec("torch") is None:
        _stub("torch", Tensor=object, npu=types.SimpleNamespace(device_count=lambda: 8))
    else:
        import torch

        torch.npu = types.SimpleNamespace(device_count=lambda: 8)  # type: ignore[attr-defined]
    _stub("torch_npu")
    _stub("vllm")
    _stub("vllm.logger", logger=logging.getLogger("upstream"))
    _stub("vllm_ascend")
    _stub("vllm_ascend.distributed")

    def no_group():
        raise RuntimeError("no group")

    _stub("vllm_ascend.distributed.parallel_state", get_dynamic_eplb_group=no_group)
    pkg = _stub("_upstream_policy")
    pkg.__path__ = [str(UPSTREAM)]
    mods = {}
    for name in ("policy_abstract", "policy_flashlb", "policy_swift_balancer"):
        spec = importlib.util.spec_from_file_location(f"_upstream_policy.{name}", UPSTREAM / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    yield mods
    for k in set(sys.modules) - set(saved):
        del sys.modules[k]
    sys.modules.update(saved)


class _Arr(np.ndarray):
    def numpy(self):
        return np.asarray(self)


def _slot_load(placement, load, ranks):
    """Per-slot load ``[L, R, S]`` the engine reports (a logical load split evenly over replicas)."""
    per = load / np.maximum(replica_counts(placement, load.shape[1]), 1)
    return np.take_along_axis(per, placement, axis=1).reshape(placement.shape[0], ranks, -1)


def _cases():
    rng = np.random.default_rng(11)
    out = [(EXAMPLE[None], 8, 2)]
    for _ in range(6):
        experts, ranks = int(rng.choice([8, 16, 32])), int(rng.choice([4, 8]))
        slots = experts // ranks + int(rng.integers(1, 3))
        w = int(rng.integers(1, 6))
        base = rng.gamma(0.7, 300.0, size=(1, 2, experts))
        out.append((rng.poisson(base * rng.uniform(0.6, 1.4, size=(w, 2, experts))).astype(float), ranks, slots))
    return out


@pytest.mark.parametrize("case", range(7))
def test_flashlb_matches_upstream(upstream, case):
    hist, ranks, slots = _cases()[case]
    w, layers, experts = hist.shape
    start = swift_balancer.initial_placement(layers, experts, ranks, slots)
    workload = np.stack([_slot_load(start, hist[t], ranks) for t in range(w)])
    try:
        _, _, dep = upstream["policy_flashlb"].FlashLB().rebalance_experts(start.reshape(layers, ranks, slots), workload)
    except IndexError:
        pytest.skip("upstream writes past the deployment array here (undefined under numba)")
    theirs = np.asarray(dep).reshape(layers, -1)
    ours = flashlb.place(hist, ranks, slots, previous=start)
    for layer in range(layers):
        assert (np.sort(replica_counts(ours, experts)[layer]) == np.sort(replica_counts(theirs, experts)[layer])).all()
    last = hist[-1]
    assert peak(ours, last, ranks) == pytest.approx(peak(theirs, last, ranks), rel=1e-6)
    assert np.allclose(rank_loads(ours, last, ranks).max(1), rank_loads(theirs, last, ranks).max(1))


@pytest.mark.parametrize("case", range(7))
def test_swift_balancer_matches_upstream(upstream, case):
    hist, ranks, slots = _cases()[case]
    load = hist.sum(axis=0)
    layers, experts = load.shape
    start = swift_balancer.initial_placement(layers, experts, ranks, slots)
    table = start.reshape(layers, ranks, slots).view(_Arr)
    workload = _slot_load(start, load, ranks).view(_Arr)
    _, _, dep = upstream["policy_swift_balancer"].SwiftBalanceEplb().rebalance_experts(table, workload)
    theirs = np.asarray(dep).reshape(layers, -1)
    ours = swift_balancer.place(hist, ranks, slots)
    assert (ours == theirs).all()


def test_flashlb_batched_tree_search_equals_reference():
    """The batched tree search (every layer and candidate at once) decides exactly as the per-layer reference."""
    from ascend_runtime.balancer.baselines.flashlb_batched import tree_search_layers

    rng = np.random.default_rng(5)
    for _ in range(12):
        experts, ranks = int(rng.choice([8, 16, 24])), int(rng.choice([4, 6, 8]))
        slots = -(-experts // ranks) + int(rng.integers(0, 3))
        hist = rng.poisson(rng.gamma(0.7, 200.0, size=(1, 3, experts)), size=(int(rng.integers(1, 6)), 3, experts))
        x = flashlb.samples(hist.astype(float))
        dep, rep, scores = tree_search_layers(x, ranks, slots)
        for layer in range(3):
            ref_dep, ref_rep, ref_score = flashlb.tree_search(x[:, layer], ranks, slots)
            assert (dep[layer] == ref_dep).all() and (rep[layer] == ref_rep).all()
            assert scores[layer] == ref_score
