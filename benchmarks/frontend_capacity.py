"""How many output tokens one vLLM API server process carries: vLLM 0.23.0's own OpenAI server (the CPU
build), the engine side made cheap (the kit's generated tiny model: the engine core's step is mostly its
own scheduling), streams of ``--output-len`` tokens at rising concurrency.

Run:  python -m benchmarks.frontend_capacity [--write] [--levels 1,8,32,96,192] [--output-len 128]
      [--requests-per-stream 2]

One server is started on a free port (no KV connector, ``--max-num-seqs`` the largest level). For each
concurrency level, every stream sends ``--requests-per-stream`` streamed completions one after the other
(``ignore_eos``, greedy, ``stream_options.include_usage``), all streams at once. Per level:

- output tokens/s: completion tokens (the server's own usage counts) / wall seconds of the level;
- API server CPU: user + system CPU seconds of the server's main process (``/proc/PID/stat`` fields 14
  and 15; the engine core is a child process and not counted), as a share of the wall time (1.0 = one
  core) and in microseconds per output token;
- engine CPU: the same for every other process of the server's group (the engine core and its worker),
  as a share of the wall time: where it reaches a core while the API server's share stays low, the
  engine, not the front end, bounds the level's tokens/s, and the API server's CPU per token is still
  its cost.

CPU seconds per token is the figure the kit sizes with, because it does not depend on how busy the shared
machine is (wall times do): one process that had a whole core would emit ``1e6 / us_per_token`` tokens/s.
The capacity the kit plans with (``ascend_runtime/perf/frontend_capacity.py``) is that figure at the highest level
(per-request costs amortised as in a loaded deployment) times the usable fraction of a core, scaled by the
host CPU factor of the hardware; ``--write`` records the table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ascend_runtime.local.processes import start_process, stop_process_group  # noqa: E402
from ascend_runtime.local.vllm_engine import prepare  # noqa: E402
from ascend_runtime.local.vllm_engine.install import engine_env, missing_reason  # noqa: E402
from ascend_runtime.local.vllm_engine.server import ISOLATED_VARIABLES, server_argv, server_env  # noqa: E402

MODEL_NAME = "deepseek-ai/DeepSeek-R1"
START_TIMEOUT_S = 900.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Level:
    """One concurrency level's figures."""

    streams: int
    tokens: int
    wall_s: float
    api_cpu_s: float
    engine_cpu_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def api_cpu_share(self) -> float:
        """API server CPU seconds per wall second (1.0 = one core)."""
        return self.api_cpu_s / self.wall_s

    @property
    def engine_cpu_share(self) -> float:
        return self.engine_cpu_s / self.wall_s

    @property
    def api_us_per_token(self) -> float:
        return 1e6 * self.api_cpu_s / self.tokens


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` itself (``/proc/PID/stat`` fields 14 and 15), not its children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def group_cpu_s(pgid: int, leader: int) -> float:
    """CPU seconds of every process in process group ``pgid`` except ``leader`` (the engine core, its
    workers), from ``/proc/*/stat`` (field 5 the group, 14 and 15 the CPU ticks)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and int(stat.parent.name) != leader:
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(url: str, deadline_s: float) -> None:
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < end:
            try:
                async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(2)
    raise SystemExit(f"the server at {url} was not ready after {deadline_s:g} s")


async def one_stream(session: aiohttp.ClientSession, url: str, output_len: int, seed: int) -> int:
    """One streamed completion; returns its completion tokens (the server's usage count)."""
    body = {"model": MODEL_NAME, "prompt": f"stream {seed} of the front end benchmark", "max_tokens": output_len,
            "ignore_eos": True, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    tokens = 0
    async with session.post(url + "/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise SystemExit(f"the server answered {resp.status}: {(await resp.text())[:300]}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            if b'"usage":{' in line and b'"choices":[]' in line:
                tokens = int(line.split(b'"completion_tokens":', 1)[1].split(b",", 1)[0].split(b"}", 1)[0])
    return tokens


async def run_level(url: str, pid: int, streams: int, output_len: int, per_stream: int) -> Level:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600)) as session:
        async def stream(i: int) -> int:
            return sum([await one_stream(session, url, output_len, i * 1000 + k) for k in range(per_stream)])

        cpu0, eng0, t0 = process_cpu_s(pid), group_cpu_s(pid, pid), time.perf_counter()
        counts = await asyncio.gather(*(stream(i) for i in range(streams)))
        wall = time.perf_counter() - t0
        cpu, eng = process_cpu_s(pid) - cpu0, group_cpu_s(pid, pid) - eng0
    return Level(streams, sum(counts), wall, cpu, eng)


def table(levels: list[Level]) -> str:
    rows = ["| streams | output tokens | output tokens/s | engine CPU (cores) | API server CPU (cores) | API server CPU per token (us) |",
            "|---:|---:|---:|---:|---:|---:|"]
    rows += [f"| {lv.streams} | {lv.tokens} | {lv.tokens_per_s:.0f} | {lv.engine_cpu_share:.2f} | {lv.api_cpu_share:.2f} | "
             f"{lv.api_us_per_token:.0f} |" for lv in levels]
    return "\n".join(rows)


async def measure(levels: list[int], output_len: int, per_stream: int, log_dir: Path) -> list[Level]:
    reason = missing_reason()
    if reason:
        raise SystemExit(f"the real engine is not installed: {reason} (ascend-deploy engine install)")
    env = engine_env()
    port = free_port()
    argv = server_argv(env, prepare(0), MODEL_NAME, "127.0.0.1", port, max(levels), kv_config=None)
    log = log_dir / "server.log"
    pid = start_process(argv, log, server_env("127.0.0.1", free_port()), unset=ISOLATED_VARIABLES)
    url = f"http://127.0.0.1:{port}"
    try:
        print(f"starting vLLM 0.23.0 (CPU build) on {url}, log {log}", flush=True)
        await wait_ready(url, START_TIMEOUT_S)
        await run_level(url, pid, 2, 16, 1)  # warm: first requests compile and allocate
        out = []
        for streams in levels:
            level = await run_level(url, pid, streams, output_len, per_stream)
            print(f"  {streams:4d} streams: {level.tokens_per_s:7.0f} tok/s, engine CPU {level.engine_cpu_share:.2f} cores, "
                  f"API CPU {level.api_cpu_share:.2f} cores, {level.api_us_per_token:.0f} us/token", flush=True)
            out.append(level)
        return out
    finally:
        stop_process_group(pid)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.frontend_capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="1,8,32,96,192", help="concurrent streams per level, comma-separated")
    p.add_argument("--output-len", type=int, default=128, help="output tokens per request")
    p.add_argument("--requests-per-stream", type=int, default=2)
    p.add_argument("--write", action="store_true", help="record the table in docs/benchmarks.md")
    args = p.parse_args(argv)
    try:
        levels = [int(x) for x in args.levels.split(",") if x.strip()]
    except ValueError:
        p.error(f"--levels: comma-separated whole numbers, got {args.levels!r}")
    if not levels or min(levels) < 1 or args.output_len < 2 or args.requests_per_stream < 1:
        p.error("--levels must be positive, --output-len at least 2, --requests-per-stream at least 1")
    with tempfile.TemporaryDirectory(prefix="frontend-capacity-") as tmp:
        results = asyncio.run(measure(levels, args.output_len, args.requests_per_stream, Path(tmp)))
    text = table(results)
    top = results[-1]
    summary = (f"API server CPU per output token at {top.streams} streams: {top.api_us_per_token:.0f} us, "
               f"so one process with a whole core emits about {1e6 / top.api_us_per_token:.0f} tokens/s")
    print(text)
    print(summary)
    if args.write:
        from benchmarks.report import machine_line, write_section

        given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--write"]
        command = " ".join(["python -m benchmarks.frontend_capacity", *given, "--write"])
        write_section("frontend_capacity", "\n".join([
            "## One vLLM API server process: output tokens it carries", "",
            f"Command: `{command}` ({machine_line()}, {os.cpu_count()} CPUs). vLLM 0.23.0's OpenAI server "
            "(CPU build) with the kit's generated tiny model, so the engine core's step is cheap and the API "
            "server's own work (request handling, detokenisation, SSE) is what the CPU column measures. "
            "The kit sizes `--api-server-count` from the last column (ascend_runtime/perf/frontend_capacity.py).", "",
            text, "", summary + "."]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
