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


async def test_a_refused_fault_update_changes_nothing_and_names_its_field(sim, http):
    """Every field is checked before any is applied: a bad latency does not leave the error rate half set, and no
    value reaches the timers (a latency of 1e308 ms, or a hang given as a string)."""
    h = await sim()
    for doc, field in (({"error_rate": 0.5, "added_latency_ms": -1}, "added_latency_ms"),
                       ({"error_rate": 0.5, "added_latency_ms": 1e308}, "added_latency_ms"),
                       ({"error_rate": "0.5"}, "error_rate"), ({"error_rate": True}, "error_rate"),
                       ({"error_rate": 0.5, "hang": "no"}, "hang"), ({"exit": 1}, "exit"),
                       ({"added_latency_ms": float("nan")}, "added_latency_ms")):
        async with http.post(f"{h.url}/admin/faults", json=doc) as r:
            assert r.status == 400, doc
            assert field in (await r.json())["error"]["message"], doc
    async with http.get(f"{h.url}/admin/faults") as r:
        assert await r.json() == {"error_rate": 0.0, "added_latency_ms": 0.0, "hang": False}
    assert await complete(http, h.url) == 200


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
