"""FlashLB (vLLM-Ascend ``eplb_policy_type`` 3), reimplemented in numpy.

Read from vllm-project/vllm-ascend, release v0.23.0 (commit
5cb98caaadeff42b5b62b996e34bb2aaa29d20fd),
``vllm_ascend/eplb/core/policy/policy_flashlb.py`` (``FlashTree``, ``FlashLB``);
the first version (``variant="pr3042"``) from commit 29c173ab48001f3d26805db2d833be712687fb1a
(the change that introduced FlashLB, same file).

Shapes: ``W`` windows, ``L`` layers, ``E`` experts, ``R`` ranks (devices),
``S`` slots per rank, ``P = R*S``; ``T`` the samples a layer is judged on.

v0.23.0 (``variant="tree"``), per layer:

1. hotness: every window's counts **+ 1** (upstream adds one to every expert);
   the last ``k * min(W, 64)`` windows with ``k = max(W // 64, 1)``, summed in
   groups of ``k`` consecutive windows -> samples ``X [T, E]``; ``mu``, ``var``,
   ``cov`` their mean, unbiased variance and covariance (zero for ``T = 1``);
2. replicas, *min-max*: each extra replica to the expert with the largest
   ``(mu + z*sqrt(var)) / replicas`` (``z = Phi^-1(0.75)``, no cap per expert);
3. tree search: experts sorted by ``mu + z*sqrt(var)`` are cut into ``depth = 4``
   groups; for group ``g`` the split of the remaining extra replicas between
   ``g`` and the groups after it starts at min-max's split and moves by up to
   ``width = 8`` either way, each candidate scored by a full placement (step 4)
   on ``X``: mean over samples of ``(max rank load * R + 0.01) / (total + 0.01)``;
4. placement, risk-aware LPT: replicas by ``mu / replicas`` descending, each to
   the rank with room and without that expert whose ``mu + z*std`` after adding
   it is least (rank variance includes the covariances of its experts);
   an expert that cannot be placed leaves the layer as it was (``previous``).

With ``previous``, a layer changes only if its score on the window buffer
improves (upstream's ``delta_average_to_peak_ratio > 0``); new layers are
relabelled (ranks, then slots) for overlap with the previous layer (upstream
uses an exact assignment; the relabelling does not change loads).

PR #3042 (``variant="pr3042"``), on the last window + 1 only: replica counts
by staged marginal gain, a binary search per slot-column group on the slope of
sorted per-replica loads ("adaptive bloating"), and join-the-shortest-queue
placement (a replica goes to the first rank whose load after it stays at or
below the current peak, else the lightest); the better of that and the
ungrouped counts' placement is kept.

Decisions (replica counts, rank of every replica) follow upstream; float32
accumulators are kept where upstream has them. Known differences: upstream's
``argsort`` is an unstable quicksort: exactly tied experts are ordered as numpy's
quicksort orders them (numba's, in the engine, may differ), and
PR #3042 fills unplaceable slots at random (here from a seeded generator).
"""

from __future__ import annotations

import math

import numpy as np

from ascend_runtime.balancer.baselines.common import as_history

Z_SCORE = 0.6744897501960817  # scipy.stats.norm.ppf(0.75), upstream FlashLBConfig.z_score
DEPTH, WIDTH, SAMPLE_SIZE = 4, 8, 64


# --------------------------------------------------------------- v0.23.0 tree search


def min_max_history(mu: np.ndarray, var: np.ndarray, extra: int, z: float = Z_SCORE) -> np.ndarray:
    """Replica counts after each of ``extra`` min-max steps: ``[extra + 1, n]`` int (row 0 all ones)."""
    n = mu.shape[0]
    rep = np.ones(n, dtype=np.int64)
    hist = np.ones((extra + 1, n), dtype=np.int64)
    if n == 0:
        return hist
    w = mu + z * np.sqrt(var)
    unit = w / rep
    for r in range(extra):
        i = int(np.argmax(unit))  # first of the maxima, as upstream's strict '>'
        rep[i] += 1
        unit[i] = w[i] / rep[i]
        hist[r + 1] = rep
    return hist


def lpt_deploy(mu: np.ndarray, var: np.ndarray, cov: np.ndarray, replicas: np.ndarray,
               ranks: int, slots: int, z: float = Z_SCORE) -> np.ndarray:
    """Risk-aware LPT. ``mu, var [n]``, ``cov [n, n]``, ``replicas [n]`` -> ``[R, S]`` ids (-1: unplaced)."""
    order = np.argsort(-(mu / replicas))  # quicksort, as upstream (exact ties: unstable order)
    dep = -np.ones((ranks, slots), dtype=np.int64)
    dev_mu = np.zeros(ranks, dtype=np.float32)
    dev_var = np.zeros(ranks, dtype=np.float32)
    cov_acc = np.zeros((ranks, mu.shape[0]))  # sum over a rank's experts f of cov[e, f] / replicas[f]
    fill = np.zeros(ranks, dtype=np.int64)
    has = np.zeros((ranks, mu.shape[0]), dtype=bool)
    for e in order:
        c = replicas[e]
        for _ in range(int(c)):
            ok = (fill < slots) & ~has[:, e]
            if not ok.any():
                # upstream's best_dev stays -1: the replica goes to the last rank (a duplicate there)
                # with that rank's mean and variance set to -1; a full last rank is an out-of-bounds
                # write upstream (undefined), left unplaced here
                d = ranks - 1
                if fill[d] < slots:
                    dep[d, fill[d]] = e
                    fill[d] += 1
                    dev_mu[d] = dev_var[d] = -1.0
                    cov_acc[d] += cov[:, e] / c
                continue
            t_mu = dev_mu.astype(np.float64) + mu[e] / c
            t_var = dev_var.astype(np.float64) + var[e] / c**2 + 2.0 * cov_acc[:, e] / c
            with np.errstate(invalid="ignore"):  # a negative variance gives NaN: upstream never picks that rank
                risk = t_mu + z * np.sqrt(t_var)
            risk = np.where(ok & ~np.isnan(risk), risk, np.inf)
            d = int(np.argmin(risk)) if np.isfinite(risk).any() else ranks - 1
            if not np.isfinite(risk[d]) and fill[d] >= slots:
                continue
            dev_mu[d], dev_var[d] = t_mu[d], t_var[d]
            dep[d, fill[d]] = e
            fill[d] += 1
            has[d, e] = True
            cov_acc[d] += cov[:, e] / c
    return dep


def score(x: np.ndarray, replicas: np.ndarray, dep: np.ndarray) -> float:
    """Upstream ``compute_score``: mean over samples of ``(peak * R + .01) / (total + .01)``. ``x [T, n]``."""
    per = x / np.maximum(replicas, 1)[None, :]
    loads = per[:, dep].sum(axis=2)  # [T, R]
    ranks = dep.shape[0]
    return float(np.mean(((loads.max(axis=1) * ranks + 1e-2) / (loads.sum(axis=1) + 1e-2)).astype(np.float32)))


def _stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    t, n = x.shape
    mu = x.mean(axis=0)
    if t > 1:
        xc = x - mu
        return mu, (xc**2).sum(axis=0) / (t - 1), xc.T @ xc / (t - 1)
    return mu, np.zeros(n), np.zeros((n, n))


def tree_search(x: np.ndarray, ranks: int, slots: int, z: float = Z_SCORE,
                depth: int = DEPTH, width: int = WIDTH) -> tuple[np.ndarray, np.ndarray, float]:
    """One layer. ``x [T, n]`` samples -> (``[R, S]`` ids, replicas ``[n]``, score)."""
    mu, var, cov = _stats(x)
    n, total = mu.shape[0], ranks * slots
    avail = total - n
    if depth <= 1:
        rep = min_max_history(mu, var, avail, z)[-1]
        dep = lpt_deploy(mu, var, cov, rep, ranks, slots, z)
        return dep, rep, score(x, rep, dep)
    size = math.ceil(n / depth)
    idx = np.argsort(-(mu + z * np.sqrt(var)))
    deployed = np.zeros(n, dtype=np.int64)
    for node in range(depth - 1):
        sim_idx = idx[node * size:]
        cur_idx = idx[node * size:(node + 1) * size]
        rem_idx = idx[(node + 1) * size:]
        sim_rep = min_max_history(mu[sim_idx], var[sim_idx], avail, z)[-1]
        cur_h = min_max_history(mu[cur_idx], var[cur_idx], avail, z)
        rem_h = min_max_history(mu[rem_idx], var[rem_idx], avail, z)
        initial = int((sim_rep[:size] - 1).sum())

        def evaluate(mid: int, cur_h=cur_h, rem_h=rem_h, cur_idx=cur_idx, rem_idx=rem_idx, avail=avail) -> float:
            rep = deployed.copy()
            rep[cur_idx] = cur_h[mid]
            rep[rem_idx] = rem_h[avail - mid]
            return score(x, rep, lpt_deploy(mu, var, cov, rep, ranks, slots, z))

        # neighbour search around `initial` within [0, avail], left before right, strict improvement
        best, best_s = initial, evaluate(initial)
        for r in range(1, min(max(initial, avail - initial), width) + 1):
            for cand in (initial - r, initial + r):
                if 0 <= cand <= avail:
                    s = evaluate(cand)
                    if s < best_s:
                        best, best_s = cand, s
        deployed[cur_idx] = cur_h[best]
        avail -= best
        if not avail or node == depth - 2:
            deployed[rem_idx] = rem_h[avail]
            break
    dep = lpt_deploy(mu, var, cov, deployed, ranks, slots, z)
    return dep, deployed, score(x, deployed, dep)


def samples(history: np.ndarray, sample_size: int = SAMPLE_SIZE) -> np.ndarray:
    """Upstream's window buffer to samples: ``[W, L, E]`` -> ``[T, L, E]`` (hotness + 1, grouped sums)."""
    h = history + 1.0
    w = h.shape[0]
    k = min(w, sample_size)
    group = max(w // k, 1)
    h = h[w - group * k:]
    return h.reshape(k, group, *h.shape[1:]).sum(axis=1)


# --------------------------------------------------------------- PR #3042 first version


def _piece_counts(x: np.ndarray, total: int, sw: np.ndarray) -> np.ndarray:
    """``x [T, n]`` -> pieces ``[n]`` summing to ``total``: each extra piece to the largest staged gain."""
    t, n = x.shape
    pieces = np.ones(n, dtype=np.int64)
    unit = x / pieces
    for _ in range(total - n):
        deltas = np.zeros(n, dtype=np.float32)
        for i in range(t):
            i1 = int(np.argmax(unit[i]))
            rest = np.delete(unit[i], i1)
            # second: the largest of the others (upstream's running top-2; ties resolve to the same value)
            sec = rest.max() if rest.size else unit[i, i1]
            alt = x[i, i1] / (pieces[i1] + 1)
            delta = unit[i, i1] - max(sec, alt)
            deltas[i1] += delta * sw[i] if delta != 0 else sw[i]
        j = int(np.argmax(deltas))
        pieces[j] += 1
        unit[:, j] = x[:, j] / pieces[j]
    return pieces


def _slices(values: np.ndarray, pieces: np.ndarray) -> np.ndarray:
    return np.repeat((values / np.maximum(pieces, 1)).astype(np.float32), pieces)


def _jsq(x: np.ndarray, pieces: np.ndarray, ranks: int, sw: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Join-the-shortest-queue placement. ``x [T, n]``, ``pieces [n]`` -> ``[R, pieces.sum() // R]`` ids."""
    t, n = x.shape
    per = int(pieces.sum()) // ranks
    unit = np.where(pieces > 0, x / np.maximum(pieces, 1), 0.0).astype(np.float32)
    order = np.argsort(-unit.sum(axis=0, dtype=np.float32))
    loads = np.zeros((t, ranks), dtype=np.float32)
    dep = -np.ones((ranks, per), dtype=np.int64)
    fill = np.zeros(ranks, dtype=np.int64)
    for e in order:
        used = np.zeros(ranks, dtype=bool)
        for _ in range(int(pieces[e])):
            w = unit[:, e]
            peak = loads.max(axis=1)  # [T]
            denom = ((loads + w[:, None]).sum(axis=1, dtype=np.float64) / ranks + 1e-2).astype(np.float32)
            after = loads + w[:, None]
            s = (sw[:, None] * (np.maximum(after, peak[:, None]) / denom[:, None])).sum(axis=0)
            s = np.where((fill < per) & ~used, s, np.inf)
            d = int(np.argmin(s))
            if not np.isfinite(s[d]):
                continue
            used[d] = True
            loads[:, d] += w
            dep[d, fill[d]] = e
            fill[d] += 1
    for r in range(ranks):  # upstream fills leftover slots at random with an expert not yet on the rank
        for c in range(per):
            if dep[r, c] == -1:
                free = [e for e in range(n) if e not in set(dep[r].tolist())]
                dep[r, c] = free[rng.integers(len(free))] if free else rng.integers(n)
    return dep


def _bloating(x: np.ndarray, total: int, ranks: int, sim_pieces: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """Adaptive bloating: per slot-column group, binary search of how many extra pieces it takes."""
    _, n = x.shape
    x = x.astype(np.float32)
    x_all = x.sum(axis=0, dtype=np.float32)
    order = np.argsort(-x_all, kind="stable")
    xs = x[:, order]
    srt = np.sort(_slices(x_all, sim_pieces))[::-1]
    slopes = (srt[: -ranks + 1] - srt[ranks - 1:]) / ranks
    loads = np.zeros(ranks, dtype=np.float32)
    pieces = np.zeros(n, dtype=np.int64)
    remain, cur = total - n, 0

    def group(keep: int) -> tuple[np.ndarray, np.ndarray]:
        g = xs[:, cur:cur + 2 * ranks][:, :keep]
        p = _piece_counts(g, ranks, sw)
        return g, p

    for _ in range(total // ranks):
        low, high = max(0, cur + ranks - n), min(remain, ranks - 1)
        while high - low > 1:
            mid = (high + low) // 2
            g, p = group(ranks - mid)
            trial = loads + np.sort(_slices(g.sum(axis=0), np.maximum(p, 1)))
            slope = (trial.max() - trial.min()) / ranks
            nxt = slopes[cur + ranks - mid:].max()
            if abs(slope) > abs(nxt):
                low = mid
            else:
                high = mid
        keep = ranks - high
        g, p = group(keep)
        pieces[order[cur:cur + p.shape[0]]] = p
        loads = np.sort(loads + np.sort(_slices(g.sum(axis=0), p)))[::-1]
        cur += keep
        remain -= high
    return pieces


def pr3042_layer(x: np.ndarray, ranks: int, slots: int, rng: np.random.Generator) -> np.ndarray:
    """First FlashLB on one layer. ``x [1, n]`` (last window + 1) -> ``[R, S]`` ids."""
    sw = (x.sum(axis=1) / x.sum(axis=1).max()).astype(np.float32)
    total = ranks * slots
    sim_p = _piece_counts(x, total, sw)
    sim_d = _jsq(x, sim_p, ranks, sw, rng)
    p = _bloating(x, total, ranks, sim_p, sw)
    d = _jsq(x, p, ranks, sw, rng)
    x_all = x.sum(axis=0)
    peak = np.where(p > 0, x_all / np.maximum(p, 1), 0.0)[d].sum(axis=1).max()
    sim_peak = (x_all / sim_p)[sim_d].sum(axis=1).max()
    return sim_d if peak > sim_peak else d


# --------------------------------------------------------------- entry point


def place(load: np.ndarray, num_ranks: int, slots_per_rank: int, previous: np.ndarray | None = None,
          variant: str = "tree", seed: int = 0) -> np.ndarray:
    """FlashLB placement ``[L, R*S]`` for ``load [L, E]`` or history ``[W, L, E]`` (oldest first).

    ``previous [L, R*S]``: the placement in service (layers keep it unless the
    score improves; needed when an expert cannot be placed). ``variant``:
    ``"tree"`` (v0.23.0) or ``"pr3042"`` (first version, last window only).
    """
    hist = as_history(load)
    _, layers, n = hist.shape
    ranks, slots = num_ranks, slots_per_rank
    if ranks * slots < n:
        raise ValueError(f"{ranks} ranks x {slots} slots < {n} experts")
    if previous is not None:
        previous = np.asarray(previous, dtype=np.int64)
        if previous.shape != (layers, ranks * slots):
            raise ValueError(f"previous has shape {previous.shape}, expected {(layers, ranks * slots)}")
    rng = np.random.default_rng(seed)
    x_all = samples(hist) if variant == "tree" else hist[-1:] + 1.0
    buf = hist + 1.0  # upstream's window buffer: every window of the call
    out = np.empty((layers, ranks * slots), dtype=np.int64)
    if variant == "tree":  # all layers in one batch: the same decisions as tree_search layer by layer
        from ascend_runtime.balancer.baselines.flashlb_batched import tree_search_layers

        tree = tree_search_layers(x_all, ranks, slots)
    for layer in range(layers):
        x = x_all[:, layer]
        if variant == "tree":
            dep, rep, s_new = tree[0][layer], tree[1][layer], float(tree[2][layer])
        elif variant == "pr3042":
            dep = pr3042_layer(x, ranks, slots, rng)
            rep = np.bincount(dep.ravel(), minlength=n)
            s_new = score(x, rep, dep)
        else:
            raise ValueError(f"unknown FlashLB variant {variant!r}")
        if previous is None:
            if (dep < 0).any():
                raise ValueError(f"layer {layer}: FlashLB left a replica unplaced; give previous")
            out[layer] = dep.ravel()
            continue
        prev = previous[layer].reshape(ranks, slots)
        prev_rep = np.bincount(prev.ravel(), minlength=n)
        ref = buf[:, layer] if variant == "tree" else x
        if (dep < 0).any() or not (1 / s_new > 1 / score(ref, prev_rep, prev)):
            out[layer] = previous[layer]
            continue
        out[layer] = _align(prev, dep, n).ravel()
    return out


def _align(prev: np.ndarray, new: np.ndarray, n: int) -> np.ndarray:
    """Relabel ranks, then slots, of ``new [R, S]`` for overlap with ``prev [R, S]`` (loads unchanged)."""
    from ascend_runtime.balancer.placement import align_slots, relabel_ranks

    r = relabel_ranks(prev[None], new[None], n)
    return align_slots(prev[None], r)[0]
