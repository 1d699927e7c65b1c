"""HBM budget of one NPU: weights resident and KV cache capacity (tokens).

weights/NPU = expert slots/rank x MoE layers x expert params x bytes/param
            + (non-expert linear params x bytes/param + embeddings in BF16) / TP
KV tokens per DP rank = (HBM x gpu_memory_utilization - weights/NPU) / KV bytes per token
(MLA's latent cache is replicated over TP ranks, so TP does not multiply it).
"""

from __future__ import annotations

from ascend_runtime.sim.config import SimConfig


def weight_bytes_per_npu(cfg: SimConfig) -> float:
    """Weight bytes resident on one NPU of a resolved config."""
    m = cfg.model_shape()
    bpp = m.weight_bytes_per_param
    moe_layers = m.num_moe_layers + (m.num_mtp_layers if cfg.mtp else 0)
    experts = cfg.slots_per_rank * moe_layers * m.params_per_expert * bpp
    rest = m.non_expert_linear_params(with_mtp=cfg.mtp) * bpp + m.embedding_params * 2
    return experts + rest / int(cfg.tp or 1)


def kv_capacity_tokens(cfg: SimConfig) -> int:
    """KV cache tokens one DP rank holds; raises ValueError when the weights do not fit."""
    free = cfg.profile.hbm_bytes * cfg.gpu_memory_utilization - weight_bytes_per_npu(cfg)
    if free <= 0:
        raise ValueError(
            f"weights need {weight_bytes_per_npu(cfg) / 1e9:.1f} GB per NPU, more than "
            f"{cfg.gpu_memory_utilization:.0%} of {cfg.profile.hbm_bytes / 1e9:.0f} GB HBM; use more NPUs (EP)"
        )
    return int(free // cfg.model_shape().kv_bytes_per_token(with_mtp=cfg.mtp))
