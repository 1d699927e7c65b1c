"""FlashLB's v0.23.0 tree search, batched over layers and candidates (same decisions, faster).

:func:`ascend_runtime.balancer.baselines.flashlb.tree_search` follows upstream one layer
and one candidate at a time (about 10 s for 58 layers x 288 slots). This module makes
the same decisions with numpy over a batch ``B`` of (layer, candidate) rows: for each
tree level, every layer's up to ``2*width + 1`` candidate splits are placed by the
risk-aware LPT together and scored together; each layer then takes the candidate the
upstream neighbour search would take (initial first, then ``-r`` before ``+r``, strict
improvement). Float32 accumulators and the accumulation order of the per-rank
covariance sums are the reference's, so results are identical (checked in
``tests/balancer/test_baselines.py`` against the per-layer reference).

Shapes: ``T`` samples, ``L`` layers, ``n`` experts, ``R`` ranks, ``S`` slots per rank.
"""

from __future__ import annotations

import math

import numpy as np

from ascend_runtime.balancer.baselines.flashlb import DEPTH, WIDTH, Z_SCORE, min_max_history

#: rows of one LPT batch at most (bounds the ``[B, R, n]`` covariance accumulator)
_CHUNK_CELLS = 4_000_000


def _stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x [T, L, n]`` -> mean, unbiased variance ``[L, n]`` and covariance ``[L, n, n]``."""
    t, layers, n = x.shape
    mu = x.mean(axis=0)
    if t == 1:
        return mu, np.zeros((layers, n)), np.zeros((layers, n, n))
    xc = x - mu
    var = (xc**2).sum(axis=0) / (t - 1)
    cov = np.einsum("tli,tlj->lij", xc, xc) / (t - 1)
    return mu, var, cov


def lpt_batch(mu: np.ndarray, var: np.ndarray, cov: np.ndarray, layer: np.ndarray, replicas: np.ndarray,
              ranks: int, slots: int, z: float = Z_SCORE) -> np.ndarray:
    """Risk-aware LPT of ``B`` rows. ``mu, var [L, n]``, ``cov [L, n, n]``, ``layer [B]`` (row -> layer),
    ``replicas [B, n]`` -> ``[B, R, S]`` ids (-1: unplaced), as ``flashlb.lpt_deploy`` row by row."""
    rows, n = replicas.shape
    per_row = max(1, _CHUNK_CELLS // (ranks * n))
    if rows > per_row:
        return np.concatenate([lpt_batch(mu, var, cov, layer[i:i + per_row], replicas[i:i + per_row], ranks, slots, z)
                               for i in range(0, rows, per_row)])
    m, v = mu[layer], var[layer]  # [B, n]
    order = np.argsort(-(m / replicas), axis=1)  # quicksort row by row, as the reference
    counts = np.take_along_axis(replicas, order, axis=1)
    seq = np.repeat(order.ravel(), counts.ravel()).reshape(rows, -1)  # [B, P]: expert of each step
    dep = -np.ones((rows, ranks, slots), dtype=np.int64)
    dev_mu = np.zeros((rows, ranks), dtype=np.float32)
    dev_var = np.zeros((rows, ranks), dtype=np.float32)
    cov_acc = np.zeros((rows, ranks, n))
    fill = np.zeros((rows, ranks), dtype=np.int64)
    has = np.zeros((rows, ranks, n), dtype=bool)
    row = np.arange(rows)
    last = ranks - 1
    for k in range(seq.shape[1]):
        e = seq[:, k]
        c = replicas[row, e].astype(np.float64)
        ok = (fill < slots) & ~has[row, :, e]
        anyok = ok.any(axis=1)
        t_mu = dev_mu.astype(np.float64) + (m[row, e] / c)[:, None]
        t_var = dev_var.astype(np.float64) + (v[row, e] / c**2)[:, None] + 2.0 * cov_acc[row, :, e] / c[:, None]
        with np.errstate(invalid="ignore"):
            risk = t_mu + z * np.sqrt(t_var)
        risk = np.where(ok & ~np.isnan(risk), risk, np.inf)
        finite = np.isfinite(risk)
        d = np.where(finite.any(axis=1), risk.argmin(axis=1), last)
        d = np.where(anyok, d, last)
        room = fill[row, d] < slots
        place = np.where(anyok, finite[row, d] | room, room)
        if not place.any():
            continue
        p = row[place]
        dp = d[place]
        full_rule = ~anyok[place]  # no rank could take it: the last rank, mean and variance -1, no 'has'
        dev_mu[p, dp] = np.where(full_rule, np.float32(-1.0), t_mu[p, dp].astype(np.float32))
        dev_var[p, dp] = np.where(full_rule, np.float32(-1.0), t_var[p, dp].astype(np.float32))
        dep[p, dp, fill[p, dp]] = e[place]
        fill[p, dp] += 1
        has[p[~full_rule], dp[~full_rule], e[place][~full_rule]] = True
        cov_acc[p, dp] += cov[layer[p], :, e[place]] / c[place][:, None]
    return dep


def score_batch(x: np.ndarray, layer: np.ndarray, replicas: np.ndarray, dep: np.ndarray) -> np.ndarray:
    """Upstream ``compute_score`` of ``B`` rows: ``x [T, L, n]`` -> ``[B]`` (float32 values as floats)."""
    rows, ranks, slots = dep.shape
    xs = x[:, layer].transpose(1, 0, 2)  # [B, T, n]
    per = xs / np.maximum(replicas, 1)[:, None, :]
    flat = np.where(dep < 0, dep + replicas.shape[1], dep).reshape(rows, 1, -1)  # -1 wraps, as numpy indexing
    loads = np.take_along_axis(per, np.broadcast_to(flat, (rows, xs.shape[1], flat.shape[2])), axis=2)
    loads = loads.reshape(rows, xs.shape[1], ranks, slots).sum(axis=3)  # [B, T, R]
    ratio = ((loads.max(axis=2) * ranks + 1e-2) / (loads.sum(axis=2) + 1e-2)).astype(np.float32)
    return np.array([float(np.mean(r)) for r in ratio])


def tree_search_layers(x: np.ndarray, ranks: int, slots: int, z: float = Z_SCORE,
                       depth: int = DEPTH, width: int = WIDTH) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All layers at once. ``x [T, L, n]`` -> (ids ``[L, R, S]``, replicas ``[L, n]``, scores ``[L]``)."""
    _, layers, n = x.shape
    mu, var, cov = _stats(x)
    total = ranks * slots
    all_layers = np.arange(layers)
    if depth <= 1:
        rep = np.stack([min_max_history(mu[i], var[i], total - n, z)[-1] for i in range(layers)])
        dep = lpt_batch(mu, var, cov, all_layers, rep, ranks, slots, z)
        return dep, rep, score_batch(x, all_layers, rep, dep)
    size = math.ceil(n / depth)
    idx = np.argsort(-(mu + z * np.sqrt(var)), axis=1)
    deployed = np.zeros((layers, n), dtype=np.int64)
    avail = np.full(layers, total - n)
    active = np.ones(layers, dtype=bool)
    for node in range(depth - 1):
        rows_layer, rows_rep, rows_cand, plans = [], [], [], []
        for i in np.nonzero(active)[0]:
            a = int(avail[i])
            sim_idx, cur_idx, rem_idx = idx[i, node * size:], idx[i, node * size:(node + 1) * size], idx[i, (node + 1) * size:]
            sim_rep = min_max_history(mu[i, sim_idx], var[i, sim_idx], a, z)[-1]
            cur_h = min_max_history(mu[i, cur_idx], var[i, cur_idx], a, z)
            rem_h = min_max_history(mu[i, rem_idx], var[i, rem_idx], a, z)
            initial = int((sim_rep[:size] - 1).sum())
            cands = [initial]
            for r in range(1, min(max(initial, a - initial), width) + 1):
                cands += [c for c in (initial - r, initial + r) if 0 <= c <= a]
            for cand in cands:
                rep = deployed[i].copy()
                rep[cur_idx] = cur_h[cand]
                rep[rem_idx] = rem_h[a - cand]
                rows_layer.append(i)
                rows_rep.append(rep)
                rows_cand.append(cand)
            plans.append((i, cur_idx, rem_idx, cur_h, rem_h, len(cands)))
        layer_of = np.asarray(rows_layer, dtype=np.int64)
        reps = np.stack(rows_rep)
        scores = score_batch(x, layer_of, reps, lpt_batch(mu, var, cov, layer_of, reps, ranks, slots, z))
        at = 0
        for i, cur_idx, rem_idx, cur_h, rem_h, k in plans:
            best, best_s = rows_cand[at], scores[at]
            for j in range(at + 1, at + k):
                if scores[j] < best_s:
                    best, best_s = rows_cand[j], scores[j]
            at += k
            deployed[i, cur_idx] = cur_h[best]
            avail[i] -= best
            if not avail[i] or node == depth - 2:
                deployed[i, rem_idx] = rem_h[avail[i]]
                active[i] = False
        if not active.any():
            break
    dep = lpt_batch(mu, var, cov, all_layers, deployed, ranks, slots, z)
    return dep, deployed, score_batch(x, all_layers, deployed, dep)
