"""`ascend-deploy check throughput`: exit codes, goodput threshold and result JSON."""

from __future__ import annotations

import json

import pytest

from ascend_runtime.cli import main

BASE = ["--input-len", "20", "--output-len", "4", "--num-prompts", "6", "--concurrency", "3", "--no-progress"]


def test_goodput_threshold_sets_the_exit_code(threaded_fake, tmp_path, capsys) -> None:
    threaded_fake.b.ttft_s, threaded_fake.b.itl_s = 0.03, 0.005
    ep = ["check", "throughput", "--endpoint", threaded_fake.url, *BASE]
    res = tmp_path / "r.json"
    assert main([*ep, "--slo-ttft-ms", "1000", "--min-goodput", "0.5", "--npus", "4", "--result-json", str(res)]) == 0
    d = json.loads(res.read_text())
    for key in ("completed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
                "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms",
                "median_e2el_ms", "p99_e2el_ms", "request_goodput", "duration", "per_npu_output_throughput",
                "failed", "errors", "model_id", "max_concurrency"):
        assert key in d, key
    assert d["completed"] == 6 and d["total_input_tokens"] == 120 and d["total_output_tokens"] == 24
    assert "throughput PASSED" in capsys.readouterr().out
    # a TTFT SLO of 10 ms no request meets: goodput 0 < 0.5 -> exit 1
    assert main([*ep, "--slo-ttft-ms", "10", "--min-goodput", "0.5"]) == 1
    assert "goodput 0.000 req/s < --min-goodput 0.5" in capsys.readouterr().out


def test_a_median_over_its_slo_fails_whatever_the_goodput_threshold(threaded_fake, capsys) -> None:
    threaded_fake.b.ttft_s, threaded_fake.b.itl_s = 0.03, 0.03  # TPOT about 30 ms for every request
    ep = ["check", "throughput", "--endpoint", threaded_fake.url, *BASE, "--slo-ttft-ms", "1000"]
    assert main([*ep, "--slo-tpot-ms", "10", "--min-goodput", "0"]) == 1
    out = capsys.readouterr().out
    assert "throughput FAILED" in out and "> --slo-tpot-ms 10" in out and "median TPOT" in out
    assert main([*ep, "--slo-tpot-ms", "10"]) == 0  # without --min-goodput the SLOs only count goodput (vLLM bench)


def test_failed_requests_fail_the_check(threaded_fake, capsys) -> None:
    threaded_fake.b.error_after = 1
    assert main(["check", "throughput", "--endpoint", threaded_fake.url, *BASE]) == 1
    out = capsys.readouterr().out
    assert "6 requests failed" in out and "stream error event: decode instance lost" in out


def test_unreachable_endpoint_is_a_failure(unused_tcp_port, capsys) -> None:
    assert main(["check", "throughput", "--endpoint", f"http://127.0.0.1:{unused_tcp_port}", *BASE, "--timeout-s", "2"]) == 1
    assert "throughput setup" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--min-goodput", "1"], "--min-goodput"),
        (["--slo-tpot-ms", "-1"], "--slo-tpot-ms"),
        (["--metric-percentiles", "abc"], "--metric-percentiles"),
    ],
)
def test_bad_input_is_exit_2_naming_the_option(extra, option, capsys) -> None:
    assert main(["check", "throughput", "--endpoint", "http://127.0.0.1:9", *BASE, *extra]) == 2
    assert option in capsys.readouterr().err


def test_bad_lengths_and_endpoint_are_exit_2(capsys) -> None:
    argv = ["check", "throughput", "--endpoint", "http://127.0.0.1:9", "--input-len", "0", "--output-len", "4",
            "--num-prompts", "2", "--concurrency", "1"]
    assert main(argv) == 2 and "--input-len" in capsys.readouterr().err
    argv[3] = "nohttp"
    argv[5] = "5"
    assert main(argv) == 2 and "--endpoint" in capsys.readouterr().err
