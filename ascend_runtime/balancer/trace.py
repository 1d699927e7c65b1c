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


class FamilyProcess:
    """The latent state of one load family (:data:`FAMILIES`) and its step to the next window.

    State: ``logit [L, E]`` (log-popularity of the coming window), the family's fixed parts
    (``base``, the three ``regimes``, the ``hot`` expert and ``hot_share`` of each layer) and the
    current regime. :meth:`step` draws one window ``[L, E]`` (Poisson token counts) and moves the
    state on; :meth:`next_scenarios` draws windows the next step could give from what the windows so
    far determine, which is what a planner that knew the process exactly (but not the next window's
    innovations or its sampling noise) would plan on.
    """

    def __init__(self, family: str, layers: int = 58, experts: int = 256, skew: float = 1.0,
                 tokens: int = 16384, top_k: int = 8, seed: int = 0):
        if family not in FAMILIES:
            raise ValueError(f"unknown trace family {family!r}; choose one of {', '.join(FAMILIES)}")
        self.family, self.layers, self.scale = family, layers, tokens * top_k
        self.rng = np.random.default_rng(seed)
        rng = self.rng
        self.base = rng.normal(0.0, skew, size=(layers, experts))
        self.logit = self.base.copy()
        self.regimes = np.stack([self.base, *(rng.normal(0.0, skew, size=(2, layers, experts)))])
        self.regime = 0
        self.hot = rng.integers(0, experts, size=layers)
        self.hot_share = rng.uniform(0.06, 0.15, size=layers)

    def step(self, rng: np.random.Generator | None = None) -> np.ndarray:
        """One window ``[L, E]`` of token counts (float64); moves the state to the next window.
        ``rng``: the random source (default: the process's own, which :func:`family_trace` uses)."""
        rng = self.rng if rng is None else rng
        if self.family == "regime":
            self.logit = self.regimes[self.regime]
            self.window_regime = self.regime
            self.regime = self._next_regime(self.regime, rng)  # drawn here: the draw order family_trace keeps
        logit = self.window_logit = self.logit
        window = self._counts(logit, rng)
        self.logit = self._next_logit(logit, rng)
        return window

    def _next_regime(self, regime: int, rng: np.random.Generator) -> int:
        """The regime after ``regime``: the same with probability 0.7, else another one at random."""
        if rng.random() > 0.7:
            return int(rng.choice([r for r in range(len(self.regimes)) if r != regime]))
        return regime

    def _next_logit(self, logit: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The log-popularity ``[L, E]`` after a window of ``logit``: an AR(1) or random-walk step, else
        the same (regimes switch in :meth:`_next_regime`)."""
        if self.family == "mean_reverting":
            return self.base + 0.6 * (logit - self.base) + rng.normal(0.0, 0.25, size=logit.shape)
        if self.family == "random_walk":
            return logit + rng.normal(0.0, 0.1, size=logit.shape)
        return logit

    def _counts(self, logit: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Poisson token counts ``[L, E]`` of one window of log-popularity ``logit [L, E]`` (the hot
        expert's share drawn in the ``dominant`` family)."""
        layers = self.layers
        p = np.exp(logit - logit.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        if self.family == "dominant":
            share = np.clip(self.hot_share * np.exp(rng.normal(0.0, 0.15, size=layers)), 0.02, 0.3)
            p = p * (1 - share)[:, None]
            p[np.arange(layers), self.hot] += share
        return rng.poisson(p * self.scale).astype(np.float64)

    def next_scenarios(self, k: int, seed: int = 0) -> np.ndarray:
        """``k`` independent draws ``[k, L, E]`` of the next window given what the windows so far
        determine (the last window's log-popularity and regime, the family's fixed parts): the
        innovation into the next window (a regime switch, an AR(1) or random-walk shock, the hot
        share) and the sampling noise are drawn anew for each, from ``seed``. Needs one
        :meth:`step` first; the state is not moved."""
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(k):
            if self.family == "regime":
                logit = self.regimes[self._next_regime(self.window_regime, rng)]
            else:
                logit = self._next_logit(self.window_logit, rng)
            out.append(self._counts(logit, rng))
        return np.stack(out)


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

    :class:`FamilyProcess` is the generator; its state after these windows gives the next one.
    """
    process = FamilyProcess(family, layers, experts, skew, tokens, top_k, seed)
    return np.stack([process.step() for _ in range(windows)])
