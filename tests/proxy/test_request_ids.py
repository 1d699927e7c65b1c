"""Request ids: a fresh engine id per prefill/decode attempt; the client's X-Request-Id kept apart.

The stub engines record the ``X-Request-Id`` and ``X-Client-Request-Id`` of
every request they get and refuse an ``X-Request-Id`` that is still live on
them (tests/proxy/stub_engine.py). The last test runs the proxy against the
real simulator with a failing prefill and a failing decode.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import InstanceSpec, specs_from_data
from ascend_runtime.proxy.server import start_proxy
from tests.proxy.conftest import free_port

REQ = {"prompt": "hello world", "max_tokens": 4, "stream": True}


def _ids(*stubs: Any) -> list[str | None]:
    return [rid for s in stubs for rid in s.engine.request_ids]


def _assert_fresh(ids: list[str | None], client_id: str | None = None) -> None:
    assert all(ids), ids  # every engine request carried an X-Request-Id
    assert len(set(ids)) == len(ids), f"an engine request id was reused: {ids}"
    if client_id is not None:
        assert client_id not in ids


async def test_prefill_retry_uses_a_new_id(stubs, proxy, http):
    bad = await stubs("prefill", "p-bad")
    bad.engine.faults.error_rate = 1.0
    good = await stubs("prefill", "p-good")
    d = await stubs("decode", "d0")
    px = await proxy(bad, good, d)
    px.pool.get("p-good").kv_usage = 1.0  # the failing prefill is tried first
    async with http.post(px.url + "/v1/completions", json=REQ, headers={"X-Request-Id": "cli-1"}) as resp:
        assert resp.status == 200
        assert resp.headers["x-prefill-instance"] == "p-good"
        await resp.read()
    assert len(bad.engine.request_ids) == 1 and len(good.engine.request_ids) == 1
    _assert_fresh(_ids(bad, good, d), "cli-1")


async def test_decode_retry_uses_new_ids_for_both_legs(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    bad = await stubs("decode", "d-bad")
    bad.engine.faults.error_rate = 1.0
    good = await stubs("decode", "d-good")
    px = await proxy(p, bad, good)
    px.pool.get("d-good").kv_usage = 1.0  # the failing decode is tried first
    async with http.post(px.url + "/v1/completions", json=REQ, headers={"X-Request-Id": "cli-2"}) as resp:
        assert resp.status == 200
        assert resp.headers["x-decode-instance"] == "d-good"
        await resp.read()
    assert len(p.engine.request_ids) == 2  # one prefill per decode attempt
    assert len(bad.engine.request_ids) == 1 and len(good.engine.request_ids) == 1
    _assert_fresh(_ids(p, bad, good), "cli-2")


@pytest.mark.parametrize("stream", [True, False])
async def test_recomputed_continuation_uses_new_ids(stubs, proxy, http, stream):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", recompute_after=2)
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json={**REQ, "max_tokens": 6, "stream": stream},
                         headers={"X-Request-Id": "cli-3"}) as resp:
        assert resp.status == 200
        await resp.read()
    assert len(p.engine.request_ids) == 2 and len(d.engine.request_ids) == 2
    _assert_fresh(_ids(p, d), "cli-3")
    assert px.proxy.metrics.recomputes._value.get() == 1  # noqa: SLF001


@pytest.mark.parametrize("stream", [True, False])
async def test_client_id_goes_to_engines_only_in_the_separate_header_and_comes_back(stubs, proxy, http, stream):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/chat/completions",
                         json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": stream},
                         headers={"X-Request-Id": "client-abc"}) as resp:
        assert resp.status == 200
        assert resp.headers["X-Request-Id"] == "client-abc"
        await resp.read()
    assert p.engine.client_request_ids == ["client-abc"] and d.engine.client_request_ids == ["client-abc"]
    _assert_fresh(_ids(p, d), "client-abc")
    # the request bodies are not touched (no request_id field is added)
    assert all("request_id" not in r for r in p.engine.requests + d.engine.requests)


async def test_client_without_id_gets_a_minted_one(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    seen = []
    for _ in range(2):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            assert resp.status == 200
            seen.append(resp.headers["X-Request-Id"])
            await resp.read()
    assert all(seen) and seen[0] != seen[1]
    assert p.engine.client_request_ids == seen and d.engine.client_request_ids == seen
    _assert_fresh(_ids(p, d))
    assert not set(seen) & set(_ids(p, d))


async def test_error_answers_carry_the_client_id_too(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    px = await proxy(p, extra=[InstanceSpec("d-dead", "decode", f"http://127.0.0.1:{free_port()}")])
    async with http.post(px.url + "/v1/completions", json=REQ, headers={"X-Request-Id": "cli-503"}) as resp:
        assert resp.status == 503
        assert resp.headers["X-Request-Id"] == "cli-503"
    async with http.post(px.url + "/v1/completions", data=b"{not json",
                         headers={"X-Request-Id": "cli-400", "Content-Type": "application/json"}) as resp:
        assert resp.status == 400
        assert resp.headers["X-Request-Id"] == "cli-400"
    # a 4xx answer relayed from an instance
    p.engine._prefill_answer = lambda req, chat: web.json_response(  # type: ignore[method-assign]
        {"error": {"message": "bad prompt", "type": "BadRequestError", "param": None, "code": 400}}, status=400)
    d = await stubs("decode", "d0")
    px2 = await proxy(p, d)
    async with http.post(px2.url + "/v1/completions", json=REQ, headers={"X-Request-Id": "cli-4xx"}) as resp:
        assert resp.status == 400
        assert resp.headers["X-Request-Id"] == "cli-4xx"
        assert (await resp.json())["error"]["message"] == "bad prompt"


async def test_two_concurrent_requests_with_the_same_client_id_both_succeed(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    p.engine.faults.added_latency_ms = 200  # both prefills are live at the same time
    d = await stubs("decode", "d0", token_interval_s=0.02)
    px = await proxy(p, d)

    async def one() -> tuple[int, str, bytes]:
        async with http.post(px.url + "/v1/completions", json=REQ, headers={"X-Request-Id": "same"}) as resp:
            return resp.status, resp.headers.get("X-Request-Id", ""), await resp.read()

    results = await asyncio.gather(one(), one())
    assert [r[0] for r in results] == [200, 200], results
    for status, rid, body in results:
        assert status == 200, body
        assert rid == "same"
        assert body.endswith(b"data: [DONE]\n\n") and b'"error"' not in body
    assert p.engine.refused_duplicates == 0 and d.engine.refused_duplicates == 0
    assert p.engine.client_request_ids == ["same", "same"]
    _assert_fresh(_ids(p, d), "same")


async def test_each_attempt_id_is_logged_with_the_client_id(stubs, proxy, http, caplog):
    bad = await stubs("prefill", "p-bad")
    bad.engine.faults.error_rate = 1.0
    good = await stubs("prefill", "p-good")
    d = await stubs("decode", "d0")
    px = await proxy(bad, good, d)
    px.pool.get("p-good").kv_usage = 1.0
    with caplog.at_level(logging.DEBUG, logger="ascend_runtime.proxy.forward"):
        async with http.post(px.url + "/v1/completions", json=REQ, headers={"X-Request-Id": "cli-log"}) as resp:
            await resp.read()
    lines = [r.getMessage() for r in caplog.records if r.name == "ascend_runtime.proxy.forward"]
    for rid in _ids(bad, good, d):
        assert any(rid in line and "cli-log" in line for line in lines), (rid, lines)
    # the failed attempt is a warning (visible at the default log level)
    (bad_id,) = bad.engine.request_ids
    assert any(r.levelno == logging.WARNING and bad_id in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- against the simulator
sim_server = pytest.importorskip("ascend_runtime.sim.server")
sim_config = pytest.importorskip("ascend_runtime.perf.sim_config")
SIM_ADMIN_TOKEN = "request-ids-sim-admin-token"


@pytest.fixture
async def sims() -> AsyncIterator[Any]:
    handles = []

    async def start(role: str, name: str) -> Any:
        h = await sim_server.start_simulator(sim_config.SimConfig(role=role, instance=name, port=0, kv_port=0,
                                                                  speedup=100.0, exit_on_fault=False,
                                                                  admin_token=SIM_ADMIN_TOKEN))
        handles.append(h)
        return h

    yield start
    for h in handles:
        await h.stop()


async def _fail_all(http: aiohttp.ClientSession, sim: Any) -> None:
    async with http.post(sim.url + "/admin/faults", json={"error_rate": 1.0},
                         headers={"Authorization": f"Bearer {SIM_ADMIN_TOKEN}"}) as resp:
        assert resp.status == 200


async def test_retries_against_simulators_use_fresh_ids(sims, http):
    p_bad, p_good = await sims("prefill", "sim-p-bad"), await sims("prefill", "sim-p-good")
    d_bad, d_good = await sims("decode", "sim-d-bad"), await sims("decode", "sim-d-good")
    await _fail_all(http, p_bad)
    await _fail_all(http, d_bad)
    specs = specs_from_data([{"name": n, "role": r, "url": h.url} for n, r, h in (
        ("sim-p-bad", "prefill", p_bad), ("sim-p-good", "prefill", p_good),
        ("sim-d-bad", "decode", d_bad), ("sim-d-good", "decode", d_good))])
    px = await start_proxy(ProxyConfig(port=0, instances=specs, health_interval_s=0))
    try:
        px.pool.get("sim-p-good").kv_usage = 1.0  # the failing instances are tried first
        px.pool.get("sim-d-good").kv_usage = 1.0
        body = {"model": "deepseek-ai/DeepSeek-R1", "prompt": "one two three four", "max_tokens": 5,
                "stream": False}
        async with http.post(px.url + "/v1/completions", json=body, headers={"X-Request-Id": "cli-sim"}) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["X-Request-Id"] == "cli-sim"
            assert resp.headers["x-decode-instance"] == "sim-d-good"
            answer = json.loads(await resp.read())
    finally:
        await px.stop()
    recs = {h.config.instance: list(h.state.request_ids) for h in (p_bad, p_good, d_bad, d_good)}
    # decode attempt 1 fails, so the prefill runs twice; each time the failing prefill is tried first
    assert [len(recs[n]) for n in ("sim-p-bad", "sim-p-good", "sim-d-bad", "sim-d-good")] == [2, 2, 1, 1]
    headers = [r.header for rs in recs.values() for r in rs]
    assert all(headers) and len(set(headers)) == 6 and "cli-sim" not in headers
    # the decode that answered learnt the prefill's engine id from kv_transfer_params, not from a shared header
    (dec,) = recs["sim-d-good"]
    last_prefill = recs["sim-p-good"][-1]
    assert dec.remote_request_id == last_prefill.internal_id
    assert last_prefill.internal_id.startswith(f"cmpl-{last_prefill.header}-0-")
    # as vLLM does, the answer's id is built from the X-Request-Id the decode got
    assert answer["id"] == f"cmpl-{dec.header}"
