"""Forecast the next window's expert load from past windows.

Each window is normalised per layer to load *shares* (so traffic swings do
not bias the forecast) and folded into several exponentially decayed averages
at once. The average whose one-step-ahead forecast error has been smallest so
far is the forecast: slow decay when load is noisy but stable, fast decay when
it drifts. The per-expert spread of that error is the *volatility*, used to
hedge replicas toward experts whose load jumps around.

Two more forecast rules work on a window history ``[W, L, E]`` (the planner's rolling-origin
choice, ``selection.py``, decides by held-out windows which one to trust):

- :func:`shrinkage_forecast`: each expert's share shrunk from its last value toward its mean over
  the history by one pooled AR(1) coefficient fitted on the history itself (1 = the last window,
  0 = the mean): load that reverts to a long-run level is forecast as reverting;
- :func:`similar_windows_forecast`: the mean of the windows that are indistinguishable from the
  last one within sampling noise (change-point rule): after a regime switch only the windows of
  the new (or a recurring) regime count, and in stable load all of them.
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
    #: the last ``keep`` windows folded in ``[W, L, E]`` (tokens, oldest first), for the
    #: planner's rolling-origin choice (``selection.py``)
    history: np.ndarray | None = None


class LoadForecaster:
    """Exponentially decayed accumulator of expert load windows with adaptive decay.

    ``alpha`` is the weight of the newest window (1.0 = last window only). With
    ``alpha`` given, only that decay is used; by default the best of
    :data:`DEFAULT_ALPHAS` by one-step squared error is chosen.
    """

    def __init__(self, alpha: float | None = None, error_decay: float = 0.3, holdouts: int = 3, keep: int = 16) -> None:
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
        self.keep = keep
        self._windows: list[np.ndarray] = []

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
        self._windows = [*self._windows, self._last][-self.keep:] if self.keep > 0 else []

    def forecast(self) -> Forecast:
        """The current forecast; raises ``RuntimeError`` before the first window."""
        if self._state is None:
            raise RuntimeError("no load window seen yet")
        best = int(np.argmin(self._score)) if self.windows > 1 else 0
        mean = self._state[best] * self.scale
        std = np.sqrt(self._sqerr[best]) * self.scale
        return Forecast(mean=mean, std=std, alpha=float(self.alphas[best]), windows=self.windows, holdout=list(self._holdout) or None,
                        last=self._last, history=np.stack(self._windows) if self._windows else None)


def _shares(history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``history [W, L, E]`` -> (shares ``[W, L, E]``, layer totals ``[W, L, 1]``)."""
    totals = history.sum(axis=2, keepdims=True)
    return history / np.where(totals > 0, totals, 1.0), totals


def shrinkage_coefficient(history: np.ndarray) -> float:
    """Pooled AR(1) coefficient in ``[0, 1]`` of the per-expert shares of ``history [W, L, E]``.

    Least squares of ``s[t] - m`` on ``s[t-1] - m`` over every window pair, layer and expert
    (``m``: each expert's mean share over the history). Sampling noise in ``s[t-1]`` lowers it,
    which is the shrinkage the noisy last window deserves. 1.0 with fewer than 2 windows."""
    if history.shape[0] < 2:
        return 1.0
    share, _ = _shares(np.asarray(history, dtype=np.float64))
    dev = share - share.mean(axis=0)
    den = float((dev[:-1] ** 2).sum())
    return float(np.clip((dev[:-1] * dev[1:]).sum() / den, 0.0, 1.0)) if den > 0 else 1.0


def shrinkage_forecast(history: np.ndarray) -> np.ndarray:
    """Forecast ``[L, E]`` (tokens at the last window's layer totals): ``m + phi (s_last - m)``
    per expert share, ``phi`` = :func:`shrinkage_coefficient`, ``m`` the mean share."""
    history = np.asarray(history, dtype=np.float64)
    share, totals = _shares(history)
    m = share.mean(axis=0)
    return (m + shrinkage_coefficient(history) * (share[-1] - m)) * totals[-1]


def similar_windows(history: np.ndarray, tolerance: float = 2.0) -> np.ndarray:
    """Mask ``[W, L]``: window ``u`` of layer ``l`` is within sampling noise of the last window.

    The L1 distance between the two windows' shares is compared with its expectation if both
    were Poisson samples of the same shares (``sqrt(2/pi) sum_e sqrt(p_e/N_u + p_e/N_last)``,
    ``N`` = the layer's tokens); ``u`` counts as similar when the ratio is at most
    ``tolerance``. The last window is always similar."""
    history = np.asarray(history, dtype=np.float64)
    share, totals = _shares(history)
    last = share[-1]
    dist = np.abs(share - last).sum(axis=2)  # [W, L]
    pooled = 0.5 * (share + last)
    inv = 1.0 / np.maximum(totals, 1.0)
    noise = np.sqrt(2 / np.pi) * np.sqrt(pooled * (inv + inv[-1])).sum(axis=2)  # [W, L]
    mask = dist <= tolerance * np.maximum(noise, 1e-300)
    mask[-1] = True
    return mask


def similar_windows_std(history: np.ndarray, tolerance: float = 2.0, mask: np.ndarray | None = None) -> np.ndarray:
    """Spread ``[L, E]`` (tokens at the last window's layer totals) of each expert's share over the
    windows :func:`similar_windows` keeps (sample std, ddof 1; 0 where a layer keeps one window).

    The forecast uncertainty *inside the current regime*: after a switch, the std over every window
    measures the distance between regimes, and hedging replicas by it sizes them for the regime
    that has ended. ``mask [W, L]``: :func:`similar_windows` if already computed."""
    history = np.asarray(history, dtype=np.float64)
    share, totals = _shares(history)
    mask = (similar_windows(history, tolerance) if mask is None else mask)[:, :, None].astype(np.float64)
    k = mask.sum(axis=0)
    mean = (share * mask).sum(axis=0) / k
    var = (((share - mean) ** 2) * mask).sum(axis=0) / np.maximum(k - 1.0, 1.0)
    return np.sqrt(var) * totals[-1]


def similar_windows_forecast(history: np.ndarray, tolerance: float = 2.0, mask: np.ndarray | None = None) -> np.ndarray:
    """Forecast ``[L, E]`` (tokens at the last window's layer totals): per layer, the mean share
    of the windows :func:`similar_windows` keeps (``mask [W, L]`` if already computed)."""
    history = np.asarray(history, dtype=np.float64)
    share, totals = _shares(history)
    mask = (similar_windows(history, tolerance) if mask is None else mask)[:, :, None]
    return (share * mask).sum(axis=0) / mask.sum(axis=0) * totals[-1]
