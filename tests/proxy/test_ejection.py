"""Ejection over real HTTP: passive evidence ejects, active checks confirm, the last instance stays.

Timing is controlled, not measured: a "saturated" stub never answers /health
(so every check times out, whatever the machine speed), failing stubs answer
500 every time, and ejection times are driven by a fake clock put on the pool.
"""

from __future__ import annotations

import asyncio
import logging

from ascend_runtime.proxy.instances import InstanceSpec
from tests.proxy.conftest import free_port

REQ = {"prompt": "hello world", "max_tokens": 4, "stream": True}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def _until(cond, what: str, steps: int = 1000) -> None:
    """Wait for ``cond()``; gives up after ``steps`` event-loop rounds of 10 ms (not a speed threshold)."""
    for _ in range(steps):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def _metrics(http, px) -> str:
    async with http.get(px.url + "/metrics") as resp:
        return await resp.text()


async def test_saturated_decode_that_answers_health_late_is_never_ejected(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    d.engine.health_hang = True  # every /health times out; requests are served
    px = await proxy(p, d, health_interval_s=0.02, health_timeout_s=0.05)
    await _until(lambda: d.engine.health_calls >= 5, "five /health checks of d0")
    for _ in range(20):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    state = px.pool.get("d0")
    assert state.routable(px.pool.clock()) and state.eject_count == 0
    text = await _metrics(http, px)
    assert 'ascend_proxy_slow_health_checks_total{instance="d0",role="decode"}' in text
    assert 'ascend_proxy_ejections_total{instance="d0"' not in text


async def test_consecutive_5xx_eject_logged_with_reason(stubs, proxy, http, caplog):
    caplog.set_level(logging.INFO, logger="ascend_runtime.proxy")
    p = await stubs("prefill", "p0")
    bad = await stubs("decode", "d-bad")
    bad.engine.faults.error_rate = 1.0
    good = await stubs("decode", "d-good")
    px = await proxy(p, bad, good, eject_after=3)
    px.pool.get("d-good").kv_usage = 1.0  # d-bad is preferred while it is in rotation
    for _ in range(6):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            assert resp.status == 200 and resp.headers["x-decode-instance"] == "d-good"
            await resp.read()
    assert len(bad.engine.requests) == 3  # ejected after the third 500 in a row
    assert 'ascend_proxy_ejections_total{instance="d-bad",reason="consecutive_errors",role="decode"} 1.0' in (
        await _metrics(http, px))
    lines = [r.getMessage() for r in caplog.records if "ejected decode instance d-bad" in r.getMessage()]
    assert len(lines) == 1
    assert "consecutive_errors" in lines[0] and "3 failed requests in a row" in lines[0] and "500" in lines[0]


async def test_connect_failures_eject_with_growing_ejection_time(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    good = await stubs("decode", "d-good")
    px = await proxy(p, good, extra=[InstanceSpec("d-dead", "decode", f"http://127.0.0.1:{free_port()}")],
                     eject_duration_s=5)
    clock = Clock()
    px.pool.clock = clock
    px.pool.get("d-good").kv_usage = 1.0  # d-dead is preferred whenever it is in rotation
    dead = px.pool.get("d-dead")
    for round_, duration in ((1, 5.0), (2, 10.0), (3, 15.0)):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            assert resp.status == 200 and resp.headers["x-decode-instance"] == "d-good"
            await resp.read()
        assert not dead.routable(clock())
        assert dead.ejected_until - clock() == duration  # base x number of ejections in a row
        clock.t += duration + 0.1  # over: re-admitted, tried again, refused again
    text = await _metrics(http, px)
    assert 'ascend_proxy_ejections_total{instance="d-dead",reason="connect_failure",role="decode"} 3.0' in text
    assert 'ascend_proxy_readmissions_total{instance="d-dead",role="decode"} 2.0' in text


async def test_last_instance_of_a_role_is_never_ejected_and_panic_is_counted(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    d.engine.faults.error_rate = 1.0
    px = await proxy(p, d, eject_after=2)
    for i in range(6):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            assert resp.status in (502, 503)
            await resp.read()
        assert len(d.engine.requests) == i + 1  # still routed to: never ejected
    state = px.pool.get("d0")
    assert not state.ejected and state.outlier
    text = await _metrics(http, px)
    assert 'ascend_proxy_panic_routing_total{kind="outlier",role="decode"}' in text
    assert 'ascend_proxy_ejections_skipped_total{instance="d0",reason="consecutive_errors",role="decode"}' in text
    d.engine.faults.error_rate = 0.0
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 200
        await resp.read()
    assert not state.outlier


async def test_readmission_needs_the_ejection_time_and_a_passing_check(stubs, proxy, http, caplog):
    caplog.set_level(logging.INFO, logger="ascend_runtime.proxy")
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d, health_interval_s=0.01, eject_duration_s=5)
    clock = Clock()
    px.pool.clock = clock
    state = px.pool.get("d0")
    d.engine.health_status = 503
    await _until(lambda: not state.routable(clock()), "d0 ejected by failed health checks")
    assert d.engine.health_calls >= 3  # not on the first failed check
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 503
    d.engine.health_status = None  # recovered: checks pass, but the ejection time is not over
    calls = d.engine.health_calls
    await _until(lambda: d.engine.health_calls >= calls + 3, "three passing checks")
    assert not state.routable(clock())
    clock.t += 5.1
    await _until(lambda: state.routable(clock()), "d0 re-admitted")
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 200
        await resp.read()
    assert 'ascend_proxy_readmissions_total{instance="d0",role="decode"} 1.0' in await _metrics(http, px)
    messages = [r.getMessage() for r in caplog.records]
    assert any("ejected decode instance d0" in m and "failed health checks" in m and "503" in m for m in messages)
    assert any("re-admitted decode instance d0" in m and "health check passed" in m for m in messages)


async def test_an_instance_moved_to_another_url_is_no_longer_ejected(stubs, proxy, http):
    """The fault watcher moved the instance to a spare node (admin add at a new URL): the dead server's ejection
    is not the new server's, so it routes as soon as it is undrained."""
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    dead = InstanceSpec("d1", "decode", f"http://127.0.0.1:{free_port()}")
    px = await proxy(p, d, extra=[dead])
    px.pool.get("d0").kv_usage = 1.0  # d1 is tried first and refuses: ejected
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 200
        await resp.read()
    moved = px.pool.get("d1")
    assert moved.ejected and not moved.routable(px.pool.clock())
    d1 = await stubs("decode", "d1")
    px.pool.add(InstanceSpec("d1", "decode", d1.url), source="admin")
    assert not moved.ejected and moved.routable(px.pool.clock())
    px.pool.add(InstanceSpec("d1", "decode", d1.url), source="admin")  # the same URL again keeps its state
    assert moved.routable(px.pool.clock())
