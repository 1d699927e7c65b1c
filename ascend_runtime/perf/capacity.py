"""HBM budget of one NPU: weights resident and KV cache capacity (tokens).

weights/NPU = ModelShape.weight_bytes_per_npu (the planner's formula)
KV tokens per DP rank = (HBM x gpu_memory_utilization - weights/NPU) / KV bytes per token
(MLA's latent cache is replicated over TP ranks, so TP does not multiply it).
"""

from __future__ import annotations

from ascend_runtime.perf.sim_config import SimConfig


def weight_bytes_per_npu(cfg: SimConfig) -> float:
    """Weight bytes resident on one NPU of a resolved config."""
    return cfg.model_shape().weight_bytes_per_npu(int(cfg.tp or 1), int(cfg.ep or 1), cfg.redundant_experts, cfg.mtp)


def kv_capacity_tokens(cfg: SimConfig) -> int:
    """KV cache tokens one DP rank holds; raises ValueError when the weights do not fit."""
    free = cfg.profile.hbm_bytes * cfg.gpu_memory_utilization - weight_bytes_per_npu(cfg)
    if free <= 0:
        raise ValueError(
            f"weights need {weight_bytes_per_npu(cfg) / 1e9:.1f} GB per NPU, more than "
            f"{cfg.gpu_memory_utilization:.0%} of {cfg.profile.hbm_bytes / 1e9:.0f} GB HBM; use more NPUs (EP)"
        )
    return int(free // cfg.model_shape().kv_bytes_per_token(with_mtp=cfg.mtp))
