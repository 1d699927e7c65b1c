"""Active health checks and load scraping of every instance.

Every ``interval_s`` each instance gets ``GET /health``. A 200 passes; a
refused connection or another status fails; a timeout is *slow*, which is not a
failure unless the instance's last real request failed too (a saturated engine
answers /health late but still serves). Ejection on failed checks and
re-admission are the pool's (:meth:`InstancePool.record_health`). After a
passing check, ``GET /metrics`` from which ``vllm:kv_cache_usage_perc`` (0..1,
averaged over label sets such as DP ranks) and ``vllm:num_requests_waiting``
(summed) refine routing. A failed scrape leaves the last values untouched: no
answer, a status other than 200, more than ``MAX_SCRAPE_BYTES`` (answers.py),
not UTF-8; a value that is not a finite number, negative, or (cache usage)
above 1 is left out.
The first passing check, and the first after a failed one (a restarted server
may serve another model), also reads ``GET /v1/models``: the ``max_model_len``
of its first model is the context limit the proxy refuses impossible
``max_tokens`` with before any prefill work (validate.py); an answer that is
not a JSON object of that shape, or longer than ``MAX_SCRAPE_BYTES``, leaves
the limit unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math

import aiohttp

from ascend_runtime.httpread import read_capped, read_text
from ascend_runtime.proxy.answers import MAX_SCRAPE_BYTES
from ascend_runtime.proxy.boundedjson import load_json
from ascend_runtime.proxy.pool import InstancePool, InstanceState

log = logging.getLogger(__name__)

# Metric names of the supported releases (ascend_runtime.engine.releases.METRICS; checked against every
# release's surface by tests/engine/test_conformance.py).
KV_USAGE = ("vllm:kv_cache_usage_perc",)
WAITING = "vllm:num_requests_waiting"


def parse_vllm_load(text: str) -> tuple[float | None, float | None]:
    """Return (kv cache usage 0..1 averaged, requests waiting summed) from exposition text; None for a series
    with no usable sample (a value not finite, negative, or a cache usage above 1 is left out)."""
    kv: list[float] = []
    waiting: list[float] = []
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1]) if "}" not in line else float(line.rsplit("}", 1)[1].split()[0])
        except (IndexError, ValueError):
            continue
        if not (math.isfinite(value) and value >= 0):
            continue
        if name in KV_USAGE and value <= 1:
            kv.append(value)
        elif name == WAITING:
            waiting.append(value)
    return (sum(kv) / len(kv) if kv else None, sum(waiting) if waiting else None)


class HealthChecker:
    """Background task probing every instance of ``pool``."""

    def __init__(self, pool: InstancePool, session: aiohttp.ClientSession, interval_s: float, timeout_s: float):
        self.pool = pool
        self.session = session
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="proxy-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.interval_s)

    async def check_all(self) -> None:
        """Probe every non-removed instance once, concurrently."""
        states = [s for s in self.pool.all() if not s.removed]
        if states:
            await asyncio.gather(*(self.check(s) for s in states), return_exceptions=True)

    async def check(self, state: InstanceState) -> bool:
        """Probe one instance; update health and scraped load. Returns health."""
        url = state.spec.url
        slow = False
        try:
            async with self.session.get(url + "/health", timeout=self.timeout) as resp:
                await resp.read()
                ok, reason = resp.status == 200, f"/health returned {resp.status}"
        except asyncio.TimeoutError:
            ok, slow, reason = False, True, f"/health timed out after {self.timeout.total}s"
        except aiohttp.ClientError as exc:
            ok, reason = False, f"/health unreachable: {exc.__class__.__name__}"
        self.pool.record_health(state, ok, "" if ok else reason, slow=slow)
        if not ok and not slow:
            state.model_info_read = False
        if ok and not state.model_info_read:
            await self.read_model_info(state)
        if ok:
            try:
                async with self.session.get(url + "/metrics", timeout=self.timeout) as resp:
                    if resp.status == 200:
                        kv, waiting = parse_vllm_load(await read_text(resp, MAX_SCRAPE_BYTES))
                        if kv is not None:
                            state.kv_usage = kv
                        if waiting is not None:
                            state.waiting = waiting
            except (asyncio.TimeoutError, aiohttp.ClientError, ValueError) as exc:
                log.debug("metrics scrape of %s failed: %s", state.name, exc)
        return ok

    async def read_model_info(self, state: InstanceState) -> None:
        """``max_model_len`` of the first model in ``GET /v1/models`` (vLLM 0.23.0's ``ModelCard``,
        vllm/entrypoints/openai/engine/protocol.py); an answer without it leaves the limit unknown."""
        try:
            async with self.session.get(state.spec.url + "/v1/models", timeout=self.timeout) as resp:
                data = load_json(await read_capped(resp, MAX_SCRAPE_BYTES)) if resp.status == 200 else None
        except (asyncio.TimeoutError, aiohttp.ClientError, ValueError):  # JsonError, AnswerTooLarge
            return  # asked again at the next check
        state.model_info_read = True
        cards = data.get("data") if isinstance(data, dict) else None
        card = cards[0] if isinstance(cards, list) and cards and isinstance(cards[0], dict) else {}
        limit = card.get("max_model_len")
        state.max_model_len = limit if type(limit) is int and limit > 0 else None
