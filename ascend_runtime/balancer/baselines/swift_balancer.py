"""SwiftBalancer (vLLM-Ascend ``eplb_policy_type`` 2, ``SwiftBalanceEplb``), reimplemented.

Read from vllm-project/vllm-ascend, release v0.23.0 (commit
5cb98caaadeff42b5b62b996e34bb2aaa29d20fd),
``vllm_ascend/eplb/core/policy/policy_swift_balancer.py``.

Shapes: ``L`` layers, ``E`` experts, ``R`` ranks, ``S`` slots per rank.
SwiftBalancer *edits* the placement in service (``previous [L, R*S]``; default
the engine's initial map, see :func:`initial_placement`) on one load window
``[L, E]`` (a history ``[W, L, E]`` is summed: the engine hands the policy the
load accumulated since the last rebalance). Per layer:

1. skip the layer if its peak / mean rank load is below 1.01;
2. scanning slot columns, then ranks, the first copy of each expert stays
   where it is; every later copy frees its slot ("redundant position");
3. redundant replicas one at a time to the expert with the largest current
   weight (ties: the later expert), at most ``R`` copies; the weight becomes
   ``w * (c + 1) / (c + 2)`` (upstream's formula, i.e. ``2w / (k + 2)`` after
   ``k`` extra copies, not ``w / (k + 1)``; kept: it drives the decisions);
4. those replicas, heaviest first, to the least loaded rank with a free
   position that lacks the expert and has not yet received from the expert's
   home rank (one transfer per rank pair); free positions left over get the
   heaviest expert not on the rank, weights then recomputed as ``w / copies``;
5. up to 100 swaps: the most loaded rank trades one expert with the first rank
   (lightest first) that has not yet exchanged with it and offers the swap
   lowering the pair's maximum most, if by at least 1% of the mean rank load
   (of layer 0); received experts do not move again;
6. the layer is taken if its resulting peak (on the step-3/4 weights) over the
   mean is below the starting imbalance; slots are then ordered so that kept
   experts stay in their old slot.

With ``ranks_per_node`` (upstream ``is_node_redundant``), steps 2-5 run inside
each node of that many ranks, the node's experts only. The engine calls the
policy without it (global mode), as here by default. Set iteration follows
CPython's order for small ints, as upstream's sets do.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ascend_runtime.balancer.baselines.common import as_history

IMBALANCE_THRESHOLD = 1.01
INCREMENT = 0.01
MAX_SWAPS = 100
MAX_TRANSFERS = 1  # upstream num_max_com


def initial_placement(layers: int, experts: int, ranks: int, slots: int) -> np.ndarray:
    """The engine's starting map ``[L, R*S]``: expert ``e`` on rank ``e // (E/R)``, extra slots
    of each rank take experts ``0, 1, ...`` in turn (as the simulator's ``ExpertMap.default``)."""
    return _default(layers, experts, ranks, slots)


def _default(layers: int, experts: int, ranks: int, slots: int) -> np.ndarray:
    total = ranks * slots
    if experts % ranks:
        row = list(range(experts)) + [i % experts for i in range(total - experts)]
    else:
        per, extra, red, row = experts // ranks, slots - experts // ranks, 0, []
        for r in range(ranks):
            row += list(range(r * per, (r + 1) * per))
            row += [(red + i) % experts for i in range(extra)]
            red += extra
    return np.tile(np.asarray(row, dtype=np.int64), (layers, 1))


def _imbalance(dep: np.ndarray, w: np.ndarray, ranks: int) -> float:
    """Peak over mean rank load of ``dep [R, S]`` under logical loads ``w [E]``."""
    counts = np.bincount(dep.ravel(), minlength=w.shape[0])
    loads = (w / np.maximum(counts, 1))[dep].sum(axis=1)
    avg = loads.sum() / ranks
    return 1.0 if abs(avg) < 1e-9 else float(loads.max() / avg)


def _redistribute(w: np.ndarray, dep: np.ndarray, experts: int):
    """Steps 2-4 on one node ``dep [r, S]``: (assignments, rank loads, weights, transfers, received)."""
    ranks, slots = dep.shape
    free: list[list[int]] = [[] for _ in range(ranks)]
    home = np.zeros(experts, dtype=np.int64)
    seen: set[int] = set()
    extra = 0
    for s in range(slots):
        for r in range(ranks):
            e = int(dep[r, s])
            if e not in seen:
                seen.add(e)
                home[e] = r
            else:
                free[r].append(s)
                extra += 1
    initial = [(e, w[e]) for e in seen]
    current = list(initial)
    copies = np.zeros(experts, dtype=np.int64)
    for _ in range(extra):
        for i in np.argsort([x for _, x in current], kind="stable")[::-1]:
            e, weight = current[i]
            c = copies[e] + 1
            if c < ranks:
                copies[e] += 1
                current[i] = (e, weight * (c + 1) / (c + 2))
                break
    weights = np.zeros(experts, dtype=np.float32)
    for e, x in current:
        weights[e] = x
    replicas = sorted(((e, float(weights[e])) for e in range(experts) for _ in range(copies[e])),
                      key=lambda t: t[1], reverse=True) if extra else []
    assign = np.full((ranks, slots), -1, dtype=np.int64)
    loads = np.zeros(ranks, dtype=np.float32)
    for r in range(ranks):
        for s in range(slots):
            if s not in free[r]:
                assign[r, s] = dep[r, s]
                loads[r] += weights[dep[r, s]]
    received: defaultdict[int, set[int]] = defaultdict(set)
    com = np.zeros((ranks, ranks), dtype=np.int64)
    for e, x in replicas:
        src, best = home[e], -1
        for r in range(ranks):
            if not free[r] or e in assign[r] or com[src, r] >= MAX_TRANSFERS:
                continue
            if best == -1 or loads[r] < loads[best]:
                best = r
        if best != -1:
            assign[best, free[best].pop()] = e
            loads[best] += x
            com[src, best] += 1
            received[best].add(e)
    open_ranks = [r for r in range(ranks) if free[r]]
    if open_ranks:
        n_copies = np.zeros(experts, dtype=np.int64)
        for e in assign.ravel():
            if e != -1:
                n_copies[e] += 1
        weights = np.full(experts, -1, dtype=np.float32)
        for e, x in initial:
            weights[e] = x / n_copies[e]
        for r in open_ranks:
            for s in free[r]:
                for e in np.argsort(weights, kind="stable")[::-1]:
                    if e in assign[r]:
                        continue
                    if np.isclose(weights[e], -1):
                        raise ValueError(f"expert {e} is not in the node")
                    assign[r, s] = e
                    com[home[e], r] += 1
                    received[r].add(int(e))
                    k = n_copies[e]
                    weights[e] *= k / (k + 1)
                    n_copies[e] += 1
                    break
        loads = np.zeros(ranks, dtype=np.float32)
        for r in range(ranks):
            for e in assign[r]:
                loads[r] += weights[e]
    return assign, loads, weights, com, received


def _best_swap(a: set, b: set, recv_a: set, recv_b: set, w: np.ndarray, la: float, lb: float):
    best_x, best_y, best = -1, -1, la
    for x in a:
        if x in b or x in recv_a:
            continue
        wx = float(w[x])
        for y in b:
            if y in a or y in recv_b:
                continue
            wy = float(w[y])
            m = max(la - wx + wy, lb - wy + wx)
            if m < best:
                best_x, best_y, best = x, y, m
    return best_x, best_y, best


def _exchange(assign, loads, com, received, w, threshold: float) -> tuple[list[list[int]], float]:
    """Step 5 on one node: ``assign [r, S]`` -> rows (set order) and the peak (on ``w``)."""
    sets = [{int(e) for e in row} for row in assign]
    peak, moved, budget = 0.0, True, MAX_SWAPS
    while budget > 0:
        budget -= 1
        order = np.argsort(loads, kind="stable")
        top = int(order[-1])
        peak = float(loads[top])
        if not moved:
            break
        moved = False
        for other in order[:-1]:
            if com[other, top] >= MAX_TRANSFERS or com[top, other] >= MAX_TRANSFERS:
                continue
            x, y, m = _best_swap(sets[top], sets[other], received[top], received[other], w, peak, loads[other])
            if peak - m < threshold or x == -1:
                continue
            sets[top].remove(x)
            sets[other].remove(y)
            sets[top].add(y)
            sets[other].add(x)
            loads[top] += w[y] - w[x]
            loads[other] += w[x] - w[y]
            received[top].add(y)
            received[other].add(x)
            com[other, top] += 1
            com[top, other] += 1
            moved = True
            break
    return [list(s) for s in sets], peak


def _keep_slots(old: np.ndarray, new: list[int]) -> list[int]:
    """Order ``new`` so experts also in ``old`` (one rank's slots) keep their old slot."""
    num = len(new)
    taken, out, rest = [False] * num, [-1] * num, []
    for e in new:
        for j in range(num):
            if e == old[j] and not taken[j]:
                taken[j], out[j] = True, e
                break
        else:
            rest.append(e)
    it = iter(rest)
    return [x if x != -1 else next(it) for x in out]


def place(load: np.ndarray, num_ranks: int, slots_per_rank: int, previous: np.ndarray | None = None,
          ranks_per_node: int | None = None) -> np.ndarray:
    """SwiftBalancer placement ``[L, R*S]`` from ``previous [L, R*S]`` and ``load [L, E]`` or ``[W, L, E]``."""
    hist = as_history(load)
    w_all = hist.sum(axis=0)  # [L, E]
    layers, experts = w_all.shape
    ranks, slots = num_ranks, slots_per_rank
    if ranks * slots < experts:
        raise ValueError(f"{ranks} ranks x {slots} slots < {experts} experts")
    prev = initial_placement(layers, experts, ranks, slots) if previous is None else np.asarray(previous, dtype=np.int64)
    if prev.shape != (layers, ranks * slots):
        raise ValueError(f"previous has shape {prev.shape}, expected {(layers, ranks * slots)}")
    if ranks_per_node is not None and ranks % ranks_per_node:
        raise ValueError(f"ranks ({ranks}) must be a multiple of ranks_per_node ({ranks_per_node})")
    table = prev.reshape(layers, ranks, slots)
    ave = w_all[0].sum() / ranks  # upstream: layer 0's mean rank load for every layer
    threshold = ave * INCREMENT
    block = ranks_per_node or ranks
    out = table.copy()
    for layer in range(layers):
        w = w_all[layer]
        start = _imbalance(table[layer], w, ranks)
        if start < IMBALANCE_THRESHOLD:
            continue
        rows: list[list[int]] = []
        peak = 0.0
        for n0 in range(0, ranks, block):
            assign, loads, weights, com, received = _redistribute(w, table[layer, n0:n0 + block], experts)
            node_rows, node_peak = _exchange(assign, loads, com, received, weights, threshold)
            rows += node_rows
            peak = max(peak, node_peak)
        if ave > 0 and peak / ave < start:
            out[layer] = np.asarray(rows, dtype=np.int64)
    for layer in range(layers):
        for r in range(ranks):
            out[layer, r] = _keep_slots(table[layer, r].tolist(), out[layer, r].tolist())
    return out.reshape(layers, ranks * slots)
