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
import math
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
def serve_stub(ports: list[int]) -> None:
    """A fast PD stub on each of ``ports`` (one simulated instance per port): prefill returns
    kv_transfer_params, decode streams timed events. ``GET /bench/inflight`` -> {port: open decode streams}."""
    from aiohttp import web

    inflight = {p: 0 for p in ports}

    kv = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "bench",
          "remote_block_ids": [1, 2, 3], "remote_host": "127.0.0.1", "remote_port": 30000, "tp_size": 1}
    prefill_body = json.dumps({"id": "p", "choices": [{"index": 0, "text": "x"}], "kv_transfer_params": kv}).encode()

    async def completions(request: web.Request) -> web.StreamResponse:
        req = await request.json()
        if (req.get("kv_transfer_params") or {}).get("do_remote_decode"):
            return web.Response(body=prefill_body, content_type="application/json")
        n, gap = int(req.get("max_tokens", 16)), float(req.get("bench_gap_s", 0.0))
        port = request.transport.get_extra_info("sockname")[1]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        mono = time.monotonic_ns
        start = time.monotonic()
        inflight[port] += 1
        try:
            for i in range(n):
                if gap:
                    delay = start + (i + 1) * gap - time.monotonic()
                    await asyncio.sleep(max(0.0, delay))
                await resp.write(b'data: {"t":%d,"choices":[{"index":0,"text":" w","finish_reason":null}]}\n\n'
                                 % mono())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        finally:
            inflight[port] -= 1
        return resp

    async def inflight_route(request: web.Request) -> web.Response:
        return web.json_response(inflight)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/health", health),
                    web.get("/bench/inflight", inflight_route)])

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for p in ports:
            await web.TCPSite(runner, "127.0.0.1", p, backlog=4096).start()
        await asyncio.Event().wait()

    from ascend_runtime import eventloop

    eventloop.run(serve())


def serve_floor(port: int, upstream_port: int) -> None:
    """The floor of a relay in Python on uvloop: each client connection gets its own upstream connection
    and bytes are forwarded both ways as they arrive (one ``data_received`` -> ``write`` per read), no
    HTTP handling, no PD flow. Not a proxy; it shows what the interpreter and the loop cost per event."""
    import uvloop

    class Upstream(asyncio.Protocol):
        def __init__(self, client: asyncio.Transport):
            self.client = client

        def data_received(self, data: bytes) -> None:
            self.client.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            self.client.close()

    class Client(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport, self.up, self.early = transport, None, []
            asyncio.ensure_future(self.open())

        async def open(self) -> None:
            loop = asyncio.get_running_loop()
            self.up, _ = await loop.create_connection(lambda: Upstream(self.transport), "127.0.0.1", upstream_port)
            for data in self.early:
                self.up.write(data)

        def data_received(self, data: bytes) -> None:
            (self.early.append if self.up is None else self.up.write)(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.up is not None:
                self.up.close()

    async def main() -> None:
        await asyncio.get_running_loop().create_server(Client, "127.0.0.1", port, backlog=4096)
        await asyncio.Event().wait()

    uvloop.run(main())


def serve_pd_floor(port: int, engine_port: int) -> None:
    """The floor of the PD flow in Python on uvloop: per client request, one prefill round trip and one
    decode request to the engine at ``engine_port``, then the decode's bytes relayed to the client as they
    arrive. Not a proxy: the client request is parsed by hand (Content-Length bodies only), there are no
    limits, timeouts, validation, metrics, routing, retries, request ids or error handling, and engine
    connections are pooled without expiry. It shows what the PD flow itself costs in Python, beside the
    proxy (the same flow with all of that) and the byte floor (:func:`serve_floor`)."""
    import uvloop

    head_end, length_key = b"\r\n\r\n", b"content-length:"

    def content_length(head: bytes) -> int:
        low = head.lower()
        at = low.find(length_key)
        return int(low[at + len(length_key):low.find(b"\r\n", at)]) if at >= 0 else 0

    def take_message(buf: bytes) -> tuple[bytes, bytes] | None:
        """(body, rest) of the first whole Content-Length message in ``buf``, or None while it is incomplete."""
        end = buf.find(head_end)
        if end < 0:
            return None
        n = content_length(buf[:end])
        if len(buf) < end + 4 + n:
            return None
        return buf[end + 4:end + 4 + n], buf[end + 4 + n:]

    def engine_request(path: bytes, body: bytes) -> bytes:
        return (b"POST %s HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (path, len(body))) + body

    class Engine(asyncio.Protocol):
        """One kept-alive engine connection: collects a prefill answer, or relays a decode answer."""

        def __init__(self, idle: list["Engine"]):
            self.idle, self.buf = idle, b""
            self.answer: asyncio.Future[bytes] | None = None
            self.client: asyncio.Transport | None = None
            self.head_sent = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            if self.client is not None:  # decode: relay, the chunked body as it came
                if not self.head_sent:
                    self.head_sent = True
                    data = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                            + data[data.find(head_end) + 4:])
                self.client.write(data)
                if data.endswith(b"0\r\n\r\n"):  # the last chunk: the connection is free again
                    self.client, self.head_sent = None, False
                    self.idle.append(self)
                return
            self.buf += data
            got = take_message(self.buf)
            if got is None:
                return
            body, self.buf = got[0], b""
            answer, self.answer = self.answer, None
            self.idle.append(self)
            if answer is not None:
                answer.set_result(body)

        def connection_lost(self, exc: Exception | None) -> None:
            if self in self.idle:
                self.idle.remove(self)

    idle: list[Engine] = []

    async def engine() -> Engine:
        if idle:
            return idle.pop()
        _, proto = await asyncio.get_running_loop().create_connection(lambda: Engine(idle), "127.0.0.1", engine_port)
        return proto

    class Client(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport, self.buf = transport, b""  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            self.buf += data
            got = take_message(self.buf)
            if got is None:
                return
            body, self.buf = got
            asyncio.ensure_future(self.handle(body))

        async def handle(self, body: bytes) -> None:
            req = json.loads(body)
            prefill = dict(req, stream=False, max_tokens=1, min_tokens=1, kv_transfer_params={
                "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None})
            prefill.pop("stream_options", None)
            up = await engine()
            up.answer = asyncio.get_running_loop().create_future()
            up.transport.write(engine_request(b"/v1/completions", json.dumps(prefill).encode()))
            kv = json.loads(await up.answer).get("kv_transfer_params")
            decode = body[:body.rfind(b"}")] + b', "kv_transfer_params": ' + json.dumps(kv).encode() + b"}"
            down = await engine()
            down.client = self.transport
            down.transport.write(engine_request(b"/v1/completions", decode))

    async def main() -> None:
        await asyncio.get_running_loop().create_server(Client, "127.0.0.1", port, backlog=4096)
        await asyncio.Event().wait()

    uvloop.run(main())


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
                body = await resp.read()
                if counts[1] <= 3:  # say why, once or twice per run
                    print(f"error answer {resp.status} from {url}: {body[:300]!r}", file=sys.stderr)
                continue
            async for line in resp.content:
                if line.startswith(b'data: {"t":'):
                    now = mono()
                    lat_ns.append(now - int(line[11:line.index(b",", 11)]))
                    if first:
                        ttft.append(time.monotonic() - t0)
                        first = False
                    counts[0] += 1


def proc_cpu_s(pid: int | list[int]) -> float:
    """utime + stime (seconds) of ``pid`` (or the sum over a list of pids), from /proc/<pid>/stat."""
    total = 0.0
    for one in ([pid] if isinstance(pid, int) else pid):
        fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def proc_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


async def run_load(url: str, concurrency: int, tokens: int, gap: float, duration: float,
                   cpu_pid: int | list[int] | None = None) -> dict[str, float]:
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


# ------------------------------------------------------------------ nginx side by side, worker scaling
NGINX = "/usr/sbin/nginx"


def nginx_conf(workdir: Path, port: int, upstream_port: int) -> Path:
    """nginx config: one worker, ``proxy_buffering off``, relaying straight to the stub decode (keep-alive)."""
    conf = workdir / "nginx.conf"
    conf.write_text(f"""worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/error.log warn;
events {{ worker_connections 16384; }}
http {{
    access_log off;
    client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy;
    fastcgi_temp_path {workdir}/fastcgi; uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
    upstream decode {{ server 127.0.0.1:{upstream_port}; keepalive 1024; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://decode;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 120s;
        }}
    }}
}}
""")
    return conf


def start_nginx(workdir: Path, port: int, upstream_port: int) -> tuple[subprocess.Popen, int]:
    """Start nginx (master + one worker); returns (master process, worker pid)."""
    conf = nginx_conf(workdir, port, upstream_port)
    master = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(workdir), "-e", str(workdir / "error.log")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = [p for p in proc_tree(master.pid) if p != master.pid]
        if kids:
            return master, kids[0]
        if master.poll() is not None:
            raise RuntimeError(f"nginx exited: {master.stderr.read().decode() if master.stderr else ''}")
        time.sleep(0.05)
    raise TimeoutError("nginx worker did not start")


def start_proxy_proc(port: int, prefill: list[str], decode: list[str], workers: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ascend_runtime", "proxy", "--host", "127.0.0.1", "--port", str(port),
           "--health-interval-s", "5", "--log-level", "WARNING"] + (["--workers", str(workers)] if workers > 1 else [])
    for i, u in enumerate(prefill):
        cmd += ["--prefill", f"{u},name=p{i}"]
    for i, u in enumerate(decode):
        cmd += ["--decode", f"{u},name=d{i}"]
    return subprocess.Popen(cmd, cwd=ROOT)


async def proxy_counter(proxy_url: str, name: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(proxy_url + "/metrics") as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.split()[-1])
    return 0.0


async def relay_vs_nginx(args: argparse.Namespace) -> dict:
    """Same paced one-token-per-event streams through nginx (straight to the decode) and through the proxy
    (full PD flow), alternated ``--repeats`` times; CPU of the nginx worker vs the proxy's processes."""
    import tempfile

    stub_port, proxy_port, nginx_port = free_port(), free_port(), free_port()
    stub = subprocess.Popen([sys.executable, "-m", "benchmarks.proxy_overhead", "--serve-stub", str(stub_port)],
                            cwd=ROOT)
    stub_url = f"http://127.0.0.1:{stub_port}"
    proxy = start_proxy_proc(proxy_port, [stub_url], [stub_url], 1)
    proxy_url, nginx_url = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{nginx_port}"
    workdir = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    nginx, nginx_worker = start_nginx(workdir, nginx_port, stub_port)
    floor_port = free_port()
    floor = subprocess.Popen([sys.executable, "-m", "benchmarks.proxy_overhead", "--serve-floor", str(floor_port),
                              str(stub_port)], cwd=ROOT)
    floor_url = f"http://127.0.0.1:{floor_port}"
    pd_floor_port = free_port()
    pd_floor = subprocess.Popen([sys.executable, "-m", "benchmarks.proxy_overhead", "--serve-pd-floor",
                                 str(pd_floor_port), str(stub_port)], cwd=ROOT)
    pd_floor_url = f"http://127.0.0.1:{pd_floor_port}"
    c, gap = args.relay_streams, args.relay_streams / args.relay_rate
    tokens = args.relay_tokens
    pairs = []
    try:
        await wait_up(stub_url)
        await wait_up(proxy_url)
        await run_load(proxy_url, 16, 16, 0.0, 1.0)  # warm-up
        await run_load(nginx_url, 16, 16, 0.0, 1.0)
        pids = proc_tree(proxy.pid)
        await run_load(floor_url, 16, 16, 0.0, 1.0)
        await run_load(pd_floor_url, 16, 16, 0.0, 1.0)
        urls = {"nginx": (nginx_url, nginx_worker), "proxy": (proxy_url, pids), "pd_floor": (pd_floor_url, pd_floor.pid),
                "floor": (floor_url, floor.pid)}
        for i in range(args.repeats):
            order = (("nginx", "proxy", "pd_floor", "floor") if i % 2 == 0
                     else ("proxy", "nginx", "floor", "pd_floor"))
            ch0 = await proxy_counter(proxy_url, "ascend_proxy_relayed_chunks_total")
            ev0 = await proxy_counter(proxy_url, "ascend_proxy_relayed_events_total")
            if args.concurrent:  # all four relays in the same window: the same machine conditions for each
                share = max(1, c // 2)
                runs = await asyncio.gather(*(run_load(urls[w][0], share, tokens, gap, args.duration_s,
                                                       cpu_pid=urls[w][1]) for w in order))
                got = dict(zip(order, runs))
            else:
                got = {w: await run_load(urls[w][0], c, tokens, gap, args.duration_s, cpu_pid=urls[w][1])
                       for w in order}
            ch = await proxy_counter(proxy_url, "ascend_proxy_relayed_chunks_total") - ch0
            ev = await proxy_counter(proxy_url, "ascend_proxy_relayed_events_total") - ev0
            got["proxy"]["events_per_write"] = ev / max(1.0, ch)  # only the proxy adds to its counters
            got["ratio"] = got["proxy"]["tok_per_cpu_s"] / got["nginx"]["tok_per_cpu_s"]
            got["pd_floor_ratio"] = got["pd_floor"]["tok_per_cpu_s"] / got["nginx"]["tok_per_cpu_s"]
            print(f"relay repeat {i + 1}: nginx {got['nginx']['tok_per_cpu_s']:.0f} tok/CPU-s, proxy "
                  f"{got['proxy']['tok_per_cpu_s']:.0f} tok/CPU-s, ratio {got['ratio']:.2f}; PD floor "
                  f"{got['pd_floor']['tok_per_cpu_s']:.0f} ({got['pd_floor_ratio']:.2f}x), byte floor "
                  f"{got['floor']['tok_per_cpu_s']:.0f}", file=sys.stderr)
            pairs.append(got)
    finally:
        for p in (proxy, stub, nginx, floor, pd_floor):
            p.terminate()
            p.wait(timeout=10)
    return {"streams": max(1, c // 2) if args.concurrent else c, "gap": gap, "tokens": tokens, "pairs": pairs,
            "concurrent": bool(args.concurrent)}


async def sample_inflight(stub_url: str, stop: asyncio.Event, samples: list[list[int]]) -> None:
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            async with s.get(stub_url + "/bench/inflight") as r:
                samples.append(list((await r.json()).values()))
            await asyncio.sleep(0.05)


async def worker_scaling(args: argparse.Namespace) -> list[dict]:
    """Saturating paced load through the proxy with 1 and 2 workers, 4 decode instances (one stub process):
    tokens/s, CPU, and decode balance (peak / mean open streams per instance, sampled every 50 ms)."""
    ports = [free_port() for _ in range(4)]
    stub = subprocess.Popen([sys.executable, "-m", "benchmarks.proxy_overhead", "--serve-stub",
                             ",".join(map(str, ports))], cwd=ROOT)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    out = []
    c, gap = args.scaling_streams, args.scaling_streams / args.scaling_rate
    tokens = args.tokens or max(8, round(args.duration_s / 2 / gap))
    try:
        await wait_up(urls[0])
        for workers in (1, 2):
            port = free_port()
            proxy = start_proxy_proc(port, urls[:1], urls, workers)
            url = f"http://127.0.0.1:{port}"
            runs = []
            try:
                await wait_up(url)
                await run_load(url, 16, 16, 0.0, 1.0)  # warm-up
                for _ in range(args.repeats):
                    stop, samples = asyncio.Event(), []
                    sampler = asyncio.create_task(sample_inflight(urls[0], stop, samples))
                    res = await run_load(url, c, tokens, gap, args.duration_s, cpu_pid=proc_tree(proxy.pid))
                    stop.set()
                    await sampler
                    busy = [s for s in samples if sum(s) >= c / 2]  # steady state
                    res["imbalance"] = statistics.fmean(max(s) / (sum(s) / len(s)) for s in busy) if busy else math.nan
                    res["peak_over_mean"] = (max(max(s) for s in busy) / statistics.fmean(sum(s) / len(s) for s in busy)
                                             if busy else math.nan)
                    print(f"workers={workers}: {res['tok_s']:.0f} tok/s, imbalance {res['imbalance']:.3f}",
                          file=sys.stderr)
                    runs.append(res)
            finally:
                proxy.terminate()
                proxy.wait(timeout=15)
            out.append({"workers": workers, **median_dict(runs)})
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    return out


def previous_scaling(path: Path | None = None) -> str | None:
    """The worker-scaling part of the ``proxy_relay`` section now in docs/benchmarks.md, with the command
    that measured it, or None: a run without ``--workers-scaling`` keeps it instead of dropping it."""
    from benchmarks.report import BENCHMARKS_MD

    path = path or BENCHMARKS_MD
    text = path.read_text() if path.exists() else ""
    begin, end = "<!-- BEGIN proxy_relay -->", "<!-- END proxy_relay -->"
    if begin not in text or end not in text:
        return None
    section = text.split(begin, 1)[1].split(end, 1)[0]
    at = section.find("Worker scaling")
    if at < 0:
        return None
    kept = section[at:].strip()
    if kept.startswith("Worker scaling (kept"):
        return kept
    cmd = next((line.strip()[len("Command: "):] for line in section.splitlines() if line.startswith("Command: ")),
               "an earlier run")
    return f"Worker scaling (kept from {cmd}): " + kept[len("Worker scaling: "):]


def render_relay(args: argparse.Namespace, rel: dict | None, scaling: list[dict] | None,
                 kept_scaling: str | None = None) -> str:
    from benchmarks.report import machine_line

    cmd = "python -m benchmarks.proxy_overhead " + " ".join(sys.argv[1:])
    title = ("PD proxy relay cost vs nginx, all relays at once" if rel is not None and rel.get("concurrent")
             else "PD proxy relay cost vs nginx and worker scaling")
    out = [f"## {title} (`benchmarks/proxy_overhead.py`)", "",
           f"Command: `{cmd}`  ",
           f"Machine: {machine_line()}, {os.cpu_count()} cores shared by stub, proxy, nginx and load generator; "
           f"load average before the run: {args.loadavg}.", ""]
    if rel is not None:
        ratios = [p["ratio"] for p in rel["pairs"]]
        pd_ratios = [p["pd_floor_ratio"] for p in rel["pairs"]]
        med = {w: median_dict([p[w] for p in rel["pairs"]]) for w in ("nginx", "proxy", "pd_floor", "floor")}
        out += [
            f"Relay cost at one token per SSE event: {rel['streams']} streams, token gap {rel['gap'] * 1e3:.1f} ms "
            f"({rel['streams'] / rel['gap']:g} tokens/s offered), {rel['tokens']} tokens/request, "
            f"{args.duration_s:g} s per run; "
            "nginx 1.22 (one worker, `proxy_buffering off`, upstream keep-alive) relays the stub decode directly, "
            "the proxy (one worker) runs the full PD flow (prefill request, then the decode stream relayed). "
            "CPU = utime + stime from /proc/<pid>/stat of the nginx worker and of the proxy process. "
            + (f"The four relays run at once, each with its own {rel['streams']} streams, so each round measures "
               "them all under the same machine conditions (CPU over the same window); "
               if rel.get("concurrent") else "Runs alternate nginx / proxy (then the two floors), ")
            + f"{args.repeats} rounds; medians.", "",
            "| relay | tokens/s | CPU s | tokens per CPU-second | token latency p50 / p99 (ms) | errors |",
            "|---|---|---|---|---|---|",
        ]
        names = {"nginx": "nginx 1.22", "proxy": "proxy (PD flow)",
                 "pd_floor": "PD floor: minimal PD flow in Python on uvloop (not a proxy)",
                 "floor": "floor: bare byte relay in Python on uvloop (not a proxy)"}
        for w in ("nginx", "proxy", "pd_floor", "floor"):
            m = med[w]
            out.append(f"| {names[w]} | {m['tok_s']:.0f} | {m['proxy_cpu_s']:.2f} | {m['tok_per_cpu_s']:.0f} "
                       f"| {m['lat_p50']:.2f} / {m['lat_p99']:.2f} | {m['errors']:.0f} |")
        out += ["", f"Proxy / nginx tokens per CPU-second: median **{statistics.median(ratios):.2f}x** "
                    f"(per {'round' if rel.get('concurrent') else 'pair'}: {', '.join(f'{r:.2f}' for r in ratios)}); goal >= 0.9x. "
                    f"SSE events per proxy write: {med['proxy']['events_per_write']:.2f}. "
                    f"PD floor / nginx: median {statistics.median(pd_ratios):.2f}x "
                    f"(per {'round' if rel.get('concurrent') else 'pair'}: {', '.join(f'{r:.2f}' for r in pd_ratios)}): the PD flow alone (hand-parsed "
                    "client request, prefill round trip and decode request on pooled engine connections "
                    "that never expire, decode bytes relayed as read; no limits, timeouts, validation, "
                    "metrics, routing, retries or error handling; `serve_pd_floor`). "
                    f"Byte floor / nginx: {med['floor']['tok_per_cpu_s'] / med['nginx']['tok_per_cpu_s']:.2f}x: "
                    "a Python relay that only forwards bytes (one `data_received` -> `write` per read, no "
                    "HTTP, no PD flow) on uvloop. The proxy's distance to the PD floor is the cost of its "
                    "features per event and per request.", ""]
    if scaling is not None:
        one = scaling[0]
        out += [
            f"Worker scaling: {args.scaling_streams} streams, token gap "
            f"{args.scaling_streams / args.scaling_rate * 1e3:.1f} ms ({args.scaling_rate:g} tokens/s offered, more "
            "than the machine relays), 1 prefill and 4 decode instances (one stub process), median of "
            f"{args.repeats} runs per worker count. Balance: open decode streams per instance sampled every 50 ms "
            "(samples with at least half the streams open); imbalance = mean over samples of max / mean, "
            "peak / mean = highest per-instance count over the mean per-instance count.", "",
            "| workers | tokens/s | vs 1 worker | proxy CPU s | tokens per CPU-second | imbalance (max/mean) "
            "| peak / mean | token latency p99 (ms) | errors |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in scaling:
            out.append(f"| {r['workers']} | {r['tok_s']:.0f} | {r['tok_s'] / one['tok_s']:.2f}x "
                       f"| {r['proxy_cpu_s']:.2f} | {r['tok_per_cpu_s']:.0f} | {r['imbalance']:.3f} "
                       f"| {r['peak_over_mean']:.2f} | {r['lat_p99']:.1f} | {r['errors']:.0f} |")
    elif kept_scaling:
        out.append(kept_scaling)
    return "\n".join(out)


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
    ap.add_argument("--serve-stub", help=argparse.SUPPRESS)
    ap.add_argument("--serve-floor", nargs=2, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--serve-pd-floor", nargs=2, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--tokens", type=int, default=0, help="tokens per request (0: about half a run)")
    ap.add_argument("--rate", type=float, default=4000.0, help="aggregate offered tokens/s")
    ap.add_argument("--duration-s", type=float, default=8.0)
    ap.add_argument("--repeats", type=int, default=3, help="side-by-side repeats per concurrency (medians reported)")
    ap.add_argument("--saturation-streams", type=int, default=256)
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    ap.add_argument("--nginx", action="store_true", help="relay cost side by side with nginx (section proxy_relay)")
    ap.add_argument("--workers-scaling", action="store_true", help="tokens/s and balance with 1 and 2 workers")
    ap.add_argument("--no-overhead", action="store_true", help="skip the direct-vs-proxy latency table")
    ap.add_argument("--relay-streams", type=int, default=256)
    ap.add_argument("--relay-rate", type=float, default=8000.0, help="tokens/s offered in the nginx comparison")
    ap.add_argument("--relay-tokens", type=int, default=256, help="tokens per request in the nginx comparison")
    ap.add_argument("--concurrent", action="store_true",
                    help="nginx comparison: run the four relays at once (half the streams each, the same token "
                         "gap) instead of one after another")
    ap.add_argument("--scaling-streams", type=int, default=512)
    ap.add_argument("--scaling-rate", type=float, default=60000.0, help="tokens/s offered in the worker scaling")
    args = ap.parse_args()
    if args.concurrent and (args.workers_scaling or not args.nginx):
        ap.error("--concurrent is a mode of --nginx and writes its own section: run --workers-scaling without it")
    if args.serve_stub:
        serve_stub([int(p) for p in args.serve_stub.split(",")])
        return
    if args.serve_floor:
        serve_floor(*args.serve_floor)
        return
    if args.serve_pd_floor:
        serve_pd_floor(*args.serve_pd_floor)
        return
    args.loadavg = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    from benchmarks.report import write_section

    if not args.no_overhead:
        md = asyncio.run(main_async(args))
        print(md)
        if args.write:
            write_section("proxy_overhead", md)
    if args.nginx or args.workers_scaling:
        rel = asyncio.run(relay_vs_nginx(args)) if args.nginx else None
        scaling = asyncio.run(worker_scaling(args)) if args.workers_scaling else None
        if rel is not None and args.concurrent:  # its own section: the one-after-another record is kept
            md = render_relay(args, rel, None)
            print(md)
            if args.write:
                write_section("proxy_relay_concurrent", md)
            return
        md = render_relay(args, rel, scaling, previous_scaling() if scaling is None else None)
        print(md)
        if args.write:
            write_section("proxy_relay", md)


if __name__ == "__main__":
    main()
