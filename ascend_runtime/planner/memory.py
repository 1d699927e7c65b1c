"""HBM estimate per NPU: weights by quantisation and sharding, KV cache, reserve.

Weights per NPU (bytes):
  non-expert linear layers (attention, dense FFN, shared experts, router) / tp
  x bytes per weight, plus embeddings and LM head / tp in BF16, plus the
  routed expert slots the rank holds: (experts + redundant) / ep slots per
  MoE layer (MoE layers + the MTP layer when MTP is on) x params per expert x
  bytes per weight (experts are split by tp instead when ep == 1).
KV cache per NPU (bytes): max_num_seqs x context_len x KV bytes per token
  (MLA's latent cache is replicated, not split, across TP ranks).
GiB = 2**30 bytes; the budget is HBM x gpu_memory_utilization.
"""

from __future__ import annotations

from ascend_runtime.config.model import ModelShape
from ascend_runtime.config.stack import StageConfig
from ascend_runtime.hardware import HardwareSpec
from ascend_runtime.planner.plan import MemoryEstimate

GIB = float(2**30)
EMBEDDING_BYTES = 2.0


def expert_slots_per_rank(model: ModelShape, stage: StageConfig) -> int:
    """Physical expert slots per rank per MoE layer (assumes ep divides the slots)."""
    return (model.num_routed_experts + stage.redundant_experts) // max(stage.ep, 1)


def estimate_memory(model: ModelShape, stage: StageConfig, hardware: HardwareSpec) -> MemoryEstimate:
    """HBM per NPU for one stage's shape."""
    wbytes = model.weight_bytes_per_param
    moe_layers = model.num_moe_layers + (model.num_mtp_layers if stage.mtp else 0)
    non_expert = model.non_expert_linear_params(with_mtp=stage.mtp) * wbytes / stage.tp
    embeddings = model.embedding_params * EMBEDDING_BYTES / stage.tp
    if stage.ep > 1:
        experts = expert_slots_per_rank(model, stage) * moe_layers * model.params_per_expert * wbytes
    else:
        slots = model.num_routed_experts + stage.redundant_experts
        experts = slots * moe_layers * model.params_per_expert * wbytes / stage.tp
    kv = stage.max_num_seqs * stage.context_len * model.kv_bytes_per_token(with_mtp=stage.mtp)
    return MemoryEstimate(
        weights_gib=round((non_expert + embeddings + experts) / GIB, 2),
        kv_cache_gib=round(kv / GIB, 2),
        reserve_gib=round(stage.reserve_gib, 2),
        budget_gib=round(hardware.hbm_gib_per_device * stage.gpu_memory_utilization, 2),
        hbm_gib=hardware.hbm_gib_per_device,
    )
