"""Synthetic expert-load traces: skewed, drifting, with a few volatile experts; and trace families.

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


#: trace families of :func:`family_trace` (the placement benchmark's workloads)
FAMILIES: tuple[str, ...] = ("stable", "mean_reverting", "random_walk", "regime", "dominant")


def family_trace(
    family: str,
    windows: int,
    layers: int = 58,
    experts: int = 256,
    skew: float = 1.0,
    tokens: int = 16384,
    top_k: int = 8,
    seed: int = 0,
) -> np.ndarray:
    """Token counts ``[windows, L, E]`` (float64) of one load family; Poisson counts each window.

    - ``stable``: fixed lognormal popularity (``skew`` = std of log-popularity), Poisson noise only;
    - ``mean_reverting``: log-popularity an AR(1) around its base (``0.6`` persistence, ``0.25`` shocks);
    - ``random_walk``: log-popularity a Gaussian random walk (``0.1`` per window);
    - ``regime``: three popularity regimes (for example three tenants' traffic mixes); each window
      stays in its regime with probability ``0.7``, else moves to another one at random;
    - ``dominant``: one hot expert per layer taking 6-15% of the layer's tokens (a share that
      itself wanders), the rest as ``stable``.
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown trace family {family!r}; choose one of {', '.join(FAMILIES)}")
    rng = np.random.default_rng(seed)
    base = rng.normal(0.0, skew, size=(layers, experts))
    out = np.empty((windows, layers, experts))
    logit = base.copy()
    regimes = np.stack([base, *(rng.normal(0.0, skew, size=(2, layers, experts)))])
    regime = 0
    hot = rng.integers(0, experts, size=layers)
    hot_share = rng.uniform(0.06, 0.15, size=layers)
    for t in range(windows):
        if family == "regime":
            logit = regimes[regime]
            if rng.random() > 0.7:
                regime = int(rng.choice([r for r in range(len(regimes)) if r != regime]))
        p = np.exp(logit - logit.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        if family == "dominant":
            share = np.clip(hot_share * np.exp(rng.normal(0.0, 0.15, size=layers)), 0.02, 0.3)
            p = p * (1 - share)[:, None]
            p[np.arange(layers), hot] += share
        out[t] = rng.poisson(p * tokens * top_k)
        if family == "mean_reverting":
            logit = base + 0.6 * (logit - base) + rng.normal(0.0, 0.25, size=logit.shape)
        elif family == "random_walk":
            logit = logit + rng.normal(0.0, 0.1, size=logit.shape)
    return out
