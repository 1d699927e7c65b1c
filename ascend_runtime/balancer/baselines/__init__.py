"""Upstream vLLM-Ascend EPLB policies, reimplemented in numpy as baselines.

Every module has ``place(load, num_ranks, slots_per_rank, ...) -> placement``:
``load`` is ``[L, E]`` (one window) or a history ``[W, L, E]`` (oldest first);
the placement is ``[L, R*S]`` logical ids, rank ``r`` owning slots
``r*S .. r*S+S-1`` (as :mod:`ascend_runtime.balancer.placement` returns).

- :mod:`.swift_balancer`: SwiftBalancer (vLLM-Ascend ``eplb_policy_type`` 2);
- :mod:`.flashlb`: FlashLB (type 3), the tree search of v0.23.0 and the
  first version (group-based adaptive bloating) as ``variant="pr3042"``.
"""

from __future__ import annotations

from ascend_runtime.balancer.baselines import flashlb, swift_balancer
from ascend_runtime.balancer.baselines.common import as_history

POLICIES = {"swift_balancer": swift_balancer.place, "flashlb": flashlb.place}


__all__ = ["POLICIES", "as_history", "flashlb", "swift_balancer"]
