"""Failure handling over real HTTP: killed, down, slow and hung instances; client disconnects."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp

from ascend_runtime.proxy.instances import InstanceSpec
from tests.proxy.conftest import free_port

REQ = {"prompt": "hello world", "max_tokens": 4, "stream": True}


async def _wait_healthy(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(url)


async def test_decode_killed_mid_stream_continues_on_another_decode_and_is_avoided(stubs, proxy, http):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.proxy.stub_engine", "--role", "decode", "--name", "victim",
                             "--port", str(port), "--token-interval-s", "0.05"], cwd=os.getcwd())
    try:
        await _wait_healthy(f"http://127.0.0.1:{port}")
        p = await stubs("prefill", "p0")
        good = await stubs("decode", "good")
        # victim is made the least loaded: the good decode reports a full KV cache
        px = await proxy(p, extra=[InstanceSpec("victim", "decode", f"http://127.0.0.1:{port}"),
                                   InstanceSpec("good", "decode", good.url)], health_interval_s=0.5)
        px.pool.get("good").kv_usage = 1.0
        async with http.post(px.url + "/v1/completions", json={**REQ, "max_tokens": 200}) as resp:
            assert resp.headers["x-decode-instance"] == "victim"
            first = await resp.content.readuntil(b"\n\n")
            assert b'"text"' in first
            os.kill(proc.pid, signal.SIGKILL)
            rest = await asyncio.wait_for(resp.read(), timeout=10)
        events = [e for e in (first + rest).decode().split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
        assert all("error" not in c for c in chunks), chunks[-1]  # the rest came from good: one whole answer
        assert sum(1 for c in chunks if c["choices"] and c["choices"][0].get("text")) == 200
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert len({c["id"] for c in chunks}) == 1
        assert good.engine.requests, "the continuation ran on good"
        # new requests avoid the dead instance (the broken stream ejects it) and succeed
        for _ in range(3):
            async with http.post(px.url + "/v1/completions", json=REQ) as resp:
                assert resp.status == 200
                assert resp.headers["x-decode-instance"] == "good"
                assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    finally:
        proc.kill()
        proc.wait()


async def test_one_prefill_down_every_request_succeeds(stubs, proxy, http):
    p = await stubs("prefill", "p-up")
    d = await stubs("decode", "d0")
    dead = f"http://127.0.0.1:{free_port()}"
    px = await proxy(p, d, extra=[InstanceSpec("p-down", "prefill", dead)])
    for _ in range(8):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            assert resp.status == 200
            assert resp.headers["x-prefill-instance"] == "p-up"
            assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    async with http.get(px.url + "/metrics") as resp:
        text = await resp.text()
    assert 'ascend_proxy_retries_total{reason="prefill_failed",role="prefill"} 1.0' in text


async def test_prefill_5xx_is_retried_on_another_prefill(stubs, proxy, http):
    bad = await stubs("prefill", "p-bad")
    bad.engine.faults.error_rate = 1.0
    good = await stubs("prefill", "p-good")
    d = await stubs("decode", "d0")
    px = await proxy(bad, good, d)
    for _ in range(4):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            assert resp.status == 200 and resp.headers["x-prefill-instance"] == "p-good"
            await resp.read()


async def test_every_decode_down_gives_503_saying_why(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    px = await proxy(p, extra=[InstanceSpec("d-a", "decode", f"http://127.0.0.1:{free_port()}"),
                               InstanceSpec("d-b", "decode", f"http://127.0.0.1:{free_port()}")])
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 503
        first = (await resp.json())["error"]["message"]
    assert "no available decode instance" in first and "d-a" in first and "unreachable" in first
    # both are now known dead: a clear 503 naming them, without touching the prefill
    n_prefill = len(p.engine.requests)
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 503
        msg = (await resp.json())["error"]["message"]
    assert "no available decode instance" in msg and "d-a" in msg and "d-b" in msg
    assert len(p.engine.requests) == n_prefill
    async with http.get(px.url + "/health") as resp:
        assert resp.status == 503
        assert "no available decode instance" in (await resp.json())["reason"]


async def test_slow_instance_is_ejected_and_readmitted(stubs, proxy, http):
    slow = await stubs("prefill", "p-slow")
    fast = await stubs("prefill", "p-fast")
    d = await stubs("decode", "d0")
    px = await proxy(slow, fast, d, prefill_timeout_s=0.2, eject_after=2, eject_duration_s=0.6,
                     health_interval_s=0.2)
    slow.engine.faults.added_latency_ms = 1000
    used = []
    for _ in range(6):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            assert resp.status == 200
            used.append(resp.headers["x-prefill-instance"])
            await resp.read()
    assert used.count("p-fast") == 6
    state = px.pool.get("p-slow")
    assert not state.routable(time.monotonic())
    async with http.get(px.url + "/metrics") as resp:
        assert 'ascend_proxy_ejections_total{instance="p-slow",reason="consecutive_errors",role="prefill"} 1.0' in (
            await resp.text())
    slow.engine.faults.added_latency_ms = 0
    # re-admitted after the ejection time and a passing health check
    for _ in range(200):
        if state.routable(time.monotonic()):
            break
        await asyncio.sleep(0.05)
    assert state.routable(time.monotonic())
    used = []
    for _ in range(6):
        async with http.post(px.url + "/v1/completions", json=REQ) as resp:
            used.append(resp.headers["x-prefill-instance"])
            await resp.read()
    assert "p-slow" in used


async def test_hung_decode_hits_first_token_timeout_and_moves_on(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    hung = await stubs("decode", "d-hung")
    hung.engine.faults.hang = True
    ok = await stubs("decode", "d-ok")
    px = await proxy(p, hung, ok, first_token_timeout_s=0.3)
    px.pool.get("d-ok").kv_usage = 1.0  # prefer the hung one first
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 200
        assert resp.headers["x-decode-instance"] == "d-ok"
        await resp.read()
    await asyncio.sleep(0.1)
    assert hung.engine.cancelled == 1  # the abandoned upstream request was closed


async def test_client_disconnect_cancels_upstream(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", token_interval_s=0.05)
    px = await proxy(p, d)
    resp = await http.post(px.url + "/v1/completions", json={**REQ, "max_tokens": 500})
    await resp.content.readuntil(b"\n\n")
    resp.close()
    for _ in range(40):
        if d.engine.cancelled:
            break
        await asyncio.sleep(0.05)
    assert d.engine.cancelled == 1
    assert px.pool.get("d0").active_seqs == 0 and px.pool.get("d0").inflight == 0
    # a prefill that is still running is cancelled too
    p.engine.faults.added_latency_ms = 2000
    task = asyncio.create_task(http.post(px.url + "/v1/completions", json=REQ))
    await asyncio.sleep(0.2)
    task.cancel()
    for _ in range(40):
        if p.engine.cancelled:
            break
        await asyncio.sleep(0.05)
    assert p.engine.cancelled == 1
    assert px.pool.get("p0").outstanding_prompt_tokens == 0


async def test_a_prefill_that_hands_no_kv_over_fails_and_the_request_moves(stubs, proxy, http):
    """A prefill answer without kv_transfer_params is that instance's failure: retried on another prefill,
    counted, never passed to decode to recompute the prompt."""
    broken = await stubs("prefill", "no-connector")
    broken.engine.no_kv_handover = True
    good = await stubs("prefill", "p-good")
    d = await stubs("decode", "d0")
    px = await proxy(broken, good, d)
    px.pool.get("p-good").kv_usage = 1.0  # the broken prefill is picked first
    async with http.post(px.url + "/v1/completions", json={**REQ, "stream": False}) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["x-prefill-instance"] == "p-good"
    assert len(broken.engine.requests) == 1 and len(good.engine.requests) == 1
    assert all(r.get("kv_transfer_params", {}).get("do_remote_prefill") for r in d.engine.requests), d.engine.requests
    async with http.get(px.url + "/metrics") as resp:
        text = await resp.text()
    assert 'ascend_proxy_retries_total{reason="no_kv_handover",role="prefill"} 1.0' in text, \
        [line for line in text.splitlines() if "retries" in line]


async def test_with_no_prefill_handing_kv_over_the_client_gets_an_error_naming_it(stubs, proxy, http):
    broken = await stubs("prefill", "no-connector")
    broken.engine.no_kv_handover = True
    d = await stubs("decode", "d0")
    px = await proxy(broken, d)
    async with http.post(px.url + "/v1/completions", json={**REQ, "stream": False}) as resp:
        body = await resp.json()
        assert resp.status in (502, 503), body
    assert "kv_transfer_params" in body["error"]["message"] and "no-connector" in body["error"]["message"], body
    assert d.engine.requests == [], "decode was asked to recompute a prompt no prefill handed over"


def _breaking_after(events: list[bytes]):  # type: ignore[no-untyped-def]
    """A stub decode answer that streams ``events`` and then dies (its connection closed, no [DONE])."""
    from aiohttp import web  # noqa: PLC0415

    async def answer(request, req, chat):  # type: ignore[no-untyped-def]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in events:
            await resp.write(event)
        await asyncio.sleep(0.05)
        request.transport.close()
        return resp

    return answer


def _token(k: int, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": f" w{k}", "finish_reason": finish}
    return b"data: " + json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
                                   "choices": [choice]}).encode() + b"\n\n"


async def test_a_stream_broken_one_token_short_continues_elsewhere(stubs, proxy, http):
    """A broken stream is continued even for its last token (a drain's migration would let it finish in place)."""
    p = await stubs("prefill", "p0")
    victim, good = await stubs("decode", "victim"), await stubs("decode", "good")
    victim.engine._decode_answer = _breaking_after([_token(k) for k in range(3)])  # type: ignore[method-assign]
    px = await proxy(p, victim, good)
    px.pool.get("good").kv_usage = 1.0  # victim first
    async with http.post(px.url + "/v1/completions", json={**REQ, "max_tokens": 4}) as resp:
        assert resp.headers["x-decode-instance"] == "victim"
        events = [e for e in (await resp.read()).decode().split("\n\n") if e]
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert events[-1] == "data: [DONE]" and all("error" not in c for c in chunks), events[-3:]
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0].get("text")) == 4
    assert good.engine.requests


async def test_a_stream_broken_after_its_end_is_closed_with_done(stubs, proxy, http):
    """The finish event was relayed, then the decode died: the answer is whole, the client gets [DONE]."""
    p = await stubs("prefill", "p0")
    victim, good = await stubs("decode", "victim"), await stubs("decode", "good")
    victim.engine._decode_answer = _breaking_after(  # type: ignore[method-assign]
        [_token(0), _token(1), _token(2), _token(3, finish="length")])
    px = await proxy(p, victim, good)
    px.pool.get("good").kv_usage = 1.0
    async with http.post(px.url + "/v1/completions", json={**REQ, "max_tokens": 4}) as resp:
        events = [e for e in (await resp.read()).decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and len(events) == 5 and "error" not in events[-2], events
    assert not good.engine.requests, "nothing was left to continue"
