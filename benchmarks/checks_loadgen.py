"""Capacity of the checks load generator: streams held at once and SSE chunks parsed per second.

Run:  python -m benchmarks.checks_loadgen [--streams 1000] [--quick]

A fast stub OpenAI server runs in a separate process (this file with
``--serve``).  Three measurements, written to the ``checks_loadgen`` section
of docs/benchmarks.md:

1. streams held: ``--streams`` requests at concurrency ``--streams``; the stub
   holds each stream open (one token every 0.5 s), so all must be in flight
   together; reports the peak in flight, failures and client CPU.
2. chunks parsed per second end to end: the stub writes events back to back;
   client chunks per wall second and per client CPU second (one core).
3. the parser alone (SSE split + json.loads + text extraction) on an
   in-memory stream: the ceiling per core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ascend_runtime.checks.loadgen import ThroughputConfig, run_throughput  # noqa: E402
from ascend_runtime.checks.sse import DONE, SSEDecoder, chunk_text  # noqa: E402


def _event(i: int) -> bytes:
    return b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" w%d","finish_reason":null}],"usage":null}\n\n' % i


# ------------------------------------------------------------------ stub server (child process)


def serve(port: int, interval_s: float, batch: int) -> None:
    """A stub OpenAI server: one token per word of usage, ``batch`` events per write, ``interval_s`` between writes."""
    from aiohttp import web

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stub"}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = int(body.get("max_tokens", 16))
        pt = len(body["prompt"].split())
        usage = {"prompt_tokens": pt, "completion_tokens": n, "total_tokens": pt + n}
        if not body.get("stream"):
            return web.json_response({"choices": [{"index": 0, "text": "x"}], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for start in range(0, n, batch):
            await resp.write(b"".join(_event(i) for i in range(start, min(n, start + batch))))
            await asyncio.sleep(interval_s)
        await resp.write(b'data: {"choices":[],"usage":' + json.dumps(usage).encode() + b"}\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", generate)
    web.run_app(app, host="127.0.0.1", port=port, backlog=4096, access_log=None, print=None)


class Stub:
    """The stub server as a child process on a free loopback port."""

    def __init__(self, interval_s: float, batch: int) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(self.port), "--interval-s", str(interval_s), "--batch", str(batch)]
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "Stub":
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("stub server did not start")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# ------------------------------------------------------------------ measurements


def _run(cfg: ThroughputConfig) -> tuple[dict, float, float, int]:
    cpu0, t0 = time.process_time(), time.perf_counter()
    res = asyncio.run(run_throughput(cfg))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
    chunks = sum(r.content_chunks for r in res.requests)
    return res.to_dict(), cpu, wall, chunks


def held_streams(streams: int) -> dict:
    """Peak concurrent streams with every stream held open ~3 s."""
    with Stub(interval_s=0.5, batch=1) as stub:
        cfg = ThroughputConfig(endpoint=stub.url, input_len=16, output_len=6, num_prompts=streams,
                               concurrency=streams, progress=False, timeout_s=60)
        d, cpu, wall, chunks = _run(cfg)
    return {"streams": streams, "peak": d["max_concurrent_requests"], "completed": d["completed"],
            "failed": d["failed"], "duration": d["duration"], "cpu_s": cpu, "wall_s": wall,
            "mean_ttft_ms": d["mean_ttft_ms"], "p99_ttft_ms": d["p99_ttft_ms"], "errors": d["errors"][:3]}


def chunk_rate(concurrency: int, output_len: int, prompts: int, batch: int) -> dict:
    """End-to-end content chunks per second (wall and per client CPU second)."""
    with Stub(interval_s=0.0, batch=batch) as stub:
        cfg = ThroughputConfig(endpoint=stub.url, input_len=16, output_len=output_len, num_prompts=prompts,
                               concurrency=concurrency, progress=False, timeout_s=60)
        d, cpu, wall, chunks = _run(cfg)
    return {"chunks": chunks, "duration": d["duration"], "cpu_s": cpu, "failed": d["failed"],
            "per_wall_s": chunks / d["duration"], "per_cpu_s": chunks / cpu, "batch": batch}


def parser_only(n: int = 200_000) -> float:
    """Events per second through SSEDecoder + json.loads + chunk_text (one core)."""
    blob = b"".join(_event(i) for i in range(n)) + b"data: " + DONE + b"\n\n"
    reads = [blob[i : i + 16384] for i in range(0, len(blob), 16384)]
    t0 = time.process_time()
    dec, count = SSEDecoder(), 0
    for data in reads:
        for payload in dec.feed(data):
            if payload != DONE and chunk_text(json.loads(payload)):
                count += 1
    dt = time.process_time() - t0
    assert count == n
    return n / dt


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write its section of docs/benchmarks.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--interval-s", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--streams", type=int, default=1000, help="concurrent streams to hold (default 1000)")
    ap.add_argument("--quick", action="store_true", help="smaller runs, do not write docs/benchmarks.md")
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.interval_s, args.batch)
        return 0
    from benchmarks.report import machine_line, write_section

    parse = parser_only(50_000 if args.quick else 200_000)
    print(f"parser only: {parse:,.0f} events/s per core", flush=True)
    streams = [held_streams(s) for s in ((200,) if args.quick else (args.streams, 2 * args.streams))]
    for s in streams:
        print(f"held streams: {s}", flush=True)
    rates = [chunk_rate(16, 500 if args.quick else 2000, 32 if args.quick else 64, b) for b in (1, 16)]
    for r in rates:
        print(f"chunk rate: {r}", flush=True)
    if args.quick:
        return 0
    cmd = "python -m benchmarks.checks_loadgen" + (f" --streams {args.streams}" if args.streams != 1000 else "")
    lines = [
        "## checks_loadgen: load generator capacity",
        "",
        f"`{cmd}` — {machine_line()}; stub server in a separate process on loopback.",
        "",
        "| streams requested | peak in flight | completed | failed | duration (s) | client CPU (s) | mean / p99 TTFT (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in streams:
        lines.append(f"| {s['streams']} | {s['peak']} | {s['completed']} | {s['failed']} | {s['duration']:.2f} | "
                     f"{s['cpu_s']:.2f} | {s['mean_ttft_ms']:.1f} / {s['p99_ttft_ms']:.1f} |")
    lines += ["", "Each held stream gets one token every 0.5 s (6 tokens), so all streams are open together.", "",
              "| SSE chunks parsed | events per network write | chunks / wall s | chunks / client CPU s (one core) |",
              "|---|---|---|---|"]
    for r in rates:
        lines.append(f"| {r['chunks']:,} | {r['batch']} | {r['per_wall_s']:,.0f} | {r['per_cpu_s']:,.0f} |")
    lines += ["", f"Parser alone (SSE split + `json.loads` + text extraction, in memory): {parse:,.0f} events/s per core.",
              "With one event per write the client pays one aiohttp read per chunk (as against a real server);",
              "the stub shares the 2 cores, so per-CPU-second figures are the load generator's own cost.",
              "Where client CPU is well below wall time (all rows here) the single-process stub server,",
              "not the load generator, set the wall-clock rates and the TTFTs of the held-stream runs",
              "(1000-2000 connections accepted at once)."]
    write_section("checks_loadgen", "\n".join(lines))
    print("wrote docs/benchmarks.md section checks_loadgen")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
