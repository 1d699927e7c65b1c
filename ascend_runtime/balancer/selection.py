"""Choose a placement policy by how it fared on the observed windows (rolling-origin validation).

Input: ``history [W, L, E]`` (observed windows, oldest first, tokens). Candidates, each a
rule from past windows to a plan:

- ``("ours", rule, h)``: our planner (water filling on ``load + h * std``, LPT, swaps) on a
  forecast rule (:func:`forecast_of`): the decayed share average with newest-window weight
  ``rule`` (``0``: every window equally; ``1``: the last window), ``"shrink"`` or ``"similar"``;
  ``std`` (:func:`hedge_std`) the spread of the shares over the windows like the last one
  (default) or over every window. The default set is ``PlacementConfig.history_candidates``;
- ``("greedy", "last")`` / ``("greedy", "decay")`` (off by default): DeepSeek's EPLB greedy on
  the last window / on the decayed history, so a baseline that keeps winning on the past
  windows is what gets used (then refined by the swap search).

For each of the last ``holdout_windows`` windows ``t`` (with at least two windows before it),
every candidate is planned on ``history[:t]`` (no swap search in these trials; all layers, or
``trial_layers`` evenly spaced ones when that is set) and scored by
its vLLM balancedness on ``history[t]`` (the quantity the balancer is judged by: one bad
window costs what it loses, not the reciprocal). The candidate with the highest total wins
and is planned on the whole history. Only observed
windows are used; the window the plan is for is never seen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ascend_runtime.balancer.eplb_greedy import eplb_greedy
from ascend_runtime.balancer.forecast import (
    shrinkage_coefficient,
    shrinkage_forecast,
    similar_windows,
    similar_windows_forecast,
    similar_windows_std,
)
from ascend_runtime.balancer.measure import rank_loads


@dataclass
class Choice:
    """The chosen candidate; ``load``/``hedged [L, E]`` are its inputs on the whole history."""

    name: tuple
    load: np.ndarray
    hedged: np.ndarray
    scores: dict  # candidate -> minus the held-out balancedness summed over windows (lower is better)


def _balancedness(plan: np.ndarray, window: np.ndarray, ranks: int) -> float:
    """vLLM balancedness of ``plan`` on ``window``: sum over layers of mean / sum of max rank load."""
    loads = rank_loads(plan, window, ranks)
    return float(loads.mean(axis=1).sum() / max(loads.max(axis=1).sum(), 1e-12))


def _layer_balancedness(plan: np.ndarray, window: np.ndarray, ranks: int) -> np.ndarray:
    """Per-layer mean / max rank load ``[L]`` of ``plan`` on ``window``."""
    loads = rank_loads(plan, window, ranks)
    return loads.mean(axis=1) / np.maximum(loads.max(axis=1), 1e-12)


def _layer_loads(plans: np.ndarray, window: np.ndarray, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer (mean, max) rank load ``[K, L]`` each of ``plans [K, L, P]`` on ``window [L, E]``
    (all plans at once; a logical expert's load split evenly over its replicas)."""
    k, layers, total = plans.shape
    n = window.shape[1]
    flat = plans.reshape(k * layers, total) + (np.arange(k * layers) * n)[:, None]
    counts = np.bincount(flat.ravel(), minlength=k * layers * n).reshape(k, layers, n)
    per = (window[None] / np.maximum(counts, 1)).reshape(k * layers, n)
    loads = np.take_along_axis(per, plans.reshape(k * layers, total), axis=1).reshape(k, layers, ranks, -1).sum(axis=3)
    return loads.mean(axis=2), loads.max(axis=2)


def _decide(scores: np.ndarray, per_layer: np.ndarray, cands: list[tuple], config) -> int:
    """Index of the chosen candidate. ``scores [C]``: minus held-out balancedness summed over
    windows; ``per_layer [C, T, L]``: held-out per-layer balancedness.

    The default candidate (``config.selection_default``, when present) is kept unless another
    one is better by at least ``config.selection_evidence`` standard errors of the paired
    per-layer differences (over held-out windows x layers); among the candidates that clear
    that bar (and the default) the best total wins. Without a default: the best total."""
    default = tuple(config.selection_default) if config.selection_default else None
    if default not in cands:
        return int(np.argmin(scores))
    base = cands.index(default)
    d = (per_layer - per_layer[base]).reshape(len(cands), -1)  # [C, T*L]
    mean = d.mean(axis=1)
    se = d.std(axis=1, ddof=1) / np.sqrt(d.shape[1]) if d.shape[1] > 1 else np.zeros(len(cands))
    ok = mean > config.selection_evidence * se + 1e-12
    ok[base] = True
    return int(np.argmin(np.where(ok, scores, np.inf)))


def decayed_shares(history: np.ndarray, decay: float) -> np.ndarray:
    """Decayed average of per-layer shares ``[L, E]`` times the last window's layer totals.

    ``decay``: newest-window weight (1 = last window); 0 = every window equally."""
    totals = history.sum(axis=2, keepdims=True)
    share = history / np.where(totals > 0, totals, 1.0)
    if decay <= 0:
        avg = share.mean(axis=0)
    else:
        avg = share[0]
        for s in share[1:]:
            avg = (1 - decay) * avg + decay * s
    return avg * totals[-1]


def share_std(history: np.ndarray) -> np.ndarray:
    """Sample std over windows of the per-layer shares, times the last window's totals ``[L, E]``."""
    totals = history.sum(axis=2, keepdims=True)
    share = history / np.where(totals > 0, totals, 1.0)
    sd = share.std(axis=0, ddof=1) if history.shape[0] > 1 else np.zeros(history.shape[1:])
    return sd * totals[-1]


def hedge_std(past: np.ndarray, config, mask: np.ndarray | None = None) -> np.ndarray:
    """The std ``[L, E]`` (tokens) the hedged candidates add multiples of: ``config.hedge_std``
    ``"similar"`` = the spread over the windows like the last one (:func:`similar_windows_std`;
    ``mask [W, L]``: its windows if already computed), ``"all"`` = the spread over every window
    (:func:`share_std`)."""
    if config.hedge_std not in ("similar", "all"):
        raise ValueError(f"hedge_std must be 'similar' or 'all', not {config.hedge_std!r}")
    return similar_windows_std(past, mask=mask) if config.hedge_std == "similar" else share_std(past)


def candidates(config) -> list[tuple]:
    """Candidate names of ``config`` (``PlacementConfig``), ours first: ``config.history_candidates``
    (``(rule, hedge)`` pairs) or, when that is None, every rule of ``history_decays`` and
    ``history_rules`` with every hedge of ``history_hedges``."""
    if config.history_candidates is not None:
        out: list[tuple] = [("ours", r, float(h)) for r, h in config.history_candidates]
    else:
        rules = (*config.history_decays, *config.history_rules)
        out = [("ours", d, h) for d in rules for h in config.history_hedges]
    names = {"greedy": ("greedy", "last"), "greedy_decay": ("greedy", "decay")}
    out += [names[b] for b in config.baseline_candidates]
    return out


def forecast_of(rule, past: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Forecast ``[L, E]`` of one forecast rule on ``past [W, L, E]``: a float is the newest-window
    weight of :func:`decayed_shares`; ``"shrink"`` / ``"similar"`` are
    :func:`~ascend_runtime.balancer.forecast.shrinkage_forecast` /
    :func:`~ascend_runtime.balancer.forecast.similar_windows_forecast` (``mask [W, L]``: its
    windows if already computed)."""
    if rule == "shrink":
        return shrinkage_forecast(past)
    if rule == "similar":
        return similar_windows_forecast(past, mask=mask)
    return decayed_shares(past, float(rule))


def window_weights(name: tuple, past: np.ndarray, config) -> np.ndarray:
    """Weights ``[L, W]`` (each row sums to 1) that candidate ``name``'s forecast puts on the
    windows of ``past [W, L, E]`` (in shares): the load distribution the forecast summarises,
    used as the robust swap search's scenarios (``robust.refine_robust``)."""
    w, layers, _ = past.shape
    if name[0] == "greedy":
        rule = 1.0 if name[1] == "last" else config.baseline_decay
    else:
        rule = name[1]
    if rule == "similar":
        mask = similar_windows(past).T.astype(np.float64)  # [L, W]
        return mask / mask.sum(axis=1, keepdims=True)
    if rule == "shrink":
        phi = shrinkage_coefficient(past)
        wt = np.full(w, (1 - phi) / w)
        wt[-1] += phi
    else:
        d = float(rule)
        if d <= 0:
            wt = np.full(w, 1.0 / w)
        else:
            wt = d * (1 - d) ** np.arange(w - 1, -1, -1, dtype=np.float64)
            wt[0] = (1 - d) ** (w - 1)
    return np.broadcast_to(wt / wt.sum(), (layers, w)).copy()


def inputs(name: tuple, past: np.ndarray, config) -> tuple[np.ndarray, np.ndarray]:
    """``(load, hedged)`` ``[L, E]`` of candidate ``name`` from ``past [W, L, E]``."""
    if name[0] == "greedy":
        load = past[-1] if name[1] == "last" else decayed_shares(past, config.baseline_decay)
        return load, load
    _, d, h = name
    load = forecast_of(d, past)
    return load, load + h * hedge_std(past, config) if h else load


def choose(history: np.ndarray, ranks: int, slots: int, groups: int | None, nodes: int | None, config) -> Choice | None:
    """The candidate with the lowest held-out peaks, or None with fewer than 3 windows."""
    from ascend_runtime.balancer.placement import _solve

    original = history
    w, layers, _ = history.shape
    times = list(range(max(2, w - config.holdout_windows), w))
    if layers > config.trial_layers > 0:  # the choice is one for all layers: score it on a spread subset
        history = history[:, np.linspace(0, layers - 1, config.trial_layers).round().astype(int)]
        full = None
    else:
        full = history
    cands = candidates(config)
    if not times or len(cands) < 2:
        return None
    ours = [c for c in cands if c[0] == "ours"]
    decays = list(dict.fromkeys(c[1] for c in ours))
    scores = np.zeros(len(cands))
    per_layer = np.zeros((len(cands), len(times), history.shape[1]))  # per-layer balancedness
    problems, meta = [], []
    for t in times:
        past = history[:t]
        mask = similar_windows(past)  # shared by the "similar" rule and the hedges
        sd = hedge_std(past, config, mask) if any(c[2] for c in ours) else None
        for d in decays:
            group = [c for c in ours if c[1] == d]
            load = forecast_of(d, past, mask)  # once per rule; the hedges only add std multiples
            problems.append((load, [load + c[2] * sd if c[2] else load for c in group]))
            meta.append((t, group))
    solved = _solve(problems, ranks, slots, groups, nodes, config.trial_swap_rounds) if problems else []
    for (t, group), plans in zip(meta, solved):
        mean, peak = _layer_loads(np.asarray(plans), history[t], ranks)  # [K, L] each
        idx = [cands.index(c) for c in group]
        scores[idx] -= mean.sum(axis=1) / np.maximum(peak.sum(axis=1), 1e-12)
        per_layer[idx, times.index(t)] = mean / np.maximum(peak, 1e-12)
    greedy = [(c, t) for c in cands if c[0] == "greedy" for t in times]
    if greedy:  # one batched call: the trials' layers stacked
        layers = history.shape[1]  # the trial layers
        plans = eplb_greedy(np.concatenate([inputs(c, history[:t], config)[0] for c, t in greedy]), ranks, slots, groups, nodes)
        for k, (c, t) in enumerate(greedy):
            obs = history[t]
            plan = plans[k * layers:(k + 1) * layers]
            i = cands.index(c)
            scores[i] -= _balancedness(plan, obs, ranks)
            per_layer[i, times.index(t)] = _layer_balancedness(plan, obs, ranks)
    best = cands[_decide(scores, per_layer, cands, config)]
    load, hedged = inputs(best, full if full is not None else original, config)
    return Choice(best, load, hedged, dict(zip(cands, scores.tolist())))
