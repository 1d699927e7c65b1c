"""SSE decoding and the vLLM bench metric definitions on hand-made records."""

from __future__ import annotations

import pytest

from ascend_runtime.checks.metrics import SLO, RequestResult, ThroughputResult
from ascend_runtime.checks.sse import DONE, SSEDecoder, chunk_text


def test_decoder_handles_split_reads_crlf_comments_and_flush() -> None:
    dec = SSEDecoder()
    stream = b': keepalive\r\ndata: {"a": 1}\r\n\r\nevent: x\ndata: {"b"' + b": 2}\n\ndata: [DONE]"
    out: list[bytes] = []
    for i in range(0, len(stream), 5):
        out += dec.feed(stream[i : i + 5])
    out += dec.flush()
    assert out == [b'{"a": 1}', b'{"b": 2}', DONE]


def test_chunk_text_distinguishes_content_from_role_and_finish_chunks() -> None:
    assert chunk_text({"choices": [{"text": " hi"}]}) == " hi"
    assert chunk_text({"choices": [{"delta": {"role": "assistant", "content": ""}}]}) == ""
    assert chunk_text({"choices": [{"delta": {"reasoning_content": "r"}}]}) == "r"
    assert chunk_text({"choices": [], "usage": {"completion_tokens": 3}}) is None


def _req(ttft: float, latency: float, out: int, itl: list[float], prompt: int = 10) -> RequestResult:
    return RequestResult(success=True, ttft=ttft, latency=latency, itl=itl, prompt_tokens=prompt, output_tokens=out, usage_reported=True)


def test_metrics_follow_vllm_definitions() -> None:
    reqs = [
        _req(0.1, 0.1 + 4 * 0.02, 5, [0.02] * 4),
        _req(0.3, 0.3 + 4 * 0.04, 5, [0.04] * 4),
        _req(0.2, 0.2, 1, []),  # one token: no TPOT sample, TPOT 0 for SLOs
        RequestResult(success=False, error="HTTP 503: x"),
    ]
    res = ThroughputResult(requests=reqs, duration=2.0, slo=SLO(ttft_ms=250, tpot_ms=30), npus=4)
    d = res.to_dict()
    assert d["completed"] == 3 and d["failed"] == 1
    assert d["total_input_tokens"] == 30 and d["total_output_tokens"] == 11
    assert d["output_throughput"] == pytest.approx(5.5)
    assert d["total_token_throughput"] == pytest.approx(20.5)
    assert d["request_throughput"] == pytest.approx(1.5)
    assert d["per_npu_output_throughput"] == pytest.approx(5.5 / 4)
    assert d["mean_ttft_ms"] == pytest.approx(200.0)
    assert d["median_ttft_ms"] == pytest.approx(200.0)
    assert d["mean_tpot_ms"] == pytest.approx(30.0)  # over the two multi-token requests
    assert d["mean_itl_ms"] == pytest.approx(30.0)  # pooled 8 gaps
    assert d["p99_itl_ms"] == pytest.approx(40.0)
    assert d["mean_e2el_ms"] == pytest.approx((180 + 460 + 200) / 3)
    # good: req0 (ttft 100, tpot 20) and req2 (ttft 200, tpot 0); req1 ttft 300 > 250
    assert d["request_goodput"] == pytest.approx(1.0)
    assert d["errors"] == ["HTTP 503: x (x1)"]


def test_goodput_is_none_without_slo_and_e2el_slo_counts() -> None:
    reqs = [_req(0.1, 0.5, 5, [0.1] * 4), _req(0.1, 1.5, 5, [0.35] * 4)]
    assert ThroughputResult(reqs, 1.0).to_dict()["request_goodput"] is None
    assert ThroughputResult(reqs, 1.0, slo=SLO(e2el_ms=1000)).to_dict()["request_goodput"] == pytest.approx(1.0)


def test_result_json_has_vllm_key_names() -> None:
    d = ThroughputResult([_req(0.1, 0.2, 3, [0.05, 0.05])], 1.0, percentiles=(50.0, 99.0)).to_dict()
    vllm_keys = {
        "duration", "completed", "total_input_tokens", "total_output_tokens", "request_throughput",
        "request_goodput", "output_throughput", "total_token_throughput", "max_concurrent_requests",
    }
    for m in ("ttft", "tpot", "itl", "e2el"):
        vllm_keys |= {f"mean_{m}_ms", f"median_{m}_ms", f"std_{m}_ms", f"p99_{m}_ms", f"p50_{m}_ms"}
    assert vllm_keys <= d.keys()
    assert {"failed", "errors"} <= d.keys()
