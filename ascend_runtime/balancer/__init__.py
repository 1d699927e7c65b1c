"""Expert load balancing: placement with redundant experts, published safely.

Modules: ``measure`` (balancedness, moves), ``placement`` (our planner),
``eplb_greedy`` (DeepSeek's EPLB baseline), ``forecast`` (decayed load),
``expert_map`` (vLLM-Ascend JSON + validator), ``publish`` (file/ConfigMap),
``sources`` / ``apply`` (plug-ins), ``daemon`` (the loop), ``trace`` (synthetic load).
"""

from ascend_runtime.balancer.expert_map import (
    InvalidExpertMap,
    map_to_placement,
    placement_to_map,
    validate_map,
)
from ascend_runtime.balancer.measure import balancedness, moved_slots
from ascend_runtime.balancer.placement import (
    PlacementConfig,
    PlacementResult,
    place_from_scratch,
    plan_placement,
)

__all__ = [
    "InvalidExpertMap",
    "PlacementConfig",
    "PlacementResult",
    "balancedness",
    "map_to_placement",
    "moved_slots",
    "place_from_scratch",
    "placement_to_map",
    "plan_placement",
    "validate_map",
]
