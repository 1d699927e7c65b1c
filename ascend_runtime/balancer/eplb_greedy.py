"""DeepSeek's EPLB greedy, re-implemented in numpy from its published description.

Kept faithful on purpose (it is the baseline the benchmark compares against):

1. replicas: each extra physical slot goes to the logical expert with the
   largest load per replica (no cap, no forecast);
2. packing: items heaviest first, each into the lightest pack that still has a
   free slot (equal item count per pack);
3. hierarchical (``groups % nodes == 0``): expert groups are packed onto nodes
   first, replicas and rank packing then happen inside each node; otherwise the
   global policy (one group, one node) is used.

Replicas of one expert may land on the same rank, as in the original.
"""

from __future__ import annotations

import numpy as np


def balanced_packing(weight: np.ndarray, num_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """Pack ``n`` weighted items into ``num_packs`` packs of ``n/num_packs`` items.

    ``weight [B, n]`` -> ``(pack_index [B, n], rank_in_pack [B, n])``.
    """
    rows, n = weight.shape
    per_pack = n // num_packs
    if per_pack == 1:
        idx = np.broadcast_to(np.arange(n), (rows, n)).copy()
        return idx, np.zeros_like(idx)
    order = np.argsort(-weight, axis=1, kind="stable")
    pack_index = np.empty((rows, n), dtype=np.int64)
    rank_in_pack = np.empty((rows, n), dtype=np.int64)
    loads = np.zeros((rows, num_packs))
    counts = np.zeros((rows, num_packs), dtype=np.int64)
    row = np.arange(rows)
    for k in range(n):
        item = order[:, k]
        cost = np.where(counts < per_pack, loads, np.inf)
        pack = cost.argmin(axis=1)
        pack_index[row, item] = pack
        rank_in_pack[row, item] = counts[row, pack]
        loads[row, pack] += weight[row, item]
        counts[row, pack] += 1
    return pack_index, rank_in_pack


def replicate_experts(weight: np.ndarray, num_physical: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Give ``num_physical - n`` extra replicas, each to the max load-per-replica expert.

    ``weight [B, n]`` -> ``(phy2log [B, P], replica_rank [B, P], logcnt [B, n])``.
    """
    rows, n = weight.shape
    phy2log = np.empty((rows, num_physical), dtype=np.int64)
    phy2log[:, :n] = np.arange(n)
    replica_rank = np.zeros((rows, num_physical), dtype=np.int64)
    logcnt = np.ones((rows, n), dtype=np.int64)
    row = np.arange(rows)
    for i in range(n, num_physical):
        best = (weight / logcnt).argmax(axis=1)
        phy2log[:, i] = best
        replica_rank[:, i] = logcnt[row, best]
        logcnt[row, best] += 1
    return phy2log, replica_rank, logcnt


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def rebalance_hierarchical(
    weight: np.ndarray, num_physical: int, num_groups: int, num_nodes: int, num_ranks: int
) -> np.ndarray:
    """EPLB's hierarchical policy. ``weight [L, E]`` -> ``phy2log [L, num_physical]``."""
    layers, experts = weight.shape
    group_size = experts // num_groups
    groups_per_node = num_groups // num_nodes
    phy_per_rank = num_physical // num_ranks
    # 1. expert groups onto nodes
    group_load = weight.reshape(layers, num_groups, group_size).sum(axis=2)
    g_pack, g_rank = balanced_packing(group_load, num_nodes)
    log2mlog = (((g_pack * groups_per_node + g_rank) * group_size)[:, :, None] + np.arange(group_size)).reshape(
        layers, experts
    )
    mlog2log = _inverse(log2mlog)
    # 2. replicas inside each node
    mlog_load = np.take_along_axis(weight, mlog2log, axis=1).reshape(-1, experts // num_nodes)
    phy2mlog, phy_rank, mlogcnt = replicate_experts(mlog_load, num_physical // num_nodes)
    # 3. physical experts onto the node's ranks
    phy_load = np.take_along_axis(mlog_load / mlogcnt, phy2mlog, axis=1)
    pack, rank_in_pack = balanced_packing(phy_load, num_ranks // num_nodes)
    pphy2phy = _inverse(pack * phy_per_rank + rank_in_pack)
    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=1)
    offsets = (np.arange(num_nodes) * (experts // num_nodes))[None, :, None]
    pphy2mlog = (pphy2mlog.reshape(layers, num_nodes, -1) + offsets).reshape(layers, -1)
    return np.take_along_axis(mlog2log, pphy2mlog, axis=1)


def eplb_greedy(
    load: np.ndarray, ranks: int, slots: int, groups: int | None = None, nodes: int | None = None
) -> np.ndarray:
    """EPLB placement ``[L, R*S]`` for ``load [L, E]``; hierarchical when groups/nodes allow it."""
    load = np.asarray(load, dtype=np.float64)
    if groups and nodes and groups % nodes == 0 and ranks % nodes == 0:
        return rebalance_hierarchical(load, ranks * slots, groups, nodes, ranks)
    return rebalance_hierarchical(load, ranks * slots, 1, 1, ranks)


def trivial_placement(layers: int, experts: int, ranks: int, slots: int) -> np.ndarray:
    """Slot ``k`` holds expert ``k mod E`` in every layer: ``[L, R*S]``."""
    return np.broadcast_to(np.arange(ranks * slots) % experts, (layers, ranks * slots)).copy()
