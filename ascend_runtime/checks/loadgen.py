"""A streaming load generator in one asyncio process, measuring like ``vllm bench serve``.

``run_throughput(ThroughputConfig(...))`` sizes prompts by the server's usage
counts, optionally runs warm-up requests, then sends ``num_prompts`` streaming
requests with ``ignore_eos`` either all at once under a concurrency cap or
with Poisson (gamma, ``burstiness``) arrivals at ``request_rate`` req/s, and
returns a :class:`~ascend_runtime.checks.metrics.ThroughputResult`.

A request fails on a non-200 status, an SSE ``{"error": ...}`` event, invalid
JSON, a stream that ends without ``[DONE]`` or without content, a read timeout
or a connection error.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import aiohttp

from ascend_runtime.checks.http import (
    JSON_HEADERS,
    base_url,
    make_session,
    raise_open_file_limit,
)
from ascend_runtime.checks.metrics import SLO, RequestResult, ThroughputResult
from ascend_runtime.checks.prompts import request_body, size_prompts
from ascend_runtime.checks.sse import DONE, SSEDecoder, chunk_text
from ascend_runtime.config.errors import MAX_DURATION_S, MAX_REQUEST_RATE

_perf = time.perf_counter
#: Largest token length, request count or concurrency the options take (2^20; prompts are built in memory).
MAX_COUNT = 1 << 20
#: Highest ``--burstiness`` (gamma shape of the arrival gaps): at 1000 the gaps are within a few percent of
#: 1 / rate, as even as arrivals get; far above it, the gamma scale 1 / (rate x shape) underflows to 0.
MAX_BURSTINESS = 1000.0
#: Longest the arrivals may take (``--num-prompts`` / ``--request-rate``, seconds): a day, as every duration.
MAX_ARRIVAL_S = float(MAX_DURATION_S)
Api = Literal["completions", "chat"]


@dataclass
class ThroughputConfig:
    """What to send and how; lengths in tokens, times in seconds unless named *_ms."""

    endpoint: str
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int | None = None
    request_rate: float | None = None
    warmup: int = 0
    slo: SLO = field(default_factory=SLO)
    npus: int | None = None
    model: str | None = None
    api: Api = "completions"
    seed: int = 0
    timeout_s: float = 600.0
    burstiness: float = 1.0
    percentiles: tuple[float, ...] = (99.0,)
    progress: bool = True

    def validate(self) -> None:
        """Raise ValueError naming the CLI option of the first invalid field (EndpointError for the URL).

        Counts are whole numbers from 1 (``--warmup`` from 0) up to :data:`MAX_COUNT`; rates, times and
        SLOs finite and above 0 (``inf`` is no timeout: leave the option at its default)."""
        base_url(self.endpoint)
        counts = [("--input-len", self.input_len, 1), ("--output-len", self.output_len, 1),
                  ("--num-prompts", self.num_prompts, 1), ("--concurrency", self.concurrency, 1),
                  ("--warmup", self.warmup, 0), ("--npus", self.npus, 1)]
        for flag, value, low in counts:
            if value is not None and not low <= value <= MAX_COUNT:
                raise ValueError(f"{flag} must be a whole number from {low} to {MAX_COUNT} (got {value})")
        positive = [("--request-rate", self.request_rate), ("--timeout-s", self.timeout_s),
                    ("--burstiness", self.burstiness), ("--slo-ttft-ms", self.slo.ttft_ms),
                    ("--slo-tpot-ms", self.slo.tpot_ms), ("--slo-e2el-ms", self.slo.e2el_ms)]
        for flag, number in positive:
            if number is not None and not (math.isfinite(number) and number > 0):
                raise ValueError(f"{flag} must be a finite number > 0 (got {number!r})")
        if self.burstiness > MAX_BURSTINESS:
            raise ValueError(f"--burstiness must be at most {MAX_BURSTINESS:g} (got {self.burstiness!r}; "
                             f"{MAX_BURSTINESS:g} already spaces arrivals evenly)")
        if self.request_rate is not None:
            if self.request_rate > MAX_REQUEST_RATE:
                raise ValueError(f"--request-rate must be at most {MAX_REQUEST_RATE:g} requests/s "
                                 f"(got {self.request_rate!r})")
            arrivals = self.num_prompts / self.request_rate  # the warm-up is not paced
            if arrivals > MAX_ARRIVAL_S:
                raise ValueError(f"--request-rate {self.request_rate:g} spreads --num-prompts {self.num_prompts} "
                                 f"over {arrivals:.3g} s, more than a day ({MAX_ARRIVAL_S:g} s); raise the rate "
                                 "or lower --num-prompts")
        if self.api not in ("completions", "chat"):
            raise ValueError("--api must be completions or chat")
        if self.model is not None and not self.model.strip():
            raise ValueError("--model must not be empty; leave it out to use the first of /v1/models")


def api_path(api: Api) -> str:
    """URL path of the OpenAI API used."""
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


async def stream_request(session: aiohttp.ClientSession, url: str, body: bytes) -> RequestResult:
    """Send one streaming request and time its content chunks (perf_counter seconds)."""
    r = RequestResult()
    st = _perf()
    r.start = st
    last = st
    done = False
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS) as resp:
            if resp.status != 200:
                r.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return r
            dec = SSEDecoder()
            async for data in resp.content.iter_any():
                ts = _perf()
                for payload in dec.feed(data):
                    if payload == DONE:
                        done = True
                        continue
                    obj = json.loads(payload)
                    if "error" in obj:
                        err = obj["error"]
                        msg = err.get("message", err) if isinstance(err, dict) else err
                        r.error = f"stream error event: {msg}"
                        return r
                    # as `vllm bench serve` (vllm/benchmarks/lib/endpoint_request_func.py, 0.23.0): every chunk
                    # with choices is a token event, empty text included (a special token, the chat role chunk
                    # vLLM sends with the first token, a finish-only chunk); the usage chunk has no choices
                    text = chunk_text(obj)
                    if text is not None:
                        if r.content_chunks:
                            r.itl.append(ts - last)
                        else:
                            r.ttft = ts - st
                        last = ts
                        r.content_chunks += 1
                    usage = obj.get("usage")
                    if usage:
                        r.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                        r.output_tokens = int(usage.get("completion_tokens") or 0)
                        r.usage_reported = True
            if any(p == DONE for p in dec.flush()):
                done = True
    except json.JSONDecodeError as exc:
        r.error = f"invalid JSON in SSE event: {exc.msg}"
        return r
    except asyncio.TimeoutError:
        r.error = "read timeout"
        return r
    except aiohttp.ClientError as exc:
        r.error = f"{type(exc).__name__}: {exc}"
        return r
    if not done:
        r.error = "stream ended without [DONE]"
    elif r.content_chunks == 0:
        r.error = "stream had no content chunks"
    else:
        r.latency = last - st
        if not r.usage_reported:
            r.output_tokens = r.content_chunks
        r.success = True
    return r


async def fetch_model(session: aiohttp.ClientSession, base: str) -> str:
    """The first model id served at ``base``/v1/models."""
    async with session.get(base + "/v1/models") as resp:
        text = await resp.text()
        if resp.status != 200:
            raise RuntimeError(f"GET {base}/v1/models returned HTTP {resp.status}: {text[:200]}")
    try:
        return str(json.loads(text)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise RuntimeError(f"GET {base}/v1/models listed no model: {text[:200]}") from exc


@dataclass
class BatchOutcome:
    """Results of one batch, its wall time (s) and the most requests in flight at once."""

    results: list[RequestResult]
    duration: float
    peak_inflight: int


async def run_batch(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Sequence[bytes],
    concurrency: int | None,
    request_rate: float | None,
    burstiness: float = 1.0,
    seed: int = 0,
    on_done: Callable[[RequestResult], None] | None = None,
) -> BatchOutcome:
    """Send ``bodies``: arrivals at ``request_rate`` req/s (gamma; Poisson at burstiness 1), at most ``concurrency`` in flight."""
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    inflight = 0
    peak = 0

    async def one(body: bytes) -> RequestResult:
        nonlocal inflight, peak
        if sem is not None:
            await sem.acquire()
        inflight += 1
        peak = max(peak, inflight)
        try:
            res = await stream_request(session, url, body)
        finally:
            inflight -= 1
            if sem is not None:
                sem.release()
        if on_done is not None:
            on_done(res)
        return res

    rng = random.Random(seed)
    start = _perf()
    tasks: list[asyncio.Task[RequestResult]] = []
    due = start
    try:
        for i, body in enumerate(bodies):
            if request_rate and i > 0:
                due += rng.gammavariate(burstiness, 1.0 / (request_rate * burstiness))
                delay = due - _perf()
                if delay > 0:
                    await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(body)))
        results = list(await asyncio.gather(*tasks))
    except BaseException:  # interrupted or failed: no request outlives the batch (nor its session)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return BatchOutcome(results, _perf() - start, peak)


class _Progress:
    """A rich progress bar on stderr (no-op when disabled)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled = enabled
        self.failed = 0
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._p = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            refresh_per_second=4,
        )
        self._task = self._p.add_task("requests", total=total, failed=0)

    def __enter__(self) -> "_Progress":
        if self.enabled:
            self._p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self._p.stop()

    def describe(self, text: str) -> None:
        """Change the label (e.g. warm-up vs measured)."""
        if self.enabled:
            self._p.update(self._task, description=text)

    def reset(self, total: int) -> None:
        """Start counting a new batch of ``total`` requests."""
        self.failed = 0
        if self.enabled:
            self._p.reset(self._task, total=total, failed=0)

    def done(self, r: RequestResult) -> None:
        """Count one finished request."""
        if not r.success:
            self.failed += 1
        if self.enabled:
            self._p.update(self._task, advance=1, failed=self.failed)


async def run_throughput(cfg: ThroughputConfig) -> ThroughputResult:
    """Run the whole throughput check and return its result (raises ValueError on bad config)."""
    cfg.validate()
    base = base_url(cfg.endpoint)
    raise_open_file_limit(2 * (cfg.concurrency or cfg.num_prompts) + 256)
    url = base + api_path(cfg.api)
    async with make_session(cfg.timeout_s) as session:
        model = cfg.model or await fetch_model(session, base)
        sized = await size_prompts(
            session, url, cfg.api, model, cfg.input_len, cfg.num_prompts + cfg.warmup, seed=cfg.seed
        )
        bodies = [
            json.dumps(request_body(cfg.api, model, p, cfg.output_len, stream=True)).encode()
            for p in sized.prompts
        ]
        warm, measured = bodies[: cfg.warmup], bodies[cfg.warmup :]
        with _Progress(cfg.progress, len(warm) or len(measured)) as prog:
            if warm:
                prog.describe("warm-up")
                await run_batch(session, url, warm, cfg.concurrency or len(warm), None, on_done=prog.done)
                prog.reset(len(measured))
            prog.describe("requests")
            out = await run_batch(
                session, url, measured, cfg.concurrency, cfg.request_rate, cfg.burstiness, cfg.seed, prog.done
            )
    config = {
        "date": _dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat" if cfg.api == "chat" else "openai",
        "endpoint": base + api_path(cfg.api),
        "model_id": model,
        "num_prompts": cfg.num_prompts,
        "request_rate": cfg.request_rate if cfg.request_rate else "inf",
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.concurrency,
        "input_len": cfg.input_len,
        "output_len": cfg.output_len,
        "warmup": cfg.warmup,
        "seed": cfg.seed,
        "prompt_words": sized.words,
        "probe_prompt_tokens": sized.probe_tokens,
    }
    return ThroughputResult(
        requests=out.results,
        duration=out.duration,
        slo=cfg.slo,
        npus=cfg.npus,
        percentiles=cfg.percentiles,
        max_concurrent_requests=out.peak_inflight,
        config=config,
    )


def run_throughput_sync(cfg: ThroughputConfig) -> ThroughputResult:
    """Blocking wrapper of :func:`run_throughput` for callers without an event loop."""
    return asyncio.run(run_throughput(cfg))
