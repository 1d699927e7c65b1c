"""Human-readable summary of a throughput result dict (vLLM bench layout)."""

from __future__ import annotations

from typing import Any


def format_summary(d: dict[str, Any]) -> str:
    """A plain-text table like ``vllm bench serve`` prints; times in ms, throughputs in tok/s."""
    rows: list[tuple[str, Any]] = [
        ("Successful requests", d["completed"]),
        ("Failed requests", d["failed"]),
        ("Benchmark duration (s)", f"{d['duration']:.2f}"),
        ("Total input tokens", d["total_input_tokens"]),
        ("Total generated tokens", d["total_output_tokens"]),
        ("Request throughput (req/s)", f"{d['request_throughput']:.2f}"),
    ]
    if d.get("request_goodput") is not None:
        rows.append(("Request goodput (req/s)", f"{d['request_goodput']:.2f}"))
    rows += [
        ("Output token throughput (tok/s)", f"{d['output_throughput']:.2f}"),
        ("Total token throughput (tok/s)", f"{d['total_token_throughput']:.2f}"),
    ]
    if "per_npu_output_throughput" in d:
        rows.append((f"Output tok/s per NPU ({d['npus']} NPUs)", f"{d['per_npu_output_throughput']:.2f}"))
    rows.append(("Max concurrent requests", d.get("max_concurrent_requests", "")))
    for metric, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st)"),
                          ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        rows.append((f"-- {title} --", ""))
        for key, value in d.items():
            if key.endswith(f"_{metric}_ms"):
                stat = key[: -len(f"_{metric}_ms")]
                rows.append((f"{stat.capitalize()} {metric.upper()} (ms)", f"{value:.2f}"))
    lines = ["============ Serving Benchmark Result ============"]
    lines += [f"{k:<42}{v!s:>10}" if v != "" else k for k, v in rows]
    for err in d.get("errors", []):
        lines.append(f"error: {err}")
    lines.append("==================================================")
    return "\n".join(lines)
