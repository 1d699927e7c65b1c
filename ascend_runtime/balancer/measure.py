"""Measures of a placement: replica counts, rank loads, balancedness, moved slots.

Conventions used across the balancer:

- ``load``: float array ``[L, E]``, tokens routed to each logical expert of each
  MoE layer in a window (or a forecast of it). Unit: tokens (any consistent scale).
- ``placement``: int array ``[L, R*S]``, the logical expert id held by each
  physical slot; rank ``r`` owns slots ``r*S .. r*S+S-1`` (slot order kept).
- A logical expert's load is split evenly over its replicas (vLLM's model).
"""

from __future__ import annotations

import numpy as np


def replica_counts(placement: np.ndarray, num_experts: int) -> np.ndarray:
    """Replicas of each logical expert. ``placement [L, P]`` -> ``[L, E]`` int64."""
    placement = np.asarray(placement, dtype=np.int64)
    layers = placement.shape[0]
    flat = placement + (np.arange(layers, dtype=np.int64) * num_experts)[:, None]
    return np.bincount(flat.ravel(), minlength=layers * num_experts).reshape(layers, num_experts)


def rank_loads(placement: np.ndarray, load: np.ndarray, ranks: int) -> np.ndarray:
    """Load of each rank. ``placement [L, R*S]``, ``load [L, E]`` -> ``[L, R]`` (tokens)."""
    placement = np.asarray(placement, dtype=np.int64)
    load = np.asarray(load, dtype=np.float64)
    counts = replica_counts(placement, load.shape[1])
    per_replica = load / np.maximum(counts, 1)
    slot_load = np.take_along_axis(per_replica, placement, axis=1)
    return slot_load.reshape(placement.shape[0], ranks, -1).sum(axis=2)


def balancedness(placement: np.ndarray, load: np.ndarray, ranks: int) -> float:
    """vLLM's balancedness: sum over layers of mean rank load / sum of max rank load.

    1.0 is perfect; ``1/R`` is everything on one rank. Returns 1.0 for zero load.
    """
    loads = rank_loads(placement, load, ranks)
    peak = loads.max(axis=1).sum()
    return float(loads.mean(axis=1).sum() / peak) if peak > 0 else 1.0


def layer_balancedness(placement: np.ndarray, load: np.ndarray, ranks: int) -> np.ndarray:
    """Per-layer mean/max rank load ``[L]`` (SGLang averages these)."""
    loads = rank_loads(placement, load, ranks)
    peak = loads.max(axis=1)
    return np.where(peak > 0, loads.mean(axis=1) / np.where(peak > 0, peak, 1.0), 1.0)


def moved_slots(previous: np.ndarray, placement: np.ndarray, ranks: int, num_experts: int) -> int:
    """Expert weights a rank must newly load to go from ``previous`` to ``placement``.

    Counted per (layer, rank) as the multiset difference new - old, so
    reordering slots inside a rank costs nothing. Both ``[L, R*S]``.
    """
    prev = np.asarray(previous, dtype=np.int64)
    new = np.asarray(placement, dtype=np.int64)
    layers, slots_total = new.shape
    slots = slots_total // ranks
    cell = (np.arange(layers)[:, None] * ranks + np.repeat(np.arange(ranks), slots)[None, :]) * num_experts

    def keyed(x: np.ndarray) -> np.ndarray:  # (cell, expert, occurrence) as one sorted int key
        k = np.sort((cell + x).ravel())
        first = np.r_[0, np.nonzero(k[1:] != k[:-1])[0] + 1]
        occ = np.arange(k.size) - np.repeat(first, np.diff(np.r_[first, k.size]))
        return k * slots + occ

    return int(new.size - np.intersect1d(keyed(prev), keyed(new), assume_unique=True).size)
