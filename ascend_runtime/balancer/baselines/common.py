"""Shared input handling of the baselines."""

from __future__ import annotations

import numpy as np


def as_history(load: np.ndarray) -> np.ndarray:
    """``[L, E]`` or ``[W, L, E]`` -> float64 ``[W, L, E]`` (validated non-negative, finite)."""
    x = np.asarray(load, dtype=np.float64)
    if x.ndim == 2:
        x = x[None]
    if x.ndim != 3 or x.size == 0 or not np.isfinite(x).all() or (x < 0).any():
        raise ValueError(f"load must be a non-empty [L, E] or [W, L, E] array of non-negative numbers, got {x.shape}")
    return x
