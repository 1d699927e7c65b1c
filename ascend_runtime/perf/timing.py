"""The per-step timing model (documented in docs/simulator.md, "Timing model").

The engine simulator (``ascend_runtime.sim.engine``) steps on it, and the closed-form
performance model (:mod:`ascend_runtime.perf.model`) evaluates it on uniform batches.

One engine step runs every DP rank's batch at once (MoE all-to-all keeps DP
ranks in lock step). Its modelled time, in seconds, is

    step = k[hw, role] * ( overhead
                         + max over DP ranks (weights + linear + attention)
                         + sum over MoE layers max over EP ranks (expert weights + expert compute)
                         + sum over MoE layers all-to-all(max rank traffic) )

with, per NPU (bytes, FLOP, bytes/s, FLOP/s from the hardware profile):

- weights   = non-expert weight bytes / TP / HBM bandwidth (read once per step)
- linear    = 2 * non-expert params * tokens / TP / FLOPS
- attention = decode: max(KV bytes read, MLA absorbed FLOPs), prefill: causal FLOPs
- experts   = active slots * expert bytes / HBM bw + rank load * 2 * expert params / FLOPS
- all2all   = max(rank receive, rank send) * hidden * 3 B (int8 dispatch + bf16 combine)
              at the mix of intra-node and inter-node bandwidth of an EP rank's peers,
              plus 2 * alpha per MoE layer: the dispatch and the combine are each one
              collective call with a fixed latency alpha (``COLLECTIVE_LATENCY_S``)

The maxima over EP ranks are where expert placement enters: a skewed placement
raises the max rank load, hence the step. ``k`` is solved so that the published
reference configuration at its ``Reference.imbalance`` (max/mean rank load a good
EPLB placement leaves) reproduces the published step time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ascend_runtime.config.model import ModelShape
from ascend_runtime.perf.profiles import HARDWARE, ROLE_DEFAULTS, HardwareProfile
from ascend_runtime.perf.sim_config import SimConfig

#: Fixed per-step cost (scheduling, launch, sampling), seconds before calibration.
STEP_OVERHEAD_S = 1e-3
#: alpha: seconds one collective call costs beyond its bytes (launch + synchronisation of the group).
#: It is the value the performance model fits on vLLM-Ascend's own measured fine-grained TP table
#: (v0.23.0 docs/source/user_guide/feature_guide/Fine_grained_TP.md, o_proj row: +1.5 ms TPOT on A2
#: decode DP32 at batch 24; ``ascend_runtime.perf.fit.fitted_collective_latency_s``). The fit depends on
#: the calibration, which depends on alpha: this constant is that fixed point, and
#: tests/perf/test_modules_and_fit.py checks that refitting reproduces it.
COLLECTIVE_LATENCY_S = 48.4e-6
#: Mean context of the "2K in + 2K out" decode reference (input + half the output).
REFERENCE_DECODE_CONTEXT = 2048 + 1024


@dataclass(frozen=True)
class Reference:
    """One published figure the model is calibrated to."""

    hardware: str
    role: str
    step_s: float
    tokens_per_s_per_npu: float
    npus: int
    dp: int
    tp: int
    seqs_per_rank: int  # decode: sequences per DP rank; prefill: requests per DP rank
    prompt_tokens: int
    redundant_experts: int
    #: max/mean rank load assumed for the published run: what the greedy EPLB placement
    #: (ascend_runtime.sim.experts.balanced_map) leaves on the simulator's default routing at this shape.
    imbalance: float
    note: str


REFERENCES: dict[tuple[str, str], Reference] = {
    ("atlas-800i-a2", "decode"): Reference(
        "atlas-800i-a2", "decode", 0.0996, 723.0, 32, 32, 1, 72, 2048, 0, 1.15,
        "A2 decode, 32 NPUs DP32 TP1 EP32, 2K in + 2K out, 72 seqs/NPU",
    ),
    ("atlas-800i-a2", "prefill"): Reference(
        "atlas-800i-a2", "prefill", 0.631, 1622.0, 16, 2, 8, 4, 2048, 16, 1.05,
        "A2 prefill, 16 NPUs DP2 TP8 EP16, 8 x 2K = 16K tokens per batch",
    ),
    ("cm384", "decode"): Reference(
        "cm384", "decode", 0.050, 1920.0, 64, 64, 1, 96, 2048, 64, 1.12,
        "CM384 decode, 64 dies DP64 TP1 EP64, 96 seqs/die (1920 tok/s x 50 ms), 2K in + 2K out",
    ),
}
#: The published MTP figure: A2 decode at the same shape with one deepseek_mtp layer at 90% acceptance gives
#: 808 tokens/s per NPU. Each step verifies 2 tokens per sequence and emits 1 + 0.9 on average, so the
#: step it implies is 72 x 1.9 / 808 = 169.3 ms.
MTP_ACCEPTANCE = 0.9
MTP_REFERENCE = Reference(
    "atlas-800i-a2", "decode", 72 * (1 + MTP_ACCEPTANCE) / 808.0, 808.0, 32, 32, 1, 72, 2048, 0, 1.15,
    "A2 decode + MTP (1 layer, 90% acceptance), 32 NPUs DP32 TP1 EP32, 2K in + 2K out, 72 seqs/NPU",
)
#: Roles without a published figure borrow another's calibration constant.
BORROWED = {("cm384", "prefill"): ("atlas-800i-a2", "prefill")}


@dataclass
class RankBatch:
    """Work of one DP rank in one step.

    decode_tokens: tokens computed for sequences in decode (1 per seq, 2 with MTP);
    decode_context: sum of those sequences' context lengths (tokens);
    prefill_chunks: (new tokens, tokens already computed) per prefilling sequence.
    """

    decode_tokens: int = 0
    decode_context: int = 0
    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens this rank pushes through the model this step."""
        return self.decode_tokens + sum(n for n, _ in self.prefill_chunks)


@dataclass(frozen=True)
class StepTime:
    """Modelled step time (seconds, before speedup) and its parts (seconds, before calibration)."""

    total: float
    dense: float
    experts: float
    all2all: float
    imbalance: float  # sum_l max_r load / sum_l mean_r load (1 = perfect)
    load_mean: float = 0.0  # sum_l mean_r load
    load_max: float = 0.0  # sum_l max_r load


class TimingModel:
    """Step-time model of one instance shape; ``step(batches, rank_load, active_slots)``."""

    def __init__(self, cfg: SimConfig, scale: float | None = None, hw: HardwareProfile | None = None,
                 collective_latency_s: float = COLLECTIVE_LATENCY_S) -> None:
        """``hw`` overrides the hardware profile (default: the catalogue's, ``cfg.profile``);
        ``collective_latency_s`` is alpha (s per collective call)."""
        cfg = cfg if cfg.ep else cfg.resolved()
        self.cfg = cfg
        self.shape: ModelShape = cfg.model_shape()
        self.hw: HardwareProfile = cfg.profile if hw is None else hw
        m, hw = self.shape, self.hw
        self.tp, self.ep = int(cfg.tp), int(cfg.ep)  # type: ignore[arg-type]
        self.moe_layers = m.num_moe_layers + (m.num_mtp_layers if cfg.mtp else 0)
        bpp = m.weight_bytes_per_param
        ne_params = m.non_expert_linear_params(with_mtp=cfg.mtp)
        self.t_weights = (ne_params * bpp + m.embedding_params * 2) / self.tp / hw.hbm_bandwidth
        self.c_linear = 2.0 * ne_params / self.tp / hw.flops  # s per token
        self.layers = m.num_layers + (m.num_mtp_layers if cfg.mtp else 0)
        self.kv_bytes = m.kv_bytes_per_token(with_mtp=cfg.mtp)
        lat = m.kv_lora_rank + m.qk_rope_head_dim
        self.c_attn_dec_mem = self.kv_bytes / hw.hbm_bandwidth  # s per context token
        self.c_attn_dec_flop = 2.0 * self.layers * m.num_attention_heads * (lat + m.kv_lora_rank) / self.tp / hw.flops
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        self.c_attn_pre = 2.0 * self.layers * m.num_attention_heads * (qk + m.v_head_dim) / self.tp / hw.flops
        self.c_slot = m.params_per_expert * bpp / hw.hbm_bandwidth  # s per active slot
        self.c_expert_tok = 2.0 * m.params_per_expert / hw.flops  # s per token-expert assignment
        npn = hw.npus_per_node
        if self.ep <= 1:
            per_byte = 0.0
        else:
            local = min(npn, self.ep) - 1
            remote = self.ep - 1 - local
            per_byte = (local / hw.intra_node_bandwidth + remote / hw.inter_node_bandwidth) / (self.ep - 1)
        self.c_a2a = m.hidden_size * 3.0 * per_byte  # s per token-expert assignment crossing the EP group
        self.alpha = collective_latency_s
        #: s per step of the MoE calls' fixed latency: a dispatch and a combine per MoE layer
        self.t_moe_calls = 2.0 * self.moe_layers * collective_latency_s if self.ep > 1 else 0.0
        self.scale = scale if scale is not None else calibration_scale(cfg.hardware, cfg.role, cfg.mtp)

    def dense_time(self, b: RankBatch) -> float:
        """Non-MoE time of one DP rank's batch (uncalibrated seconds)."""
        t = b.tokens
        if t == 0:
            return 0.0
        attn = max(b.decode_context * self.c_attn_dec_mem, b.decode_context * self.c_attn_dec_flop)
        attn += sum(n * (c + n / 2.0) for n, c in b.prefill_chunks) * self.c_attn_pre
        return self.t_weights + t * self.c_linear + attn

    def step(self, batches: list[RankBatch], rank_load: np.ndarray, active_slots: np.ndarray) -> StepTime:
        """Modelled step time; ``rank_load``/``active_slots`` are (L, R) for the step's routing.

        With MTP the MTP layer's MoE cost is taken as the mean MoE layer.
        """
        dec_tokens = np.array([b.decode_tokens for b in batches], dtype=np.float64)
        dec_ctx = np.array([b.decode_context for b in batches], dtype=np.float64)
        pre_tokens = np.array([sum(n for n, _ in b.prefill_chunks) for b in batches], dtype=np.float64)
        pre_attn = np.array([sum(n * (c + n / 2.0) for n, c in b.prefill_chunks) for b in batches], dtype=np.float64)
        return self.step_ranks(dec_tokens, dec_ctx, pre_tokens, pre_attn, rank_load, active_slots)

    def step_ranks(self, decode_tokens: np.ndarray, decode_context: np.ndarray, prefill_tokens: np.ndarray,
                   prefill_attn: np.ndarray, rank_load: np.ndarray, active_slots: np.ndarray) -> StepTime:
        """``step`` on per-DP-rank arrays (the engine's vectorised path).

        ``prefill_attn[r]`` is the sum over rank r's prefill chunks of ``n * (c + n / 2)``.
        """
        tokens_r = decode_tokens + prefill_tokens
        tokens = float(tokens_r.sum()) if tokens_r.size else 0.0
        if tokens == 0:
            return StepTime(0.0, 0.0, 0.0, 0.0, 1.0)
        attn = np.maximum(decode_context * self.c_attn_dec_mem, decode_context * self.c_attn_dec_flop)
        attn = attn + prefill_attn * self.c_attn_pre
        dense_r = np.where(tokens_r > 0, self.t_weights + tokens_r * self.c_linear + attn, 0.0)
        dense = float(dense_r.max())
        per_layer = active_slots * self.c_slot + rank_load * self.c_expert_tok  # (L, R)
        experts = float(per_layer.max(axis=1).sum())
        send = float(tokens_r.max()) / self.tp * self.shape.experts_per_token
        load_max = rank_load.max(axis=1)
        recv = np.maximum(load_max, send)
        a2a = float(recv.sum()) * self.c_a2a
        L = rank_load.shape[0]
        if self.moe_layers > L:
            experts *= self.moe_layers / L
            a2a *= self.moe_layers / L
        a2a += self.t_moe_calls
        mean = float(rank_load.sum()) / rank_load.shape[1]
        mx = float(load_max.sum())
        imbalance = mx / mean if mean > 0 else 1.0
        total = self.scale * (STEP_OVERHEAD_S + dense + experts + a2a)
        return StepTime(total, dense, experts, a2a, imbalance, mean, mx)

    def reference_step(self, ref: Reference, imbalance: float | None = None) -> StepTime:
        """Step time of ``ref``'s batch on this shape with uniform routing times ``imbalance`` on the max rank."""
        imbalance = ref.imbalance if imbalance is None else imbalance
        if ref.role == "decode":
            per_seq = 2 if self.cfg.mtp else 1  # MTP verifies the draft: 2 tokens per sequence
            b = RankBatch(ref.seqs_per_rank * per_seq, ref.seqs_per_rank * REFERENCE_DECODE_CONTEXT)
        else:
            b = RankBatch(prefill_chunks=[(ref.prompt_tokens, 0)] * ref.seqs_per_rank)
        dp = int(self.cfg.dp)  # type: ignore[arg-type]
        tokens = b.tokens * dp
        S = self.cfg.slots_per_rank
        mean = tokens * self.shape.experts_per_token / self.ep
        L = self.shape.num_moe_layers
        load = np.full((L, self.ep), mean)
        load[:, 0] = mean * imbalance
        active = np.full((L, self.ep), min(S, max(1, int(mean))))
        return self.step([b] * dp, load, active)


def reference_config(hardware: str, role: str, mtp: bool = False) -> SimConfig:
    """The SimConfig of the published reference shape for (hardware, role)."""
    ref = REFERENCES[BORROWED.get((hardware, role), (hardware, role))]
    d = ROLE_DEFAULTS[(hardware, role)]
    npus, dp, tp = (ref.npus, ref.dp, ref.tp) if ref.hardware == hardware else (d.npus, d.dp, d.tp)
    return SimConfig(
        role=role,  # type: ignore[arg-type]
        instance="reference",
        hardware=hardware,  # type: ignore[arg-type]
        npus=npus,
        dp=dp,
        tp=tp,
        mtp=mtp,
        max_num_seqs=ref.seqs_per_rank if role == "decode" else None,
        redundant_experts=ref.redundant_experts,
    ).resolved()


@functools.cache
def calibration_scale(hardware: str, role: str, mtp: bool = False) -> float:
    """k[hw, role]: published step / uncalibrated model step of the reference.

    Decode with MTP multiplies it by ``mtp_factor()`` (calibrated on the published A2 MTP figure); prefill
    with MTP reuses the non-MTP k.
    """
    src = BORROWED.get((hardware, role), (hardware, role))
    ref = REFERENCES[src]
    raw = TimingModel(reference_config(*src), scale=1.0).reference_step(ref)
    k = ref.step_s / raw.total
    if mtp and role == "decode":
        k *= mtp_factor()
    return k


@functools.cache
def mtp_factor() -> float:
    """k_mtp / k for decode: solved so the A2 decode reference with MTP (2 tokens verified per sequence, 62
    layers, 59 MoE layers) takes the step implied by 808 tokens/s per NPU at 90% acceptance."""
    ref = MTP_REFERENCE
    raw = TimingModel(reference_config(ref.hardware, ref.role, mtp=True), scale=1.0).reference_step(ref)
    return ref.step_s / raw.total / calibration_scale(ref.hardware, ref.role)


def describe_hardware() -> dict[str, HardwareProfile]:
    """The hardware profiles (for docs and reports)."""
    return dict(HARDWARE)
