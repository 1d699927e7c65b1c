"""Placement that is good over a forecast *distribution*, not one point forecast.

A point forecast ``[L, E]`` is wrong by the next window's noise; the plan that balances it
perfectly is rarely the one with the lowest peak on the load that arrives. Here a plan is judged
on ``K`` load *scenarios* per layer (``[L, K, E]``, tokens): the objective of a layer is the mean
over scenarios of its most loaded rank's load (the quantity vLLM's balancedness divides by),
and the swap search minimises that objective directly, vectorised over layers x scenarios.

Scenarios (built by ``placement._robust_refine``): the observed windows themselves, in per-layer
shares at the forecast's layer totals, weighted as the chosen forecast rule weights them
(``selection.window_weights``), so the plan is good over the load distribution the forecast
summarises, with the experts' loads as correlated as they were. FlashLB (vLLM-Ascend
``vllm_ascend/eplb/core/policy/policy_flashlb.py``, v0.23.0) scores its candidates on samples of
the history in the same spirit; this module shares no code with it.

Shapes: ``B`` sub-problems (layers, or layer x node), ``K`` scenarios, ``n`` experts of the
sub-problem, ``R`` ranks, ``S`` slots per rank.
"""

from __future__ import annotations

import numpy as np


def shares(history: np.ndarray) -> np.ndarray:
    """Per-layer shares ``[W, L, E]`` of ``history [W, L, E]`` (empty layers stay 0)."""
    totals = history.sum(axis=2, keepdims=True)
    return history / np.where(totals > 0, totals, 1.0)


def scenario_peaks(ids: np.ndarray, per: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Mean over scenarios of the peak rank load ``[B]`` (weighted by ``weights [B, K]`` if given).

    ``ids [B, R, S]`` expert ids; ``per [B, K, n]`` per-replica load of each expert in each
    scenario (scenario load / replica count)."""
    rows, ranks, slots = ids.shape
    k = per.shape[1]
    flat = np.broadcast_to(ids.reshape(rows, 1, -1), (rows, k, ranks * slots))
    loads = np.take_along_axis(per, flat, axis=2).reshape(rows, k, ranks, slots).sum(axis=3)
    peak = loads.max(axis=2)
    return peak.mean(axis=1) if weights is None else (peak * weights).sum(axis=1)


def layer_scenario_peaks(placement: np.ndarray, scen: np.ndarray, ranks: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Mean over scenarios (weighted by ``weights [L, K]`` if given) of each layer's peak rank
    load ``[L]`` for ``placement [L, R*S]`` under ``scen [L, K, E]`` (a logical expert's load
    split evenly over its replicas)."""
    layers, total = placement.shape
    n = scen.shape[2]
    counts = np.zeros((layers, n))
    np.add.at(counts, (np.repeat(np.arange(layers), total), placement.ravel()), 1.0)
    per = scen / np.maximum(counts, 1.0)[:, None, :]
    return scenario_peaks(placement.reshape(layers, ranks, -1), per, weights)


def refine_robust(ids: np.ndarray, per: np.ndarray, rounds: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Swap search on the mean-over-scenarios peak. ``ids [B, R, S]``, ``per [B, K, n]``,
    ``weights [B, K]`` (summing to 1 per row; default equal) make it a weighted mean.

    Each round, in every still-active row: the *critical* rank (the most loaded one in the most
    scenarios, ties to the higher mean load) and every 1-for-1 swap of one of its replicas with a
    replica on another rank (no expert twice on a rank) are scored exactly (the new peak of each
    scenario from the two changed ranks and the largest untouched rank); the best swap is applied
    if it lowers the row's objective. Rows stop when no swap helps. Returns a copy.
    """
    ids = ids.copy()
    rows, ranks, slots = ids.shape
    k = per.shape[1]
    total = ranks * slots
    rank_of = np.repeat(np.arange(ranks), slots)
    wt = np.full((rows, k), 1.0 / k) if weights is None else np.asarray(weights, dtype=np.float64)
    active = np.arange(rows)
    for _ in range(rounds):
        if active.size == 0:
            break
        b = active.size
        ar = np.arange(b)
        wk = wt[active]  # [b, K]
        idb = ids[active]  # [b, R, S]
        pb = per[active]  # [b, K, n]
        w = np.take_along_axis(pb, np.broadcast_to(idb.reshape(b, 1, total), (b, k, total)), axis=2)  # [b, K, P]
        loads = w.reshape(b, k, ranks, slots).sum(axis=3)  # [b, K, R]
        peak = loads.max(axis=2)  # [b, K]
        obj = (peak * wk).sum(axis=1)
        top = loads.argmax(axis=2)  # [b, K]
        crit = np.zeros((b, ranks))
        np.add.at(crit, (np.repeat(ar, k), top.ravel()), wk.ravel())
        a = (crit + 1e-6 * loads.mean(axis=1) / np.maximum(obj, 1e-300)[:, None]).argmax(axis=1)  # [b]
        # largest and second largest rank load per scenario with rank a removed
        masked = loads.copy()
        masked[ar, :, a] = -np.inf
        o1 = masked.argmax(axis=2)  # [b, K]
        v1 = np.take_along_axis(masked, o1[:, :, None], axis=2)[:, :, 0]
        np.put_along_axis(masked, o1[:, :, None], -np.inf, axis=2)
        v2 = masked.max(axis=2)
        # untouched max when rank rb also changes: [b, K, R]
        other = np.where(np.arange(ranks)[None, None, :] == o1[:, :, None], v2[:, :, None], v1[:, :, None])
        la = loads[ar, :, a]  # [b, K]
        xa = w.reshape(b, k, ranks, slots)[ar, :, a]  # [b, K, S]
        d = xa[:, :, :, None] - w[:, :, None, :]  # [b, K, S, P]
        new = np.maximum(np.maximum(la[:, :, None, None] - d, loads[:, :, rank_of][:, :, None, :] + d),
                         other[:, :, rank_of][:, :, None, :])
        cand = np.einsum("bksp,bk->bsp", new, wk)  # [b, S, P]
        xid = idb[ar, a]  # [b, S]
        idf = idb.reshape(b, total)
        bad = (rank_of[None, :] == a[:, None])[:, None, :]
        x_there = (idb[:, None, :, :] == xid[:, :, None, None]).any(axis=3)  # [b, S, R]
        y_here = (idf[:, :, None] == xid[:, None, :]).any(axis=2)  # [b, P]
        bad = bad | x_there[:, :, rank_of] | y_here[:, None, :]
        cand = np.where(bad, np.inf, cand)
        flat = cand.reshape(b, -1).argmin(axis=1)
        best = cand.reshape(b, -1)[ar, flat]
        ok = best < obj * (1 - 1e-9)
        if not ok.any():
            break
        sel = active[ok]
        i, j = np.divmod(flat[ok], total)
        ra, rb, sb = a[ok], rank_of[j], j % slots
        x, y = ids[sel, ra, i], ids[sel, rb, sb]
        ids[sel, ra, i], ids[sel, rb, sb] = y, x
        active = sel
    return ids


def per_replica(scen: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``scen [B, K, n]`` / ``counts [B, n]`` -> per-replica scenario load ``[B, K, n]``."""
    return scen / np.maximum(counts, 1)[:, None, :]

