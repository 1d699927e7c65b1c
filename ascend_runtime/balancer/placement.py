"""Expert placement with redundant experts: forecast-aware, refined, move-thrifty.

Shapes: ``L`` layers, ``E`` logical experts, ``R`` ranks, ``S`` slots per rank,
``P = R*S`` physical slots (``P - E`` redundant). A placement is ``[L, P]`` of
logical ids; rank ``r`` owns slots ``r*S .. r*S+S-1``. Internally problems are
batched as ``B`` independent sub-problems (layers, or layer x node when
hierarchical), so every step is numpy over the batch.

Algorithm (from scratch):

1. replicas by water filling on a *hedged* load ``mean + hedge * std``: each
   redundant slot goes to the expert with the largest hedged load per replica,
   at most ``R`` replicas (more could not sit on distinct ranks); with a
   ``holdout`` (forecasts made before recent observed windows, and those
   windows), the hedge is chosen on the windows that followed them, against
   EPLB greedy on the last observed window too: the unhedged plan
   stays unless another candidate's held-out per-layer peaks are lower by
   ``evidence`` standard errors (a winning greedy plan is de-duplicated and
   refined by step 3);
2. LPT packing: replicas heaviest first into the lightest rank that has a free
   slot and does not already hold that expert;
3. local search: swap one replica on the most loaded rank with one on another
   rank whenever that lowers the pair's maximum; repeat until no swap helps.

Hierarchical (``groups``, ``nodes``): expert groups are packed onto nodes (same
LPT + swaps, ``G/N`` groups per node), then each node is solved as above.

With a previous placement: kept whole unless the from-scratch plan gains
``min_gain`` (relative, on the forecast). Otherwise each layer is, in order of
preference, the previous layer (if within ``tolerance/2`` of the from-scratch
layer's peak), an incremental repair of it (replica counts fixed, then swaps
until within ``tolerance/2``), or the from-scratch layer relabelled (nodes, then
ranks) for maximum overlap with the previous one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ascend_runtime.balancer.eplb_greedy import eplb_greedy
from ascend_runtime.balancer.measure import balancedness, moved_slots


@dataclass(frozen=True)
class PlacementConfig:
    """Tuning knobs; defaults are the ones the benchmark measured."""

    hedge: float = 1.0  # std multiples added to load when sizing replicas (no holdout)
    hedges: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 3.0)  # candidates validated on the holdout windows
    packs: tuple[float, ...] = (0.0,)  # std multiples added to per-replica load when packing (candidates)
    greedy_candidate: bool = True  # EPLB greedy on the last window competes on the holdout windows too
    #: with ``history`` (observed windows): choose the plan by rolling-origin validation
    #: (``selection.py``): every candidate below is planned on the windows before each of the
    #: last ``holdout_windows`` windows and scored on that window; the best total is used
    select_on_history: bool = True
    history_decays: tuple[float, ...] = (1.0, 0.5, 0.0)  # newest-window weight; 0 = all windows equally
    #: further forecast rules (``selection.forecast_of``): "shrink" (pooled AR(1) toward the mean),
    #: "similar" (mean of the windows within sampling noise of the last one)
    history_rules: tuple[str, ...] = ("shrink", "similar")
    history_hedges: tuple[float, ...] = (0.0, 0.674)  # std (over windows) multiples when sizing replicas
    #: the history candidates as ``(rule, hedge)`` pairs; None = every rule above with every hedge.
    #: The default drops the all-window average (``similar`` keeps every window when load is
    #: stable) and the hedged decays: fewer candidates, less winner's curse on 4 held-out windows
    history_candidates: tuple[tuple, ...] | None = (
        ("similar", 0.0), ("similar", 0.674), ("shrink", 0.0), ("shrink", 0.674), (1.0, 0.0), (0.5, 0.0)
    )
    #: the std the hedges multiply: "similar" = spread over the windows like the last one (the
    #: uncertainty inside the current regime), "all" = spread over every window
    hedge_std: str = "similar"
    #: EPLB greedy on the last / decayed windows as candidates ("greedy", "greedy_decay"); off by
    #: default: our planner on the same forecasts (1.0 and 0.5) covers them, and their trials were
    #: the slowest part of planning at 144x2
    baseline_candidates: tuple[str, ...] = ()
    baseline_decay: float = 0.5  # newest-window weight of "greedy_decay"
    holdout_windows: int = 4
    #: the history candidate kept unless another beats it on the held-out windows by
    #: ``selection_evidence`` standard errors (paired per-layer differences); None = best total
    selection_default: tuple | None = None
    selection_evidence: float = 2.0
    #: robust swap search (``robust.py``) on the chosen plan: rounds (0 = off), minimum slots per rank
    #: (with 2 slots per rank the critical rank has 2 replicas to swap; it measured no gain there)
    robust_rounds: int = 60
    robust_min_slots: int = 3
    trial_layers: int = 0  # layers (evenly spaced) the trials are scored on; 0 = all (30 cost 0.1-0.3% mean)
    evidence: float = 2.0  # standard errors by which a candidate must beat the unhedged plan on the holdout
    max_swap_rounds: int = 400  # cap on local-search rounds per batch
    trial_swap_rounds: int = 0  # local-search rounds of the holdout trials (they only rank hedges)
    tolerance: float = 0.01  # incremental result may trail from-scratch by this (relative)
    min_gain: float = 0.01  # keep previous placement unless balancedness improves this much (relative)


@dataclass
class PlacementResult:
    """A placement ``[L, P]`` and what it was judged on (forecast balancedness)."""

    placement: np.ndarray
    balancedness: float
    previous_balancedness: float | None
    moved_slots: int
    kept_previous: bool
    strategy: str  # "scratch", "kept", "incremental" (no layer from scratch), "mixed", "relabelled" (all)


# ---------------------------------------------------------------- building blocks


def water_fill(weight: np.ndarray, total: int, cap: int) -> np.ndarray:
    """Replica counts ``[B, n]`` summing to ``total`` per row, each in ``1..cap``.

    Each extra replica goes to the row's largest ``weight / count``.
    """
    rows, n = weight.shape
    counts = np.ones((rows, n), dtype=np.int64)
    row = np.arange(rows)
    w = np.maximum(weight, 0.0) + 1e-12
    ratio = w.copy() if cap > 1 else np.full_like(w, -np.inf)
    for _ in range(total - n):
        best = ratio.argmax(axis=1)
        c = counts[row, best] + 1
        counts[row, best] = c
        ratio[row, best] = np.where(c < cap, w[row, best] / c, -np.inf)
    return counts


def _items(counts: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expand counts ``[B, n]`` into item ids ``[B, P]`` and per-replica weights ``[B, P]``."""
    rows, n = counts.shape
    ids = np.repeat(np.tile(np.arange(n), rows), counts.ravel()).reshape(rows, -1)
    per = weight / counts
    return ids, np.take_along_axis(per, ids, axis=1)


def _items_heaviest_first(counts: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_items` in order of per-replica weight, heaviest first (an expert's replicas side by side):
    the experts are sorted (``[B, n]``) and expanded, instead of sorting the ``[B, P]`` items."""
    rows, n = counts.shape
    per = weight / counts
    order = np.argsort(-per, axis=1)
    flat = (order + (np.arange(rows) * n)[:, None]).ravel()
    reps = counts.ravel()[flat]
    ids = np.repeat(order.ravel(), reps).reshape(rows, -1)
    return ids, np.repeat(per.ravel()[flat], reps).reshape(rows, -1)


def pack_lpt(ids: np.ndarray, w: np.ndarray, ranks: int, slots: int, n: int) -> np.ndarray:
    """LPT packing without duplicate experts on a rank. ``[B, P]`` -> ids ``[B, R, S]``."""
    rows, total = ids.shape
    order = np.argsort(-w, axis=1, kind="stable")
    out = np.empty((rows, ranks, slots), dtype=np.int64)
    loads = np.zeros((rows, ranks))
    fill = np.zeros((rows, ranks), dtype=np.int64)
    has = np.zeros((rows, ranks, n), dtype=bool)
    row = np.arange(rows)
    for k in range(total):
        item = order[:, k]
        e = ids[row, item]
        free = fill < slots
        cost = np.where(free & ~has[row, :, e], loads, np.inf)
        stuck = ~np.isfinite(cost.min(axis=1))
        if stuck.any():  # only a rank already holding e has room: accept, repaired later
            cost[stuck] = np.where(free[stuck], loads[stuck], np.inf)
        r = cost.argmin(axis=1)
        out[row, r, fill[row, r]] = e
        loads[row, r] += w[row, item]
        fill[row, r] += 1
        has[row, r, e] = True
    return out


def pack_rounds(ids: np.ndarray, w: np.ndarray, ranks: int, slots: int) -> np.ndarray:
    """Round-robin LPT: ``slots`` rounds; each deals the next ``ranks`` heaviest items,
    heaviest to the currently lightest rank. ``[B, P]`` items heaviest first
    (:func:`_items_heaviest_first`) -> ids ``[B, R, S]`` (duplicates possible)."""
    rows, total = ids.shape
    ws, es = w.reshape(rows, slots, ranks), ids.reshape(rows, slots, ranks)
    out = np.empty((rows, ranks, slots), dtype=np.int64)
    # round 0 deals to empty ranks in order; its loads are then sorted heaviest first, so round 1's
    # lightest-first order is the reverse (equal loads in either order); later rounds sort
    out[:, :, 0] = es[:, 0]
    if slots > 1:
        out[:, :, 1] = es[:, 1, ::-1]
    if slots > 2:
        loads = ws[:, 0] + ws[:, 1, ::-1]
        row = np.arange(rows)[:, None]
        for s in range(2, slots):
            dest = np.argsort(loads, axis=1, kind="stable")  # lightest first
            out[row, dest, s] = es[:, s]
            loads[row, dest] += ws[:, s]
    return out


def _presence(ids: np.ndarray, n: int) -> np.ndarray:
    """``ids [B, R, S]`` -> replicas of each expert on each rank ``[B, R, n]`` (int)."""
    rows, ranks, _ = ids.shape
    base = (np.arange(rows * ranks) * n).reshape(rows, ranks, 1)
    return np.bincount((ids + base).ravel(), minlength=rows * ranks * n).reshape(rows, ranks, n)


def refine_swaps(
    ids: np.ndarray, per: np.ndarray, rounds: int, target: np.ndarray | None = None
) -> np.ndarray:
    """Swap local search on ``ids [B, R, S]`` with per-replica loads ``per [B, n]``.

    Each round, in every still-active row, the best 1-for-1 swap between the most
    loaded rank and any other rank (no duplicate created) is applied if it
    lowers the pair's maximum. Rows stop when no swap helps or their peak is
    at most ``target [B]``. Returns the refined ids (copy).
    """
    ids = ids.copy()
    if rounds <= 0:
        return ids
    rows, ranks, slots = ids.shape
    w = np.take_along_axis(per, ids.reshape(rows, -1), axis=1).reshape(rows, ranks, slots)
    loads = w.sum(axis=2)
    rank_of = np.repeat(np.arange(ranks), slots)  # [P]
    active = np.arange(rows)
    if target is not None:
        active = active[loads.max(axis=1) > target * (1 + 1e-12)]
    for _ in range(rounds):
        if active.size == 0:
            break
        b = active.size
        ar = np.arange(b)
        lo = loads[active]
        a = lo.argmax(axis=1)
        la = lo[ar, a]
        xa = w[active, a]  # [b, S]
        xid = ids[active, a]  # [b, S]
        wf = w[active].reshape(b, -1)  # [b, P]
        idf = ids[active].reshape(b, -1)
        lb = lo[:, rank_of]  # [b, P]
        d = xa[:, :, None] - wf[:, None, :]  # [b, S, P]
        gain = la[:, None, None] - np.maximum(la[:, None, None] - d, lb[:, None, :] + d)
        bad = (rank_of[None, :] == a[:, None])[:, None, :]
        # x (on rank a) already on the other rank / y (elsewhere) already on rank a: the swap would duplicate
        x_there = (ids[active][:, None, :, :] == xid[:, :, None, None]).any(axis=3)  # [b, S, R]
        y_here = (idf[:, :, None] == xid[:, None, :]).any(axis=2)  # [b, P]
        bad = bad | x_there[:, :, rank_of] | y_here[:, None, :]
        gain = np.where(bad, -np.inf, gain)
        flat = gain.reshape(b, -1).argmax(axis=1)
        g = gain.reshape(b, -1)[ar, flat]
        ok = g > 1e-12 * np.maximum(la, 1e-300)
        if not ok.any():
            break
        sel = active[ok]
        i, j = np.divmod(flat[ok], slots * ranks)
        ra, rb = a[ok], rank_of[j]
        sb = j % slots
        x, y = ids[sel, ra, i], ids[sel, rb, sb]
        wx, wy = w[sel, ra, i], w[sel, rb, sb]
        ids[sel, ra, i], ids[sel, rb, sb] = y, x
        w[sel, ra, i], w[sel, rb, sb] = wy, wx
        loads[sel, ra] += wy - wx
        loads[sel, rb] += wx - wy
        active = sel
        if target is not None:
            active = active[loads[active].max(axis=1) > target[active] * (1 + 1e-12)]
    return ids


def _repair_pairs(ids: np.ndarray) -> None:
    """In place, 2 slots per rank: a rank holding one expert twice swaps its second slot with the
    second slot of a neighbouring rank (the one before, else after) when that creates no duplicate;
    one such swap per row and pass, vectorised. What remains goes to the general repair."""
    rows, ranks, _ = ids.shape
    for _ in range(4):
        dup = ids[:, :, 0] == ids[:, :, 1]  # [B, R]
        bad = np.nonzero(dup.any(axis=1))[0]
        if bad.size == 0 or ranks < 2:
            return
        r = dup[bad].argmax(axis=1)
        done = np.zeros(bad.size, dtype=bool)
        for step in (-1, 1):
            q = r + step
            ok = ~done & (q >= 0) & (q < ranks)
            qc = np.clip(q, 0, ranks - 1)
            x, y = ids[bad, r, 1], ids[bad, qc, 1]
            ok &= (ids[bad, qc, 0] != x) & (ids[bad, r, 0] != y) & (x != y)
            rb, rr, qq = bad[ok], r[ok], qc[ok]
            ids[rb, rr, 1], ids[rb, qq, 1] = ids[rb, qq, 1], ids[rb, rr, 1]
            done |= ok
        if not done.any():
            return


def repair_duplicates(ids: np.ndarray) -> np.ndarray:
    """Remove same-expert duplicates on a rank by swapping with another rank (rare)."""
    ids = ids.copy()
    rows, ranks, slots = ids.shape
    if slots == 2:
        _repair_pairs(ids)
        bad_rows = np.nonzero((ids[:, :, 0] == ids[:, :, 1]).any(axis=1))[0]  # a pair needs no sort
    elif slots > 1:
        srt = np.sort(ids, axis=2)
        bad_rows = np.nonzero((srt[:, :, 1:] == srt[:, :, :-1]).any(axis=(1, 2)))[0]
    else:
        bad_rows = []
    for b in bad_rows:
        for _ in range(ranks * slots):
            sets = [set() for _ in range(ranks)]
            dup = None
            for r in range(ranks):
                for s in range(slots):
                    e = ids[b, r, s]
                    if e in sets[r] and dup is None:
                        dup = (r, s, e)
                    sets[r].add(e)
            if dup is None:
                break
            r, s, e = dup
            done = False
            for r2 in range(ranks):
                if r2 == r or e in sets[r2]:
                    continue
                for s2 in range(slots):
                    if ids[b, r2, s2] not in sets[r]:
                        ids[b, r, s], ids[b, r2, s2] = ids[b, r2, s2], e
                        done = True
                        break
                if done:
                    break
            if not done:
                raise ValueError("cannot place replicas on distinct ranks")
    return ids


def solve_batch(
    weight: np.ndarray, hedged: np.ndarray, ranks: int, slots: int, rounds: int
) -> np.ndarray:
    """From-scratch solve of ``B`` flat problems. ``weight [B, n]`` -> ids ``[B, R, S]``."""
    rows, n = weight.shape
    counts = water_fill(hedged, ranks * slots, ranks)
    if slots <= 2:
        item_ids, item_w = _items_heaviest_first(counts, np.maximum(weight, 0.0))
        packed = pack_rounds(item_ids, item_w, ranks, slots)
    else:
        item_ids, item_w = _items(counts, np.maximum(weight, 0.0))
        packed = pack_lpt(item_ids, item_w, ranks, slots, n)
    ids = repair_duplicates(packed)
    return refine_swaps(ids, np.maximum(weight, 0.0) / counts, rounds)


def _peaks(ids: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Peak rank load ``[B]`` of ids ``[B, R, S]`` under ``weight [B, n]``."""
    rows, ranks, slots = ids.shape
    counts = _presence(ids, weight.shape[1]).sum(axis=1)
    per = weight / np.maximum(counts, 1)
    return np.take_along_axis(per, ids.reshape(rows, -1), axis=1).reshape(rows, ranks, slots).sum(2).max(1)


def incremental_batch(
    previous: np.ndarray, weight: np.ndarray, hedged: np.ndarray, target: np.ndarray, rounds: int
) -> np.ndarray:
    """Start from ``previous [B, R, S]``, fix replica counts, swap until ``target [B]`` peaks."""
    rows, ranks, slots = previous.shape
    n = weight.shape[1]
    want = water_fill(hedged, ranks * slots, ranks)
    have = _presence(previous, n).sum(axis=1)
    ids = previous.copy()
    per = np.maximum(weight, 0.0) / want
    for b in np.nonzero((want != have).any(axis=1))[0]:
        cells = ids[b]
        w = per[b][cells]
        loads = w.sum(axis=1)
        # drop surplus replicas from the heaviest ranks holding them
        for e in np.nonzero(have[b] > want[b])[0]:
            for _ in range(have[b, e] - want[b, e]):
                rs, ss = np.nonzero(cells == e)
                k = int(np.argmax(loads[rs]))
                loads[rs[k]] -= per[b, e]
                cells[rs[k], ss[k]] = -1
        # add missing replicas, heaviest first, to the lightest free rank lacking them
        adds = [e for e in np.nonzero(want[b] > have[b])[0] for _ in range(want[b, e] - have[b, e])]
        adds.sort(key=lambda e: -per[b, e])
        for e in adds:
            free = (cells == -1).any(axis=1) & ~(cells == e).any(axis=1)
            if not free.any():
                free = (cells == -1).any(axis=1)
            r = int(np.argmin(np.where(free, loads, np.inf)))
            s = int(np.nonzero(cells[r] == -1)[0][0])
            cells[r, s] = e
            loads[r] += per[b, e]
        ids[b] = cells
    ids = repair_duplicates(ids)
    return refine_swaps(ids, per, rounds, target)


def align_slots(previous: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Reorder each rank's slots in ``new [B, R, S]`` so kept experts stay in their old slot."""
    eq = new[..., :, None] == previous[..., None, :]  # [B, R, S(new), S(old)]
    slots = new.shape[-1]
    pos = np.full(new.shape, -1, dtype=np.int64)
    taken = np.zeros(new.shape, dtype=bool)
    for i in range(slots):
        for k in range(slots):
            m = eq[..., i, k] & (pos[..., i] < 0) & ~taken[..., k]
            pos[..., i][m] = k
            taken[..., k][m] = True
    for i in range(slots):
        m = pos[..., i] < 0
        k = np.argmax(~taken, axis=-1)
        pos[..., i] = np.where(m, k, pos[..., i])
        np.put_along_axis(taken, k[..., None], np.take_along_axis(taken, k[..., None], -1) | m[..., None], -1)
    out = np.empty_like(new)
    np.put_along_axis(out, pos, new, axis=-1)
    return out


def relabel_ranks(previous: np.ndarray, new: np.ndarray, n: int, block: int | None = None) -> np.ndarray:
    """Permute the ranks of ``new [B, R, S]`` to maximise overlap with ``previous``.

    Greedy maximum-overlap matching (largest overlaps first, over the nonzero
    pairs only; unmatched ranks take the free labels in order); with ``block``
    ranks only move inside aligned blocks of that many ranks (the nodes of a
    hierarchical placement). ``n`` (experts) is kept for the call signature.
    """
    rows, ranks, slots = new.shape
    block = block or ranks
    out = new.copy()
    for start in range(0, ranks, block):
        sl = slice(start, start + block)
        a, b = new[:, sl], previous[:, sl]
        overlap = (a[:, :, None, :, None] == b[:, None, :, None, :]).sum(axis=(3, 4))  # [B, block, block]
        bi, ri, qi = np.nonzero(overlap)
        order = np.lexsort((-overlap[bi, ri, qi], bi))
        dest = np.full((rows, block), -1, dtype=np.int64)
        taken = np.zeros((rows, block), dtype=bool)
        for k in order.tolist():
            row, r, q = bi[k], ri[k], qi[k]
            if dest[row, r] < 0 and not taken[row, q]:
                dest[row, r] = q
                taken[row, q] = True
        for row in np.nonzero((dest < 0).any(axis=1))[0]:
            dest[row, dest[row] < 0] = np.nonzero(~taken[row])[0]
        np.put_along_axis(out[:, sl], dest[:, :, None].repeat(slots, 2), new[:, sl], axis=1)
    return out


# ---------------------------------------------------------------- hierarchy


def _node_groups(ids: np.ndarray, groups: int, nodes: int, n: int) -> np.ndarray | None:
    """Group -> node ``[L, G]`` if every group's replicas sit in one node, else None."""
    layers, ranks, _ = ids.shape
    per_node = ranks // nodes
    gsize = n // groups
    node_of = np.full((layers, groups), -1)
    for node in range(nodes):
        grp = ids[:, node * per_node : (node + 1) * per_node].reshape(layers, -1) // gsize
        pres = np.zeros((layers, groups), dtype=bool)
        np.put_along_axis(pres, grp, True, axis=1)
        if (pres & (node_of >= 0)).any():
            return None
        node_of[pres] = node
    if (node_of < 0).any() or not (np.apply_along_axis(np.bincount, 1, node_of, minlength=nodes) == groups // nodes).all():
        return None
    return node_of


def _node_experts(node_of: np.ndarray, groups: int, nodes: int, n: int) -> np.ndarray:
    """Logical ids served by each node, ``[L, N, E/N]``, from group -> node ``[L, G]``."""
    layers = node_of.shape[0]
    gsize = n // groups
    order = np.argsort(node_of, axis=1, kind="stable")  # groups sorted by node
    experts = order[:, :, None] * gsize + np.arange(gsize)
    return experts.reshape(layers, nodes, -1)


def _pack_groups(weight: np.ndarray, groups: int, nodes: int, rounds: int) -> np.ndarray:
    """Group -> node ``[L, G]`` balancing group load, ``G/N`` groups per node."""
    layers, n = weight.shape
    gload = weight.reshape(layers, groups, -1).sum(axis=2)
    ids = pack_lpt(np.broadcast_to(np.arange(groups), (layers, groups)).copy(), gload, nodes, groups // nodes, groups)
    ids = refine_swaps(ids, gload, rounds)
    node_of = np.empty((layers, groups), dtype=np.int64)
    np.put_along_axis(node_of, ids.reshape(layers, -1), np.repeat(np.arange(nodes), groups // nodes)[None, :], axis=1)
    return node_of


def _to_local(ids: np.ndarray, experts: np.ndarray, n: int) -> np.ndarray:
    """Global ids ``[L, N, r, S]`` -> node-local ids using ``experts [L, N, E/N]``."""
    layers, nodes, k = experts.shape
    inv = np.zeros((layers, nodes, n), dtype=np.int64)
    np.put_along_axis(inv, experts, np.broadcast_to(np.arange(k), experts.shape), axis=2)
    return np.take_along_axis(inv, ids.reshape(layers, nodes, -1), axis=2).reshape(ids.shape)


# ---------------------------------------------------------------- public API


def _check(load: np.ndarray, ranks: int, slots: int, groups: int | None, nodes: int | None) -> None:
    layers, n = load.shape
    if ranks * slots < n:
        raise ValueError(f"ranks x slots = {ranks * slots} < experts {n}: every expert needs a slot")
    if groups or nodes:
        if not (groups and nodes):
            raise ValueError("groups and nodes go together")
        if n % groups or groups % nodes or ranks % nodes:
            raise ValueError(f"need experts % groups == 0, groups % nodes == 0, ranks % nodes == 0 (E={n}, G={groups}, N={nodes}, R={ranks})")


def _solve(
    problems: list[tuple[np.ndarray, list[np.ndarray]]] | list[tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]],
    ranks: int,
    slots: int,
    groups: int | None,
    nodes: int | None,
    rounds: int,
) -> list[np.ndarray]:
    """Solve all ``(load [L, E], [hedged [L, E], ...][, [pack [L, E], ...]])`` problems in one batch.

    Returns, per problem, placements ``[K, L, R*S]`` (one per hedged load).
    The hedged loads size the replicas; packing and swaps use the matching
    ``pack`` load (default: the load itself).
    Hierarchical: one group -> node assignment per problem, from its load.
    """
    layers, n = problems[0][0].shape
    hier = bool(groups and nodes and nodes > 1)
    sub_w, sub_h, maps = [], [], []
    problems = [(p[0], p[1], p[2] if len(p) > 2 else [p[0]] * len(p[1])) for p in problems]
    if hier:  # every problem's group -> node assignment in one batch
        all_nodes = _pack_groups(np.concatenate([p[0] for p in problems]), groups, nodes, rounds).reshape(len(problems), layers, -1)
    for i_p, (load, hedged, packw) in enumerate(problems):
        if not hier:
            sub_w.extend(packw)
            sub_h.extend(hedged)
            continue
        node_of = all_nodes[i_p]
        experts = _node_experts(node_of, groups, nodes, n)  # [L, N, E/N]
        flat = (experts + (np.arange(layers) * n)[:, None, None]).ravel()
        done: dict[int, np.ndarray] = {}  # the same array is often both a hedged and a packing load

        def sub(x: np.ndarray, flat: np.ndarray = flat, done: dict[int, np.ndarray] = done) -> np.ndarray:
            if id(x) not in done:
                done[id(x)] = x.ravel()[flat].reshape(layers * nodes, -1)
            return done[id(x)]

        sub_w.extend(sub(w) for w in packw)
        sub_h.extend(sub(h) for h in hedged)
        maps.append(experts)
    r = ranks // nodes if hier else ranks
    local = solve_batch(np.concatenate(sub_w), np.concatenate(sub_h), r, slots, rounds)
    out, at = [], 0
    for i, (_, hedged, _) in enumerate(problems):
        k = len(hedged)
        part = local[at : at + k * (local.shape[0] // sum(len(p[1]) for p in problems))]
        at += part.shape[0]
        if hier:
            part = part.reshape(k, layers, nodes, -1)
            part = np.take_along_axis(np.broadcast_to(maps[i], (k, *maps[i].shape)), part, axis=3)
        out.append(part.reshape(k, layers, -1))
    return out


def _holdout_pairs(holdout, shape: tuple[int, ...]) -> list[tuple[np.ndarray, ...]]:
    """Normalise ``holdout`` (one ``(mean, std, window[, previous window])`` or a list of them)
    and drop malformed ones. Items are returned as 4-tuples (previous window None if absent)."""
    if holdout is None or len(holdout) == 0:
        return []
    items = [holdout] if isinstance(holdout[0], np.ndarray) and np.ndim(holdout[0]) == 2 else list(holdout)
    out = []
    for item in items:
        if len(item) not in (3, 4) or any(x is None for x in item[:3]):
            continue
        arrs = tuple(np.maximum(np.asarray(x, dtype=np.float64), 0.0) for x in item[:3])
        prev = None
        if len(item) == 4 and item[3] is not None:
            prev = np.maximum(np.asarray(item[3], dtype=np.float64), 0.0)
            prev = prev if prev.shape == shape else None
        if all(a.shape == shape for a in arrs) and (arrs[2].sum(axis=1) > 0).all():
            out.append((*arrs, prev))
    return out


def _layer_peaks(placement: np.ndarray, load: np.ndarray, ranks: int) -> np.ndarray:
    """Peak rank load per layer ``[L]`` of ``placement [L, P]`` under ``load [L, E]``."""
    from ascend_runtime.balancer.measure import rank_loads

    return rank_loads(placement, load, ranks).max(axis=1)


def place_from_scratch(
    load: np.ndarray,
    ranks: int,
    slots: int,
    groups: int | None = None,
    nodes: int | None = None,
    std: np.ndarray | None = None,
    config: PlacementConfig = PlacementConfig(),
    holdout=None,
    last: np.ndarray | None = None,
    history: np.ndarray | None = None,
) -> np.ndarray:
    """Placement ``[L, R*S]`` for forecast ``load [L, E]`` (and its ``std [L, E]``).

    ``history [W, L, E]``: the observed windows, oldest first. With at least 3 and
    ``config.select_on_history``, the plan is chosen among the candidates of
    :mod:`ascend_runtime.balancer.selection` (ours on several forecast rules and hedges, EPLB
    greedy on the last and on the decayed windows) by rolling-origin validation, then refined by
    the robust swap search over the windows the chosen forecast weights (:mod:`.robust`), and
    ``load``/``std``/``holdout`` are not used.

    ``holdout``: ``[(mean, std, window), ...]`` (or one such triple), forecasts made
    before recent windows and the windows that then arrived (``Forecast.holdout``).
    With it and ``std``, each hedge in ``config.hedges`` is planned on each earlier
    forecast and scored on the window that followed; the hedge whose plans had the
    lowest peak rank load there (summed over layers and windows) is used.
    Without it, ``config.hedge`` is used.
    """
    return _scratch(load, ranks, slots, groups, nodes, std, config, holdout, last, history)[0]


def _scratch(
    load: np.ndarray,
    ranks: int,
    slots: int,
    groups: int | None,
    nodes: int | None,
    std: np.ndarray | None,
    config: PlacementConfig,
    holdout,
    last: np.ndarray | None = None,
    history: np.ndarray | None = None,
) -> tuple[np.ndarray, float, np.ndarray | None]:
    """:func:`place_from_scratch`, the hedge it used (0 when a greedy candidate won), and, when
    chosen on ``history``, the hedged load ``[L, E]`` that sized its replicas (else None)."""
    load = np.maximum(np.asarray(load, dtype=np.float64), 0.0)
    _check(load, ranks, slots, groups, nodes)
    if history is not None and config.select_on_history:
        from ascend_runtime.balancer import selection
        from ascend_runtime.balancer.selection import choose

        hist = np.maximum(np.asarray(history, dtype=np.float64), 0.0)
        if hist.ndim == 3 and hist.shape[1:] == load.shape and hist.shape[0] >= 3:
            pick = choose(hist, ranks, slots, groups, nodes, config)
            if pick is not None:
                plan = None
                if pick.name[0] == "greedy":
                    try:
                        plan = _greedy_refined(pick.load, ranks, slots, groups, nodes, config.max_swap_rounds)
                    except ValueError:  # more replicas of an expert than ranks: our plan on the same load
                        pass
                if plan is None:
                    plan = _solve([(pick.load, [pick.hedged])], ranks, slots, groups, nodes, config.max_swap_rounds)[0][0]
                weights = selection.window_weights(pick.name, hist, config)
                plan = _robust_refine(plan, hist, weights, pick.load, ranks, slots, groups, nodes, config)
                return plan, 0.0, pick.load if pick.name[0] == "greedy" else pick.hedged
    sd = np.zeros_like(load) if std is None else np.maximum(np.asarray(std, dtype=np.float64), 0.0)
    best: tuple | None = (config.hedge, 0.0)
    pairs = _holdout_pairs(holdout, load.shape)
    cands: list[tuple] = [(h, k) for h in config.hedges for k in config.packs] if std is not None else [(0.0, 0.0)]
    if pairs and (len(cands) > 1 or config.greedy_candidate):
        if config.greedy_candidate:
            if last is not None and np.shape(last) == load.shape and all(p[3] is not None for p in pairs):
                cands.append(("greedy", "last"))
        ours = [c for c in cands if c[0] != "greedy"]
        problems = [(m, [m + h * s for h, _ in ours], [m + k * s for _, k in ours]) for m, s, _, _ in pairs]
        trials = _solve(problems, ranks, slots, groups, nodes, config.trial_swap_rounds)
        peaks = []  # [windows, candidates, L]: held-out peak per layer, in units of mean layer tokens
        for trial, (h_mean, _, h_obs, h_prev) in zip(trials, pairs):
            plans = list(trial)
            for c in cands[len(ours):]:
                plans.append(eplb_greedy(h_mean if c[1] == "forecast" else h_prev, ranks, slots, groups, nodes))
            peaks.append(np.stack([_layer_peaks(t, h_obs, ranks) for t in plans]) / h_obs.sum(axis=1).mean())
        peaks = np.stack(peaks)
        best = cands[_pick(peaks, cands, config)]
        if best[0] == "greedy":
            src = load if best[1] == "forecast" else np.maximum(np.asarray(last, dtype=np.float64), 0.0)
            try:
                return _greedy_refined(src, ranks, slots, groups, nodes, config.max_swap_rounds), 0.0, None
            except ValueError:  # more replicas of an expert than ranks: fall back to our own plans
                best = ours[_pick(peaks[:, : len(ours)], ours, config)]
    h, k = best
    plan = _solve([(load, [load + h * sd], [load + k * sd])], ranks, slots, groups, nodes, config.max_swap_rounds)[0][0]
    return plan, h, None


def _robust_refine(
    plan: np.ndarray,
    history: np.ndarray,
    weights: np.ndarray,
    load: np.ndarray,
    ranks: int,
    slots: int,
    groups: int | None,
    nodes: int | None,
    config: PlacementConfig,
) -> np.ndarray:
    """``plan [L, R*S]`` refined by the robust swap search over the observed windows.

    Scenarios: each window of ``history [W, L, E]`` in per-layer shares at ``load``'s layer
    totals, weighted by ``weights [L, W]`` (the chosen forecast's weights on the windows; windows
    under 1% of a layer's largest weight are dropped). Replica counts stay; hierarchical plans
    swap only inside nodes. Unchanged when off, under ``robust_min_slots`` or with one window."""
    from ascend_runtime.balancer.robust import refine_robust, shares

    if config.robust_rounds <= 0 or slots < config.robust_min_slots:
        return plan
    keep = (weights >= 0.01 * weights.max(axis=1, keepdims=True)).any(axis=0)  # [W]
    if keep.sum() < 2:
        return plan
    layers, n = load.shape
    scen = (shares(history[keep]) * load.sum(axis=1)[None, :, None]).transpose(1, 0, 2)  # [L, K, E]
    wt = weights[:, keep]
    wt = wt / wt.sum(axis=1, keepdims=True)
    blocks = nodes if (groups and nodes and nodes > 1) else 1
    counts = _presence(plan.reshape(layers, ranks, slots), n).sum(axis=1)  # [L, E]
    per = scen / np.maximum(counts, 1)[:, None, :]
    ids = plan.reshape(layers * blocks, ranks // blocks, slots)
    out = refine_robust(ids, np.repeat(per, blocks, axis=0), config.robust_rounds, np.repeat(wt, blocks, axis=0))
    return out.reshape(layers, -1)


def _pick(peaks: np.ndarray, cands: list[tuple], config: PlacementConfig) -> int:
    """Index of the candidate to use from held-out peaks ``[W, K, L]`` (K = candidates, maybe + greedy).

    The baseline is the unhedged plan (hedge 0, plain packing): the closest to what the last
    windows alone say. Another candidate replaces it only if its per-layer peaks are lower by at
    least ``config.evidence`` standard errors (paired over layers and windows), so one lucky
    held-out window does not buy a hedge; among those, the lowest total wins.
    """
    w, k, layers = peaks.shape
    base = cands.index((0.0, 0.0)) if (0.0, 0.0) in cands else 0
    d = (peaks - peaks[:, base : base + 1]).transpose(1, 0, 2).reshape(k, -1)  # [K, W*L]
    mean = d.mean(axis=1)
    se = d.std(axis=1, ddof=1) / np.sqrt(d.shape[1]) if d.shape[1] > 1 else np.zeros(k)
    ok = mean < -config.evidence * se - 1e-12
    ok[base] = True
    total = np.where(ok, peaks.sum(axis=(0, 2)), np.inf)
    return int(np.argmin(total))


def greedy_distinct(
    load: np.ndarray, ranks: int, slots: int, groups: int | None = None, nodes: int | None = None
) -> np.ndarray:
    """EPLB greedy on ``load [L, E]`` with no expert twice on one rank -> ids ``[L * blocks, R / blocks, S]``.

    Blocks are the nodes of the hierarchical policy (one block otherwise). Greedy may put two replicas of
    an expert on one rank, which vLLM-Ascend cannot serve (a rank holds an expert once); each such slot is
    swapped with a slot of another rank of its block (:func:`repair_duplicates`), which keeps greedy's
    replica counts. Raises ValueError when greedy gives an expert more replicas than its block has ranks:
    then no map keeps those counts."""
    layers, n = load.shape
    plan = eplb_greedy(load, ranks, slots, groups, nodes)
    blocks = nodes if (groups and nodes and nodes > 1) else 1
    ids = plan.reshape(layers * blocks, ranks // blocks, slots)
    replicas = _presence(ids.reshape(layers * blocks, 1, -1), n)[:, 0]  # per block [L * blocks, E]
    over = np.argwhere(replicas > ranks // blocks)
    if over.size:
        row, expert = (int(i) for i in over[0])
        where = f"layer {row // blocks}" + (f", node {row % blocks}" if blocks > 1 else "")
        raise ValueError(f"greedy gives expert {expert} ({where}) {int(replicas[row, expert])} replicas but there are "
                         f"{ranks // blocks} ranks{' per node' if blocks > 1 else ''}")
    return repair_duplicates(ids)


def _greedy_refined(
    load: np.ndarray, ranks: int, slots: int, groups: int | None, nodes: int | None, rounds: int
) -> np.ndarray:
    """EPLB greedy on ``load``, duplicates on a rank removed, then the swap search (inside nodes)."""
    layers, n = load.shape
    blocks = nodes if (groups and nodes and nodes > 1) else 1
    ids = greedy_distinct(load, ranks, slots, groups, nodes)
    per = load / np.maximum(_presence(ids.reshape(layers, ranks, slots), n).sum(axis=1), 1)
    ids = refine_swaps(ids, np.repeat(per, blocks, axis=0), rounds)
    return ids.reshape(layers, -1)


def plan_placement(
    load: np.ndarray,
    ranks: int,
    slots: int,
    groups: int | None = None,
    nodes: int | None = None,
    previous: np.ndarray | None = None,
    std: np.ndarray | None = None,
    config: PlacementConfig = PlacementConfig(),
    holdout=None,
    last: np.ndarray | None = None,
    history: np.ndarray | None = None,
) -> PlacementResult:
    """Plan a placement for the next window.

    ``load [L, E]``: forecast tokens per expert; ``std [L, E]``: its expected
    error (hedging); ``previous [L, R*S]``: the placement in service, or None;
    ``holdout``: see :func:`place_from_scratch`.
    """
    load = np.maximum(np.asarray(load, dtype=np.float64), 0.0)
    layers, n = load.shape
    fresh, hedge, chosen = _scratch(load, ranks, slots, groups, nodes, std, config, holdout, last, history)
    b_fresh = balancedness(fresh, load, ranks)
    if previous is None:
        return PlacementResult(fresh, b_fresh, None, 0, False, "scratch")
    previous = np.asarray(previous, dtype=np.int64)
    if previous.shape != (layers, ranks * slots):
        raise ValueError(f"previous placement has shape {previous.shape}, expected {(layers, ranks * slots)}")
    b_prev = balancedness(previous, load, ranks)
    if b_fresh < b_prev * (1 + config.min_gain):
        return PlacementResult(previous.copy(), b_prev, b_prev, 0, True, "kept")
    hedged = chosen if chosen is not None else load + hedge * (np.zeros_like(load) if std is None else np.asarray(std))
    prev3 = previous.reshape(layers, ranks, slots)
    fresh3 = fresh.reshape(layers, ranks, slots)
    hier = bool(groups and nodes and nodes > 1)
    target_slack = 1 + config.tolerance / 2
    inc: np.ndarray | None = None
    if not hier:
        target = _peaks(fresh3, load) * target_slack
        inc = incremental_batch(prev3, load, hedged, target, config.max_swap_rounds)
    else:
        node_of = _node_groups(prev3, groups, nodes, n)
        if node_of is not None:
            experts = _node_experts(node_of, groups, nodes, n)
            per_node = ranks // nodes
            prev_local = _to_local(prev3.reshape(layers, nodes, per_node, slots), experts, n)
            sub_w = np.take_along_axis(load[:, None, :].repeat(nodes, 1), experts, axis=2).reshape(layers * nodes, -1)
            sub_h = np.take_along_axis(hedged[:, None, :].repeat(nodes, 1), experts, axis=2).reshape(layers * nodes, -1)
            target = np.repeat(_peaks(fresh3, load) * target_slack, nodes)  # each node under the fresh peak
            local = incremental_batch(
                prev_local.reshape(layers * nodes, per_node, slots), sub_w, sub_h, target, config.max_swap_rounds
            )
            inc = np.take_along_axis(experts, local.reshape(layers, nodes, -1), axis=2).reshape(layers, ranks, slots)
    # per layer: keep the previous layer if it is already near the fresh peak, else the incremental
    # layer if it got there, else the fresh layer relabelled onto the previous nodes and ranks
    limit = _peaks(fresh3, load) * target_slack * (1 + 1e-9)
    keep = _peaks(prev3, load) <= limit
    out = prev3.copy()
    use_inc = np.zeros(layers, dtype=bool)
    if inc is not None:
        inc = align_slots(prev3, inc)
        use_inc = ~keep & (_peaks(inc, load) <= limit)
        out[use_inc] = inc[use_inc]
    todo = np.nonzero(~keep & ~use_inc)[0]
    if todo.size:  # only these layers pay for relabelling (the matching is the costly part)
        p3, f3 = prev3[todo], fresh3[todo]
        if hier:
            per_node = ranks // nodes
            by_node = relabel_ranks(p3.reshape(todo.size, nodes, -1), f3.reshape(todo.size, nodes, -1), n)
            f3 = relabel_ranks(p3, by_node.reshape(todo.size, ranks, slots), n, per_node)
        else:
            f3 = relabel_ranks(p3, f3, n)
        out[todo] = align_slots(p3, f3)
    out = out.reshape(layers, -1)
    b = balancedness(out, load, ranks)
    fresh_layers = int((~keep & ~use_inc).sum())
    name = "incremental" if fresh_layers == 0 else ("relabelled" if fresh_layers == layers else "mixed")
    return PlacementResult(out, b, b_prev, moved_slots(previous, out, ranks, n), False, name)
