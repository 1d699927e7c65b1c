"""Forecast the next window's expert load from past windows.

Each window is normalised per layer to load *shares* (so traffic swings do
not bias the forecast) and folded into several exponentially decayed averages
at once. The average whose one-step-ahead forecast error has been smallest so
far is the forecast: slow decay when load is noisy but stable, fast decay when
it drifts. The per-expert spread of that error is the *volatility*, used to
hedge replicas toward experts whose load jumps around.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_ALPHAS: tuple[float, ...] = (1.0, 0.6, 0.35, 0.2, 0.1)


@dataclass
class Forecast:
    """``mean [L, E]`` and ``std [L, E]`` in tokens per window; ``alpha`` chosen."""

    mean: np.ndarray
    std: np.ndarray
    alpha: float
    windows: int
    #: ``[(mean, std, window), ...]``, newest last: the forecasts made before each of the
    #: last few windows, and that window (tokens). Lets the planner pick its hedging by how
    #: plans fared on load they had not seen. A 4th element is the window observed just before
    #: that window (what a last-window planner such as EPLB's greedy would have used).
    holdout: list[tuple[np.ndarray, ...]] | None = None
    #: the last window folded in (tokens), or None
    last: np.ndarray | None = None


class LoadForecaster:
    """Exponentially decayed accumulator of expert load windows with adaptive decay.

    ``alpha`` is the weight of the newest window (1.0 = last window only). With
    ``alpha`` given, only that decay is used; by default the best of
    :data:`DEFAULT_ALPHAS` by one-step squared error is chosen.
    """

    def __init__(self, alpha: float | None = None, error_decay: float = 0.3, holdouts: int = 3) -> None:
        self.alphas = (alpha,) if alpha is not None else DEFAULT_ALPHAS
        self.error_decay = error_decay
        self.windows = 0
        self.scale = 0.0  # decayed tokens per layer per window
        self._state: np.ndarray | None = None  # [A, L, E] shares
        self._sqerr: np.ndarray | None = None  # [A, L, E] decayed squared error of shares
        self._score: np.ndarray | None = None  # [A] decayed total squared error
        self.holdouts = holdouts
        self._holdout: list[tuple[np.ndarray, ...]] = []
        self._last: np.ndarray | None = None

    def update(self, window: np.ndarray) -> None:
        """Fold one window ``[L, E]`` of token counts in. Empty windows are ignored."""
        window = np.asarray(window, dtype=np.float64)
        totals = window.sum(axis=1, keepdims=True)
        if not np.all(totals > 0):
            return
        share = window / totals
        tokens = float(totals.mean())
        if self.windows >= 2:
            before = self.forecast()
            self._holdout = [*self._holdout, (before.mean, before.std, window.copy(), self._last)][-self.holdouts :]
        alphas = np.asarray(self.alphas)[:, None, None]
        if self._state is None:
            self._state = np.broadcast_to(share, (len(self.alphas), *share.shape)).copy()
            self._sqerr = np.zeros_like(self._state)
            self._score = np.zeros(len(self.alphas))
            self.scale = tokens
        else:
            err2 = (share[None] - self._state) ** 2
            d = self.error_decay
            self._sqerr = (1 - d) * self._sqerr + d * err2 if self.windows > 1 else err2
            self._score = (1 - d) * self._score + d * err2.sum(axis=(1, 2)) if self.windows > 1 else err2.sum(axis=(1, 2))
            self._state = (1 - alphas) * self._state + alphas * share[None]
            self.scale = 0.5 * self.scale + 0.5 * tokens
        self.windows += 1
        self._last = window.copy()

    def forecast(self) -> Forecast:
        """The current forecast; raises ``RuntimeError`` before the first window."""
        if self._state is None:
            raise RuntimeError("no load window seen yet")
        best = int(np.argmin(self._score)) if self.windows > 1 else 0
        mean = self._state[best] * self.scale
        std = np.sqrt(self._sqerr[best]) * self.scale
        return Forecast(mean=mean, std=std, alpha=float(self.alphas[best]), windows=self.windows, holdout=list(self._holdout) or None,
                        last=self._last)
