"""Fault injection at runtime, and 1000 concurrent streams in one process."""

from __future__ import annotations

import asyncio
import time


async def post_faults(http, url, **doc):
    async with http.post(f"{url}/admin/faults", json=doc) as r:
        assert r.status == 200
        return await r.json()


async def complete(http, url, **extra):
    async with http.post(f"{url}/v1/completions", json={"prompt": "a b", "max_tokens": 2, **extra}) as r:
        return r.status


async def test_error_rate_and_latency(sim, http):
    h = await sim()
    await post_faults(http, h.url, error_rate=1.0)
    assert await complete(http, h.url) == 500
    await post_faults(http, h.url, error_rate=0.0, added_latency_ms=150)
    t0 = time.perf_counter()
    assert await complete(http, h.url) == 200
    assert time.perf_counter() - t0 >= 0.15
    async with http.post(f"{h.url}/admin/faults", json={"error_rate": 2}) as r:
        assert r.status == 400


async def test_hang_and_resume(sim, http):
    h = await sim()
    await post_faults(http, h.url, hang=True)
    pending = asyncio.ensure_future(complete(http, h.url))
    await asyncio.sleep(0.2)
    assert not pending.done()
    await post_faults(http, h.url, hang=False)
    assert await asyncio.wait_for(pending, 5) == 200


async def test_exit_stops_in_process_server(sim, http):
    h = await sim()
    assert (await post_faults(http, h.url, exit=True))["exit"] is True
    await asyncio.wait_for(h.wait_stopped(), 5)
    try:
        async with http.get(f"{h.url}/health") as r:
            raise AssertionError(f"still serving: {r.status}")
    except OSError:
        pass


async def test_1000_concurrent_streams(sim, http):
    h = await sim(speedup=1000.0)

    async def stream() -> int:
        body = {"prompt": "p q r", "max_tokens": 8, "stream": True, "ignore_eos": True}
        async with http.post(f"{h.url}/v1/completions", json=body) as r:
            assert r.status == 200
            text = await r.text()
        assert text.endswith("data: [DONE]\n\n")
        return text.count('"text_completion"')

    counts = await asyncio.gather(*(stream() for _ in range(1000)))
    assert counts == [8] * 1000
    async with http.get(f"{h.url}/admin/stats") as r:
        s = await r.json()
    assert s["generation_tokens"] == 8000 and s["running"] == 0
