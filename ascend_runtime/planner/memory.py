"""HBM estimate per NPU: weights by quantisation and sharding, KV cache, reserve.

Weights per NPU: :meth:`ModelShape.weight_bytes_per_npu` (shared with the simulator), changed by the
stage's per-module degrees (:func:`ascend_runtime.planner.modules.weight_bytes_per_npu`).
KV cache per NPU (bytes): max_num_seqs x context_len x KV bytes per token
  (MLA's latent cache is replicated, not split, across TP ranks).
GiB = 2**30 bytes; the budget is HBM x gpu_memory_utilization.
"""

from __future__ import annotations

from ascend_runtime.config.model import ModelShape
from ascend_runtime.config.stack import StageConfig
from ascend_runtime.hardware import HardwareSpec
from ascend_runtime.planner.modules import weight_bytes_per_npu as module_weight_bytes_per_npu
from ascend_runtime.planner.plan import MemoryEstimate

GIB = float(2**30)


def expert_slots_per_rank(model: ModelShape, stage: StageConfig) -> int:
    """Physical expert slots per rank per MoE layer (assumes ep divides the slots)."""
    return (model.num_routed_experts + stage.redundant_experts) // max(stage.ep, 1)


def estimate_memory(model: ModelShape, stage: StageConfig, hardware: HardwareSpec) -> MemoryEstimate:
    """HBM per NPU for one stage's shape."""
    weights = module_weight_bytes_per_npu(model, stage)  # per-module degrees included (planner/modules.py)
    kv = stage.max_num_seqs * stage.context_len * model.kv_bytes_per_token(with_mtp=stage.mtp)
    return MemoryEstimate(
        weights_gib=round(weights / GIB, 2),
        kv_cache_gib=round(kv / GIB, 2),
        reserve_gib=round(stage.reserve_gib, 2),
        budget_gib=round(hardware.hbm_gib_per_device * stage.gpu_memory_utilization, 2),
        hbm_gib=hardware.hbm_gib_per_device,
    )
