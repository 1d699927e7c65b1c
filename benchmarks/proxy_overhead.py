"""Proxy overhead: the same streaming load straight to a decode stub and through the proxy.

Processes (all on 127.0.0.1): a fast stub engine (prefill answers at once,
decode streams ``--tokens`` SSE events with a fixed gap, each event carrying its
send time ``t`` from CLOCK_MONOTONIC), the proxy (``ascend-deploy proxy``, one
process = one core at most), and this load generator.

For each concurrency C (default 64, 256, 1024) the load keeps C streams open
for ``--duration-s``; the per-stream token gap is C / ``--rate`` so every run
offers the same aggregate token rate. Reported per run:

- token latency: receive time - send time of every token event (ms), p50/p99,
  direct and through the proxy; "added" = proxied - direct;
- TTFT (ms) p50/p99 (through the proxy it includes the extra prefill hop);
- relayed tokens/s (wall) and tokens per CPU-second of the proxy process,
  i.e. what one core sustains.

A final saturation run (no token gap) measures the proxy's maximum relay rate.

Run: ``python -m benchmarks.proxy_overhead [--write]`` (``--write`` updates
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ stub engine (its own process)
def serve_stub(port: int) -> None:
    """A fast PD stub: prefill returns kv_transfer_params, decode streams timed events."""
    from aiohttp import web

    kv = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "bench",
          "remote_block_ids": [1, 2, 3], "remote_host": "127.0.0.1", "remote_port": 30000, "tp_size": 1}
    prefill_body = json.dumps({"id": "p", "choices": [{"index": 0, "text": "x"}], "kv_transfer_params": kv}).encode()

    async def completions(request: web.Request) -> web.StreamResponse:
        req = await request.json()
        if (req.get("kv_transfer_params") or {}).get("do_remote_decode"):
            return web.Response(body=prefill_body, content_type="application/json")
        n, gap = int(req.get("max_tokens", 16)), float(req.get("bench_gap_s", 0.0))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        mono = time.monotonic_ns
        start = time.monotonic()
        for i in range(n):
            if gap:
                delay = start + (i + 1) * gap - time.monotonic()
                await asyncio.sleep(max(0.0, delay))
            await resp.write(b'data: {"t":%d,"choices":[{"index":0,"text":" w","finish_reason":null}]}\n\n' % mono())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/health", health)])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=4096)


# ------------------------------------------------------------------ load generator
async def one_stream(session: aiohttp.ClientSession, url: str, tokens: int, gap: float, stop_at: float,
                     lat_ns: list[int], ttft: list[float], counts: list[int]) -> None:
    body = {"prompt": "bench prompt words", "max_tokens": tokens, "stream": True, "bench_gap_s": gap}
    mono = time.monotonic_ns
    await asyncio.sleep(random.uniform(0, min(1.0, gap * tokens)))  # stagger starts: no artificial burst
    while time.monotonic() < stop_at:
        t0 = time.monotonic()
        first = True
        async with session.post(url + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                counts[1] += 1
                await resp.read()
                continue
            async for line in resp.content:
                if line.startswith(b'data: {"t":'):
                    now = mono()
                    lat_ns.append(now - int(line[11:line.index(b",", 11)]))
                    if first:
                        ttft.append(time.monotonic() - t0)
                        first = False
                    counts[0] += 1


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


async def run_load(url: str, concurrency: int, tokens: int, gap: float, duration: float,
                   cpu_pid: int | None = None) -> dict[str, float]:
    lat_ns: list[int] = []
    ttft: list[float] = []
    counts = [0, 0]
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        cpu0 = proc_cpu_s(cpu_pid) if cpu_pid else 0.0
        t0 = time.monotonic()
        stop_at = t0 + duration
        await asyncio.gather(*(one_stream(session, url, tokens, gap, stop_at, lat_ns, ttft, counts)
                               for _ in range(concurrency)))
        wall = time.monotonic() - t0
        cpu = (proc_cpu_s(cpu_pid) - cpu0) if cpu_pid else 0.0
    lat_ms = sorted(x / 1e6 for x in lat_ns)
    ttft_ms = sorted(x * 1e3 for x in ttft)

    def pct(xs: list[float], q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    return {"tokens": counts[0], "errors": counts[1], "wall_s": wall, "tok_s": counts[0] / wall,
            "lat_p50": pct(lat_ms, 0.5), "lat_p99": pct(lat_ms, 0.99), "ttft_p50": pct(ttft_ms, 0.5),
            "ttft_p99": pct(ttft_ms, 0.99), "proxy_cpu_s": cpu,
            "tok_per_cpu_s": counts[0] / cpu if cpu else float("nan"),
            "lat_mean": statistics.fmean(lat_ms) if lat_ms else float("nan")}


# ------------------------------------------------------------------ orchestration
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_up(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(url)


async def relayed_chunks(proxy_url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(proxy_url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith("ascend_proxy_relayed_chunks_total"):
                return float(line.split()[-1])
    return 0.0


def median_dict(runs: list[dict]) -> dict:
    """Per key, the median over repeated runs."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


async def main_async(args: argparse.Namespace) -> str:
    stub_port, proxy_port = free_port(), free_port()
    stub = subprocess.Popen([sys.executable, "-m", "benchmarks.proxy_overhead", "--serve-stub", str(stub_port)],
                            cwd=ROOT)
    stub_url = f"http://127.0.0.1:{stub_port}"
    proxy = subprocess.Popen([sys.executable, "-m", "ascend_runtime", "proxy", "--host", "127.0.0.1", "--port",
                              str(proxy_port), "--prefill", f"{stub_url},name=p0", "--decode", f"{stub_url},name=d0",
                              "--health-interval-s", "5", "--log-level", "WARNING"], cwd=ROOT)
    proxy_url = f"http://127.0.0.1:{proxy_port}"
    rows = []
    try:
        await wait_up(stub_url)
        await wait_up(proxy_url)
        await run_load(proxy_url, 16, 16, 0.0, 1.0)  # warm-up
        for c in args.concurrency:
            gap = c / args.rate
            tokens = args.tokens or max(8, round(args.duration_s / 2 / gap))
            directs, vias, counts = [], [], []
            for _ in range(args.repeats):  # direct and proxied side by side, repeated; medians reported
                directs.append(await run_load(stub_url, c, tokens, gap, args.duration_s))
                chunks0 = await relayed_chunks(proxy_url)
                vias.append(await run_load(proxy_url, c, tokens, gap, args.duration_s, cpu_pid=proxy.pid))
                counts.append(await relayed_chunks(proxy_url) - chunks0)
                print(f"C={c}: direct {directs[-1]}\n       proxy  {vias[-1]}", file=sys.stderr)
            added_p99 = [v["lat_p99"] - d["lat_p99"] for d, v in zip(directs, vias)]
            rows.append((c, gap, tokens, median_dict(directs), median_dict(vias), statistics.median(counts), added_p99))
        chunks0 = await relayed_chunks(proxy_url)
        sat = await run_load(proxy_url, args.saturation_streams, args.tokens or 256, 0.0, args.duration_s,
                             cpu_pid=proxy.pid)
        sat_chunks = await relayed_chunks(proxy_url) - chunks0
        print(f"saturation: {sat}", file=sys.stderr)
    finally:
        for p in (proxy, stub):
            p.terminate()
            p.wait(timeout=10)
    return render(args, rows, sat, sat_chunks)


def render(args: argparse.Namespace, rows: list, sat: dict, sat_chunks: float) -> str:
    from benchmarks.report import machine_line

    cmd = "python -m benchmarks.proxy_overhead " + " ".join(sys.argv[1:])
    out = [
        "## PD proxy overhead (`benchmarks/proxy_overhead.py`)", "",
        f"Command: `{cmd}`  ",
        f"Machine: {machine_line()}, {os.cpu_count()} cores shared by stub, proxy and load generator.  ",
        f"Load: C concurrent streams with staggered starts, token gap C/{args.rate:g} s "
        f"(same aggregate {args.rate:g} tokens/s offered at every C), {args.duration_s:g} s per run, "
        "requests of about half a run each (tokens/request column). Load average before the run: "
        f"{args.loadavg}. Each cell is the median of {args.repeats} side-by-side repeats (direct, then proxied).", "",
        "| streams | token gap ms | tokens/request | token latency p50 direct / proxy / added (ms) "
        "| p99 direct / proxy / added (ms) | TTFT p50 direct / proxy (ms) | TTFT p99 direct / proxy (ms) "
        "| added p99 per repeat (ms) | relayed tok/s | tok per proxy CPU-s | chunks/token | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, gap, tokens, d, v, chunks, added_p99 in rows:
        out.append(
            f"| {c} | {gap * 1e3:.1f} | {tokens} | {d['lat_p50']:.2f} / {v['lat_p50']:.2f} / {v['lat_p50'] - d['lat_p50']:+.2f} "
            f"| {d['lat_p99']:.2f} / {v['lat_p99']:.2f} / {v['lat_p99'] - d['lat_p99']:+.2f} "
            f"| {d['ttft_p50']:.2f} / {v['ttft_p50']:.2f} | {d['ttft_p99']:.2f} / {v['ttft_p99']:.2f} "
            f"| {', '.join(f'{a:+.1f}' for a in added_p99)} "
            f"| {v['tok_s']:.0f} | {v['tok_per_cpu_s']:.0f} | {chunks / max(1, v['tokens']):.2f} "
            f"| {d['errors']:.0f} / {v['errors']:.0f} |")
    out += [
        "",
        f"Saturation ({args.saturation_streams} streams, {args.tokens or 256} tokens/request, no token gap): {sat['tok_s']:.0f} relayed tokens/s wall, "
        f"proxy CPU {sat['proxy_cpu_s']:.1f} s over {sat['wall_s']:.1f} s, "
        f"{sat['tok_per_cpu_s']:.0f} tokens per proxy CPU-second, "
        f"{sat_chunks / max(1, sat['tokens']):.2f} upstream chunks per token, "
        f"token latency p50/p99 {sat['lat_p50']:.1f}/{sat['lat_p99']:.1f} ms.",
        "",
        "Goals: added p99 token latency <= 2 ms at 256 streams; >= 20,000 relayed tokens/s on one core "
        "(tokens per proxy CPU-second).",
    ]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--serve-stub", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--tokens", type=int, default=0, help="tokens per request (0: about half a run)")
    ap.add_argument("--rate", type=float, default=4000.0, help="aggregate offered tokens/s")
    ap.add_argument("--duration-s", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3, help="side-by-side repeats per concurrency (medians reported)")
    ap.add_argument("--saturation-streams", type=int, default=256)
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = ap.parse_args()
    if args.serve_stub:
        serve_stub(args.serve_stub)
        return
    args.loadavg = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    md = asyncio.run(main_async(args))
    print(md)
    if args.write:
        from benchmarks.report import write_section

        write_section("proxy_overhead", md)


if __name__ == "__main__":
    main()
