"""DeepSeek-V3/R1 model shape and the sizes derived from it.

Defaults are the published DeepSeek-V3/R1 shape (facts file, section 1):
61 layers = 3 dense + 58 MoE, 256 routed experts + 1 shared, top-8 of 8 groups,
hidden 7168, expert FFN 2048, dense FFN 18432, vocab 129280, MLA caching
512 latent + 64 rope values per token per layer, 1 MTP layer.

The shape must be self-consistent (:meth:`ModelShape._consistent`): at least one
MoE layer, top-k within the routed experts, experts split evenly into groups.
``weights_path`` is where the
engine finds the weights; the engine pod mounts its parent directory, so the
parent must be a directory of its own (not ``/`` nor a system directory).
"""

from __future__ import annotations

import posixpath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ascend_runtime.config.errors import SYSTEM_DIRS, AbsolutePath, Token, invalid

Quantization = Literal["w8a8", "bf16"]

#: Embeddings and LM head stay in BF16 whatever the quantisation.
EMBEDDING_BYTES = 2.0

#: Bytes per weight element by quantisation of the linear layers.
WEIGHT_BYTES: dict[str, float] = {"w8a8": 1.0, "bf16": 2.0}


class ModelShape(BaseModel):
    """The transformer shape; every size the planner and simulator need derives from it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Token = Field("deepseek-ai/DeepSeek-R1", description="Served model name (OpenAI `model`; no spaces).")
    weights_path: AbsolutePath = Field(
        "/data/models/DeepSeek-R1-W8A8",
        description="Model directory inside the engine container: absolute, normalised, at least two levels deep "
        "(its parent directory is mounted).",
    )
    quantization: Quantization = Field("w8a8", description="Weight quantisation: w8a8 (Ascend A8W8 dynamic) or bf16.")
    num_layers: int = Field(61, ge=1, le=1024, description="Transformer layers (dense + MoE).")
    num_dense_layers: int = Field(3, ge=0, le=1024, description="Leading dense FFN layers.")
    num_mtp_layers: int = Field(1, ge=0, le=16, description="Multi-token-prediction layers shipped with the weights.")
    num_routed_experts: int = Field(256, ge=1, le=4096, description="Routed experts per MoE layer.")
    num_shared_experts: int = Field(1, ge=0, le=64, description="Shared experts per MoE layer.")
    experts_per_token: int = Field(8, ge=1, le=256, description="Routed experts chosen per token (top-k).")
    num_expert_groups: int = Field(8, ge=1, le=4096, description="Expert groups for group-limited routing.")
    hidden_size: int = Field(7168, ge=1, le=65536)
    moe_intermediate_size: int = Field(2048, ge=1, le=262144, description="FFN width of one expert.")
    dense_intermediate_size: int = Field(18432, ge=1, le=262144, description="FFN width of the dense layers.")
    vocab_size: int = Field(129280, ge=1, le=4194304)
    num_attention_heads: int = Field(128, ge=1, le=1024)
    q_lora_rank: int = Field(1536, ge=1, le=65536)
    kv_lora_rank: int = Field(512, ge=1, le=65536, description="MLA latent values cached per token per layer.")
    qk_rope_head_dim: int = Field(64, ge=1, le=4096, description="Rope values cached per token per layer.")
    qk_nope_head_dim: int = Field(128, ge=1, le=4096)
    v_head_dim: int = Field(128, ge=1, le=4096)
    kv_cache_dtype_bytes: int = Field(2, description="Bytes per cached KV value: 1 (INT8), 2 (BF16) or 4 (FP32).")
    max_model_len: int = Field(32768, ge=1, le=16777216, description="Longest context the engine accepts (tokens).")

    @field_validator("kv_cache_dtype_bytes")
    @classmethod
    def _dtype_bytes(cls, value: int) -> int:
        if value not in (1, 2, 4):
            raise invalid("is no KV cache data type's size", "write 1 (INT8), 2 (BF16) or 4 (FP32)")
        return value

    @field_validator("weights_path")
    @classmethod
    def _mountable(cls, value: str) -> str:
        parent = posixpath.dirname(value)
        if parent == "/" or parent in SYSTEM_DIRS:
            raise invalid(
                f"the engine pod mounts the weights' parent directory, here {parent}",
                f"keep the weights in a directory of their own, e.g. '/data/models/{posixpath.basename(value)}'",
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "ModelShape":
        if self.num_dense_layers >= self.num_layers:
            raise invalid(f"leaves no MoE layer: num_dense_layers {self.num_dense_layers} >= num_layers {self.num_layers}",
                          f"set num_dense_layers below {self.num_layers} (DeepSeek-V3/R1: 3 of 61)", at="num_dense_layers")
        if self.experts_per_token > self.num_routed_experts:
            raise invalid(f"top-k {self.experts_per_token} exceeds num_routed_experts {self.num_routed_experts}",
                          f"set experts_per_token to {self.num_routed_experts} or less (DeepSeek-V3/R1: 8)",
                          at="experts_per_token")
        if self.num_expert_groups > self.num_routed_experts or self.num_routed_experts % self.num_expert_groups:
            raise invalid(f"num_routed_experts {self.num_routed_experts} cannot be split into "
                          f"{self.num_expert_groups} equal groups", "use a divisor of num_routed_experts (DeepSeek-V3/R1: 8)",
                          at="num_expert_groups")
        return self

    @property
    def num_moe_layers(self) -> int:
        """MoE layers (58 for DeepSeek-V3/R1)."""
        return self.num_layers - self.num_dense_layers

    @property
    def params_per_expert(self) -> int:
        """Parameters of one expert: gate, up and down projections (44.0M for V3)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def attention_params_per_layer(self) -> int:
        """MLA parameters of one layer (q_a, q_b, kv_a, kv_b, o)."""
        h, n = self.hidden_size, self.num_attention_heads
        qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
        q_a = h * self.q_lora_rank
        q_b = self.q_lora_rank * n * qk_head
        kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * n * (self.qk_nope_head_dim + self.v_head_dim)
        o = n * self.v_head_dim * h
        return q_a + q_b + kv_a + kv_b + o

    @property
    def embedding_params(self) -> int:
        """Input embedding plus LM head."""
        return 2 * self.vocab_size * self.hidden_size

    def routed_expert_params(self, layers: int | None = None) -> int:
        """Parameters of all routed experts over ``layers`` MoE layers (default all)."""
        n = self.num_moe_layers if layers is None else layers
        return n * self.num_routed_experts * self.params_per_expert

    def non_expert_linear_params(self, with_mtp: bool = False) -> int:
        """Attention, dense FFN, shared experts and router weights (quantised linear layers)."""
        layers = self.num_layers + (self.num_mtp_layers if with_mtp else 0)
        moe_layers = self.num_moe_layers + (self.num_mtp_layers if with_mtp else 0)
        dense_ffn = self.num_dense_layers * 3 * self.hidden_size * self.dense_intermediate_size
        shared = moe_layers * self.num_shared_experts * self.params_per_expert
        router = moe_layers * self.num_routed_experts * self.hidden_size
        return layers * self.attention_params_per_layer + dense_ffn + shared + router

    def kv_bytes_per_token(self, with_mtp: bool = False) -> int:
        """KV cache bytes one token occupies over all layers (70,272 B for V3 in BF16)."""
        layers = self.num_layers + (self.num_mtp_layers if with_mtp else 0)
        return layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_cache_dtype_bytes

    @property
    def weight_bytes_per_param(self) -> float:
        """Bytes per quantised linear-layer weight."""
        return WEIGHT_BYTES[self.quantization]

    def weight_bytes_per_npu(self, tp: int, ep: int, redundant_experts: int = 0, mtp: bool = False) -> float:
        """Weight bytes resident on one NPU of an instance sharded ``tp`` x ``ep``.

        Non-expert linear layers (attention, dense FFN, shared experts, router) / tp
        x bytes per weight, plus embeddings and LM head / tp in BF16, plus the routed
        expert slots of one rank: (experts + redundant) / ep per MoE layer (MoE layers
        and the MTP layer when on) x params per expert x bytes per weight; with ep == 1
        the experts are split by tp instead.
        """
        wbytes = self.weight_bytes_per_param
        moe_layers = self.num_moe_layers + (self.num_mtp_layers if mtp else 0)
        slots = self.num_routed_experts + redundant_experts
        expert_bytes = moe_layers * self.params_per_expert * wbytes
        experts = (slots // ep) * expert_bytes if ep > 1 else slots * expert_bytes / tp
        non_expert = self.non_expert_linear_params(with_mtp=mtp) * wbytes + self.embedding_params * EMBEDDING_BYTES
        return experts + non_expert / tp
