"""The performance model reproduces the published operating points the simulator is calibrated to."""

from __future__ import annotations

import pytest

from ascend_runtime.perf import model as pm
from ascend_runtime.perf.timing import (
    MTP_REFERENCE,
    REFERENCES,
    TimingModel,
    reference_config,
)

A2, CM = "atlas-800i-a2", "cm384"
CTX = 2048 + 1024  # mean context of 2K in + 2K out


def test_a2_decode_72_seqs_is_99_6_ms_and_723_tokens_per_npu() -> None:
    s = pm.reference_shape(A2, "decode")
    assert pm.decode_step_s(s, 72, CTX) == pytest.approx(0.0996, rel=0.01)
    assert pm.decode_tokens_per_s_per_npu(s, 72, CTX) == pytest.approx(723, rel=0.01)


def test_a2_decode_with_mtp_at_90_percent_is_808_tokens_per_npu() -> None:
    s = pm.reference_shape(A2, "decode", mtp=True)
    assert pm.decode_tokens_per_s_per_npu(s, 72, CTX, acceptance=0.9) == pytest.approx(808, rel=0.01)
    assert pm.decode_tpot_s(s, 72, CTX, 0.9) == pytest.approx(MTP_REFERENCE.step_s / 1.9, rel=0.01)
    # a lower acceptance gives fewer tokens from the same step
    assert pm.decode_tokens_per_s_per_npu(s, 72, CTX, acceptance=0.5) < 808 * 1.5 / 1.9 * 1.01


def test_a2_prefill_8_by_2k_is_631_ms_and_1622_tokens_per_npu() -> None:
    s = pm.reference_shape(A2, "prefill")  # DP2 x TP8: 4 prompts per DP rank = 8 per batch
    assert pm.prefill_step_s(s, 2048, 4) == pytest.approx(0.631, rel=0.01)
    assert pm.prefill_tokens_per_s_per_npu(s, 2048, 4) == pytest.approx(1622, rel=0.01)


def test_cm384_decode_is_1920_tokens_per_npu_at_50_ms_tpot() -> None:
    s = pm.reference_shape(CM, "decode")
    b = pm.max_decode_batch(s, CTX, 0.050)
    assert b == 96
    assert pm.decode_tokens_per_s_per_npu(s, b, CTX) == pytest.approx(1920, rel=0.01)
    # the paper's 1943 tok/s/NPU at TPOT < 50 ms is within 5% as well
    assert pm.decode_tokens_per_s_per_npu(s, b, CTX) == pytest.approx(1943, rel=0.05)


def test_matches_the_simulator_reference_step_exactly() -> None:
    for (hw, role), ref in REFERENCES.items():
        raw = TimingModel(reference_config(hw, role)).reference_step(ref).total
        s = pm.reference_shape(hw, role)
        got = (pm.decode_step_s(s, ref.seqs_per_rank, CTX) if role == "decode"
               else pm.prefill_step_s(s, ref.prompt_tokens, ref.seqs_per_rank))
        assert got == pytest.approx(raw, rel=1e-9), (hw, role)


def test_decode_step_grows_with_batch_and_context() -> None:
    s = pm.reference_shape(A2, "decode")
    assert pm.decode_step_s(s, 16, CTX) < pm.decode_step_s(s, 72, CTX)
    assert pm.decode_step_s(s, 72, 1024) < pm.decode_step_s(s, 72, 8192)


def test_prefill_throughput_rises_with_batch_and_long_prompts_are_chunked() -> None:
    s = pm.reference_shape(A2, "prefill")
    assert pm.prefill_tokens_per_s_per_npu(s, 2048, 1) < pm.prefill_tokens_per_s_per_npu(s, 2048, 4)
    assert pm.max_prefill_batch(s, 2048) == 4
    one_chunk = pm.prefill_step_s(s, 8192, 1)
    chunked = pm.prefill_step_s(s, 16384, 1)  # two 8192-token steps, the second attending to the first
    assert chunked > 2 * one_chunk
    with pytest.raises(ValueError):
        pm.prefill_step_s(s, 4096, 4)


def test_kv_bytes_and_transfer_time_from_model_shape_and_link() -> None:
    assert pm.kv_bytes_per_token() == 61 * 576 * 2
    s = pm.reference_shape(A2, "prefill")
    # 2048 tokens x 70,272 B over the A2 node link (400 Gbit/s = 50 GB/s)
    assert pm.kv_transfer_s(s, 2048) == pytest.approx(2048 * 70272 / 50e9, rel=1e-9)
    faster = pm.StageShape(A2, "prefill", 2, 8, 16, link_gbps=800.0)
    assert pm.kv_transfer_s(faster, 2048) == pytest.approx(pm.kv_transfer_s(s, 2048) / 2)


def test_tpot_slo_below_the_step_floor_gives_no_batch() -> None:
    s = pm.reference_shape(CM, "decode")
    assert pm.max_decode_batch(s, CTX, 0.005) == 0


def test_every_moe_layer_pays_two_collective_calls_and_single_npu_ep_pays_none() -> None:
    import numpy as np

    cfg = reference_config(A2, "decode")
    with_alpha = TimingModel(cfg, scale=1.0)
    without = TimingModel(cfg, scale=1.0, collective_latency_s=0.0)
    L = with_alpha.shape.num_moe_layers
    load = np.full((L, with_alpha.ep), 8.0)
    active = np.ones((L, with_alpha.ep))
    one = np.ones(cfg.dp)
    a = with_alpha.step_ranks(one, one * 3072, 0 * one, 0 * one, load, active)
    b = without.step_ranks(one, one * 3072, 0 * one, 0 * one, load, active)
    # dispatch + combine per MoE layer, whatever the batch: the fixed cost a small batch cannot avoid
    assert a.all2all - b.all2all == pytest.approx(2 * L * with_alpha.alpha, rel=1e-9)
    assert a.dense == b.dense and a.experts == b.experts
    # an instance without expert parallelism makes no dispatch/combine calls
    from ascend_runtime.perf.sim_config import SimConfig

    solo = SimConfig(role="decode", instance="solo", hardware=A2, npus=1, dp=1, tp=1, ep=1).resolved()
    assert TimingModel(solo, scale=1.0).t_moe_calls == 0.0
    assert with_alpha.t_moe_calls > 0.0
