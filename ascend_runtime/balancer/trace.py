"""Synthetic expert-load traces: skewed, drifting, with a few volatile experts.

Per layer, log-popularity starts as ``N(0, skew^2)`` and takes a Gaussian
random walk of ``drift`` per window; a fraction of experts is *volatile*
(an extra lognormal jitter each window). Counts per window are Poisson around
``tokens * top_k * share``. Used by the benchmark and the tests.
"""

from __future__ import annotations

import numpy as np


def synthetic_trace(
    windows: int,
    layers: int = 58,
    experts: int = 256,
    skew: float = 1.0,
    drift: float = 0.05,
    tokens: int = 16384,
    top_k: int = 8,
    volatile_fraction: float = 0.05,
    volatility: float = 0.5,
    seed: int = 0,
) -> np.ndarray:
    """Token counts ``[windows, L, E]`` (float64)."""
    rng = np.random.default_rng(seed)
    logit = rng.normal(0.0, skew, size=(layers, experts))
    volatile = rng.random((layers, experts)) < volatile_fraction
    out = np.empty((windows, layers, experts))
    for t in range(windows):
        jitter = np.where(volatile, rng.normal(0.0, volatility, size=(layers, experts)), 0.0)
        p = np.exp(logit + jitter)
        p /= p.sum(axis=1, keepdims=True)
        out[t] = rng.poisson(p * tokens * top_k)
        logit = logit + rng.normal(0.0, drift, size=(layers, experts))
    return out
