"""Closed-form performance model of one PD stage, on the calibrated timing model the simulator steps on.

Every figure here is the step-time model (:mod:`ascend_runtime.perf.timing`,
docs/simulator.md "Timing model") evaluated on a uniform batch: the same
``TimingModel`` terms and the same calibration constant ``k[hw, role]``
(``calibration_scale``, ``mtp_factor``), so there is one copy of the numbers.
Routing is uniform with the max EP rank carrying ``imbalance`` x the mean load
(default: the reference's ``Reference.imbalance``, what a good EPLB placement leaves).

Units: seconds, tokens, bytes, bytes/s; "per NPU" divides by the stage's dp x tp NPUs.

    prefill_step_s(P, n)     = k_p * (1 ms + dense(n prompts of P) + experts + all2all)  one step, n per DP rank
    prefill_tokens_per_s_npu = dp * n * P / prefill_step_s / npus
    decode_step_s(b, c)      = k_d * (1 ms + dense(b seqs, context c) + experts + all2all)  b per DP rank
                               (2 tokens per sequence with MTP, k_d * f_mtp)
    decode_tpot_s            = decode_step_s / (1 + a)          a = MTP acceptance (0 without MTP)
    decode_tokens_per_s_npu  = dp * b * (1 + a) / decode_step_s / npus
    kv_bytes_per_token       = layers * (kv_lora_rank + qk_rope_head_dim) * dtype bytes  (61 x 576 x 2 = 70,272 B)
    kv_transfer_s(P)         = P * kv_bytes_per_token / link bytes/s   (link: the hardware's PD link rate)

Per-module degrees (``StageShape.modules``, :mod:`ascend_runtime.planner.modules`) and two-micro-batch
overlap (``StageShape.micro_batching``) enter each step as (raw = uncalibrated seconds, k as above):

    step        = k * (1 ms + C + M)                       C = dense + experts + dW / HBM_bw,  M = all2all + sum_coll
    step (mb)   = k * (1 ms + max(C + W / HBM_bw, M + 2 L_moe alpha))   both micro-batches read the weights,
                                                           the second adds its dispatch + combine calls
    all2all     = the timing model's: bytes over the links + 2 L_moe alpha (one dispatch, one combine per MoE layer)
    dW          = weight bytes read per step with the module degrees - without them (o_proj, dense FFN,
                  LM head, shared expert; the embedding is a lookup, not read whole)
    sum_coll    = sum over the modules' collectives of count * (alpha + t_bytes)
    t_bytes     = max(per-peer bytes / intra-node link, remote peers x per-peer bytes / inter-node link)
    alpha       = collective_latency_s() = perf.timing.COLLECTIVE_LATENCY_S (fixed point of the fit on the
                  release's measured o_proj row, perf/fit.py)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ascend_runtime.config.model import ModelShape
from ascend_runtime.perf.capacity import kv_capacity_tokens
from ascend_runtime.perf.profiles import HARDWARE, ROLE_DEFAULTS
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.planner.modules import ModuleDegrees, module_collectives, module_weight_bytes, weight_delta_bytes
from ascend_runtime.perf.timing import (
    BORROWED,
    COLLECTIVE_LATENCY_S,
    REFERENCE_DECODE_CONTEXT,
    REFERENCES,
    STEP_OVERHEAD_S,
    TimingModel,
)

#: Mean decode context of the published "2K in + 2K out" points (tokens).
REFERENCE_CONTEXT = REFERENCE_DECODE_CONTEXT
#: Bits per byte (link rates are given in Gbit/s).
BITS_PER_BYTE = 8


@dataclass(frozen=True)
class StageShape:
    """Shape of one engine instance of a stage.

    ``max_num_seqs`` / ``max_num_batched_tokens`` are per DP rank (as vLLM); ``link_gbps``
    is the instance's PD KV link in Gbit/s (None: the hardware's default).
    """

    hardware: str
    role: str
    dp: int
    tp: int
    redundant_experts: int = 0
    mtp: bool = False
    nodes: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    link_gbps: float | None = None
    model: str = "deepseek-ai/DeepSeek-R1"
    #: per-module degrees inside dp x tp (default: none deviates)
    modules: ModuleDegrees = ModuleDegrees()
    #: two micro-batches overlap compute with communication (vLLM --enable-dbo)
    micro_batching: bool = False

    @property
    def npus(self) -> int:
        """NPUs of one instance (dp x tp)."""
        return self.dp * self.tp

    @property
    def ep(self) -> int:
        """Expert-parallel size (expert parallelism spans every NPU of the instance)."""
        return self.npus

    def sim_config(self) -> SimConfig:
        """The resolved simulator configuration of this shape (raises ValueError if invalid)."""
        return SimConfig(
            role=self.role, instance="perf-model", hardware=self.hardware, npus=self.npus, dp=self.dp, tp=self.tp,
            ep=self.ep, nodes=self.nodes, redundant_experts=self.redundant_experts, mtp=self.mtp,
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            link_gbps=self.link_gbps, model=self.model,
        ).resolved()  # type: ignore[arg-type]


def reference_shape(hardware: str, role: str, mtp: bool = False) -> StageShape:
    """The published reference shape of (hardware, role) (docs/simulator.md calibration table)."""
    ref = REFERENCES[BORROWED.get((hardware, role), (hardware, role))]
    d = ROLE_DEFAULTS[(hardware, role)]
    dp, tp = (ref.dp, ref.tp) if ref.hardware == hardware else (d.dp, d.tp)
    return StageShape(hardware, role, dp, tp, ref.redundant_experts, mtp,
                      max_num_seqs=ref.seqs_per_rank if role == "decode" else None)


@functools.lru_cache(maxsize=256)
def _timing(shape: StageShape) -> TimingModel:
    return TimingModel(shape.sim_config())


def default_imbalance(shape: StageShape) -> float:
    """max/mean EP rank load assumed: the calibration reference's for this hardware and role."""
    return REFERENCES[BORROWED.get((shape.hardware, shape.role), (shape.hardware, shape.role))].imbalance


def collective_latency_s() -> float:
    """alpha: seconds per collective call beyond its bytes (``perf.timing.COLLECTIVE_LATENCY_S``, the fixed
    point of the fit on the release's o_proj row in :mod:`ascend_runtime.perf.fit`)."""
    return COLLECTIVE_LATENCY_S


def _group_seconds_per_peer_byte(tm: TimingModel, tp: int, n: int) -> tuple[float, int, int]:
    """(s per byte on one intra-node link, local peers, remote peers) of a module group of n DP ranks x tp."""
    npn = tm.hw.npus_per_node
    local = max(0, min(n, max(1, npn // max(tp, 1))) - 1)
    return 1.0 / tm.hw.intra_node_bandwidth, local, n - 1 - local


def collective_seconds(tm: TimingModel, tp: int, bytes_sent: float, n: int, alpha: float) -> float:
    """Raw seconds of one collective: alpha + max(per-peer bytes over a local link, remote bytes over the NIC)."""
    if n <= 1:
        return 0.0
    per_peer = bytes_sent / (n - 1)
    s_intra, local, remote = _group_seconds_per_peer_byte(tm, tp, n)
    t = max(per_peer * s_intra if local else 0.0, per_peer * remote / tm.hw.inter_node_bandwidth)
    return alpha + t


def module_terms(shape: StageShape, tm: TimingModel, tokens: float, sampled: float,
                 alpha: float | None = None) -> tuple[float, float]:
    """(weight-read change, collectives) in raw seconds per step of one DP rank for ``shape.modules``
    (``alpha``: s per collective call; default the timing model's own, ``tm.alpha``)."""
    d = shape.modules
    if d.uniform:
        return 0.0, 0.0
    m = tm.shape
    alpha = tm.alpha if alpha is None else alpha
    read = ("o_proj", "dense_ffn", "lm_head", "shared_experts")
    new = module_weight_bytes(m, shape.tp, d, shape.mtp)
    old = module_weight_bytes(m, shape.tp, ModuleDegrees(), shape.mtp)
    d_read = sum(new[k] - old[k] for k in read) / tm.hw.hbm_bandwidth
    coll = sum(c.count * collective_seconds(tm, shape.tp, c.bytes_sent, c.group, alpha)
               for c in module_collectives(m, shape.tp, d, tokens, sampled, shape.mtp))
    return d_read, coll


def step_on(tm: TimingModel, shape: StageShape, decode_tokens: float, decode_context: float, prefill_tokens: float,
            prefill_attn: float, imbalance: float | None, sampled: float | None = None,
            alpha: float | None = None) -> float:
    """Step (s) of ``shape`` on a given TimingModel (its ``scale`` is k): uniform batch, modules, micro-batching.

    ``sampled``: tokens reaching the LM head per DP rank (default: the decode tokens, else 1).
    """
    imb = default_imbalance(shape) if imbalance is None else imbalance
    dp, ep = shape.dp, shape.ep
    per_rank = decode_tokens + prefill_tokens
    mean = per_rank * dp * tm.shape.experts_per_token / ep
    L = tm.shape.num_moe_layers
    load = np.full((L, ep), mean)
    load[:, 0] = mean * imb
    active = np.full((L, ep), min(tm.cfg.slots_per_rank, max(1, int(mean))))
    ranks = np.ones(dp)
    st = tm.step_ranks(ranks * decode_tokens, ranks * decode_context, ranks * prefill_tokens, ranks * prefill_attn,
                       load, active)
    if shape.modules.uniform and not shape.micro_batching:
        return st.total
    if st.total == 0:
        return 0.0
    sampled = (decode_tokens if decode_tokens else 1.0) if sampled is None else sampled
    d_read, coll = module_terms(shape, tm, per_rank, sampled, alpha)
    compute = st.dense + st.experts + d_read
    comm = st.all2all + coll
    if shape.micro_batching:
        a = tm.alpha if alpha is None else alpha
        raw = STEP_OVERHEAD_S + max(compute + tm.t_weights + d_read, comm + 2 * tm.moe_layers * a)
    else:
        raw = STEP_OVERHEAD_S + compute + comm
    return tm.scale * raw


def _uniform_step(shape: StageShape, decode_tokens: float, decode_context: float, prefill_tokens: float,
                  prefill_attn: float, imbalance: float | None, sampled: float | None = None) -> float:
    """Calibrated step (s) with every DP rank carrying the same batch and uniform routing (max rank x imbalance)."""
    return step_on(_timing(shape), shape, decode_tokens, decode_context, prefill_tokens, prefill_attn, imbalance,
                   sampled)


def prefill_step_s(shape: StageShape, prompt_tokens: int, batch_per_rank: int, imbalance: float | None = None) -> float:
    """Seconds to prefill ``batch_per_rank`` prompts of ``prompt_tokens`` on every DP rank.

    One step when ``batch_per_rank x prompt_tokens <= max_num_batched_tokens`` (per rank);
    a single longer prompt is chunked as the engine does (chunk i attends to i x chunk earlier tokens).
    """
    if prompt_tokens < 1 or batch_per_rank < 1:
        raise ValueError("prompt_tokens and batch_per_rank must be >= 1")
    budget = int(_timing(shape).cfg.max_num_batched_tokens)
    if batch_per_rank * prompt_tokens <= budget:
        n, P = batch_per_rank, prompt_tokens
        return _uniform_step(shape, 0, 0, n * P, n * P * (P / 2.0), imbalance, sampled=n)
    if batch_per_rank != 1:
        raise ValueError(f"{batch_per_rank} x {prompt_tokens} tokens exceed max_num_batched_tokens {budget} per rank")
    total, done = 0.0, 0
    while done < prompt_tokens:
        n = min(budget, prompt_tokens - done)
        total += _uniform_step(shape, 0, 0, n, n * (done + n / 2.0), imbalance)
        done += n
    return total


def prefill_tokens_per_s_per_npu(shape: StageShape, prompt_tokens: int, batch_per_rank: int,
                                 imbalance: float | None = None) -> float:
    """Prompt tokens/s per NPU of back-to-back prefill batches."""
    t = prefill_step_s(shape, prompt_tokens, batch_per_rank, imbalance)
    return shape.dp * batch_per_rank * prompt_tokens / t / shape.npus


def max_prefill_batch(shape: StageShape, prompt_tokens: int) -> int:
    """Prompts per DP rank that fit one step's ``max_num_batched_tokens`` (at least 1, chunked)."""
    budget = int(_timing(shape).cfg.max_num_batched_tokens)
    return max(1, min(budget // max(1, prompt_tokens), int(_timing(shape).cfg.max_num_seqs)))


def mtp_acceptance_or_zero(shape: StageShape, acceptance: float | None) -> float:
    """Accepted draft tokens per sequence-step: 0 without MTP, else ``acceptance`` (default 0.9)."""
    if not shape.mtp:
        return 0.0
    return 0.9 if acceptance is None else float(acceptance)


def decode_step_s(shape: StageShape, batch_per_rank: int, context_tokens: float, imbalance: float | None = None) -> float:
    """Seconds of one decode step with ``batch_per_rank`` sequences per DP rank of mean context ``context_tokens``."""
    if batch_per_rank < 1:
        raise ValueError("batch_per_rank must be >= 1")
    per_seq = 2 if shape.mtp else 1
    return _uniform_step(shape, batch_per_rank * per_seq, batch_per_rank * float(context_tokens), 0, 0, imbalance)


def decode_tpot_s(shape: StageShape, batch_per_rank: int, context_tokens: float, acceptance: float | None = None,
                  imbalance: float | None = None) -> float:
    """Mean seconds per output token a sequence sees: step / (1 + MTP acceptance)."""
    a = mtp_acceptance_or_zero(shape, acceptance)
    return decode_step_s(shape, batch_per_rank, context_tokens, imbalance) / (1.0 + a)


def decode_tokens_per_s_per_npu(shape: StageShape, batch_per_rank: int, context_tokens: float,
                                acceptance: float | None = None, imbalance: float | None = None) -> float:
    """Output tokens/s per NPU at a steady batch."""
    tpot = decode_tpot_s(shape, batch_per_rank, context_tokens, acceptance, imbalance)
    return shape.dp * batch_per_rank / tpot / shape.npus


def kv_capacity_seqs(shape: StageShape, context_tokens: float) -> int:
    """Sequences of ``context_tokens`` one DP rank's KV cache holds (0 if the weights do not fit)."""
    try:
        tokens = kv_capacity_tokens(_timing(shape).cfg)
    except ValueError:
        return 0
    m = _timing(shape).shape  # module degrees move weight bytes in or out of the KV budget
    tokens -= weight_delta_bytes(m, shape.tp, shape.modules, shape.mtp) / m.kv_bytes_per_token(with_mtp=shape.mtp)
    if tokens <= 0:
        return 0
    return int(tokens // max(1.0, context_tokens))


def max_decode_batch(shape: StageShape, context_tokens: float, tpot_slo_s: float, acceptance: float | None = None,
                     imbalance: float | None = None) -> int:
    """Largest batch per DP rank with TPOT <= ``tpot_slo_s``, within max_num_seqs and KV capacity (0: none)."""
    hi = min(int(_timing(shape).cfg.max_num_seqs), kv_capacity_seqs(shape, context_tokens))
    if hi < 1 or decode_tpot_s(shape, 1, context_tokens, acceptance, imbalance) > tpot_slo_s:
        return 0
    lo = 1  # TPOT grows with the batch: bisect the last batch within the SLO
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decode_tpot_s(shape, mid, context_tokens, acceptance, imbalance) <= tpot_slo_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def kv_bytes_per_token(model: ModelShape | None = None, mtp: bool = False) -> int:
    """KV bytes per token moved from prefill to decode: layers x (512 latent + 64 rope) x dtype bytes."""
    m = model or ModelShape()
    return m.kv_bytes_per_token(with_mtp=mtp)


def link_bytes_per_s(hardware: str, link_gbps: float | None = None) -> float:
    """PD KV link rate of one prefill instance in bytes/s (default: the hardware profile's)."""
    gbps = link_gbps if link_gbps is not None else HARDWARE[hardware].default_link_gbps
    return gbps * 1e9 / BITS_PER_BYTE


def kv_transfer_s(shape: StageShape, prompt_tokens: int) -> float:
    """Seconds to move one prompt's KV cache over the prefill instance's link (no contention)."""
    m = _timing(shape).shape
    return prompt_tokens * kv_bytes_per_token(m, shape.mtp) / link_bytes_per_s(shape.hardware, shape.link_gbps)


def ceil_div(a: float, b: float) -> int:
    """ceil(a / b) for positive b, robust to float noise (1e-9 relative)."""
    return math.ceil(a / b - 1e-9)
