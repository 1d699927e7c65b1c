"""The per-request path: the decode body reuses the client's bytes, two routing passes per request
(prefill, decode), the serving process's collector settings."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest

from ascend_runtime.proxy.pd import build_decode_request, decode_body
from ascend_runtime.proxy.workers import GC_THRESHOLDS, tune_gc

KV = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_host": "10.0.0.1", "remote_port": 30000}

BODIES = [
    b'{"prompt":"the quick brown fox","max_tokens":5,"stream":true}',
    b'  {"prompt": "caf\\u00e9 \xe2\x98\x83", "max_tokens": 3}\r\n',  # escapes, raw UTF-8, surrounding space
    b'{"messages":[{"role":"user","content":"}"}],"stream":false}',  # a brace inside a string
    b'{"prompt":"x","kv_transfer_params":{"stale":1}}',  # the client's own member: replaced, not duplicated
    b'{"prompt":"x","seed":123456789012345678901234567890,"temperature":NaN}',  # what json.loads accepts
    b'\xef\xbb\xbf{"prompt":"bom"}',  # UTF-8 byte order mark (json.loads accepts it)
    '{"prompt":"utf-16"}'.encode("utf-16"),  # another encoding json.loads detects
    b"{}",
]


@pytest.mark.parametrize("raw", BODIES)
@pytest.mark.parametrize("answer", [{}, {"kv_transfer_params": KV}, {"kv_transfer_params": None}])
def test_decode_body_parses_to_the_decode_request(raw: bytes, answer: dict) -> None:
    req = json.loads(raw)
    body = decode_body(req, answer, raw)
    expected = build_decode_request(req, answer)
    got = json.loads(body)
    assert got == expected or (got.keys() == expected.keys() and "NaN" in raw.decode("utf-8", "replace"))
    assert decode_body(req, answer) == json.dumps(expected).encode()  # no bytes given: serialized


def test_decode_body_reuses_the_client_bytes() -> None:
    raw = b' {"prompt": "caf\\u00e9", "max_tokens": 3} \n'
    req = json.loads(raw)
    assert decode_body(req, {}, raw) == raw.strip()
    spliced = decode_body(req, {"kv_transfer_params": KV}, raw)
    assert spliced.startswith(b'{"prompt": "caf\\u00e9", "max_tokens": 3,"kv_transfer_params":')
    assert spliced.count(b'"kv_transfer_params"') == 1
    own = b'{"prompt":"x","kv_transfer_params":{"stale":1}}'
    assert decode_body(json.loads(own), {"kv_transfer_params": KV}, own).count(b"kv_transfer_params") == 1


async def test_two_routing_passes_per_request_and_a_drain_during_the_prefill(stubs, proxy, http, monkeypatch):
    p = await stubs("prefill", "p0")
    p.engine.faults.added_latency_ms = 300
    d0, d1 = await stubs("decode", "d0"), await stubs("decode", "d1")
    px = await proxy(p, d0, d1)
    picks: list[str] = []
    real_pick = px.pool.pick
    monkeypatch.setattr(px.pool, "pick", lambda role, *a, **k: (picks.append(role), real_pick(role, *a, **k))[1])
    req = {"prompt": "hello there", "max_tokens": 3, "stream": True}
    task = asyncio.ensure_future(http.post(px.url + "/v1/completions", json=req))
    for _ in range(200):
        if p.engine.running:
            break
        await asyncio.sleep(0.005)
    assert picks == ["prefill"]  # the decode check before the prefill ranks nothing
    assert px.pool.get("d0").active_seqs == px.pool.get("d1").active_seqs == 0  # chosen after the prefill
    px.pool.drain("d0")  # drained while the prefill runs: the decode is chosen among the others
    resp = await task
    async with resp:
        assert resp.status == 200 and resp.headers["x-decode-instance"] == "d1"
        assert b"[DONE]" in await resp.read()
    assert picks == ["prefill", "decode"]
    assert not d0.engine.requests and len(d1.engine.requests) == 1
    assert all(px.pool.get(n).active_seqs == 0 and px.pool.get(n).inflight == 0 for n in ("d0", "d1"))


def test_check_available_matches_pick() -> None:
    from ascend_runtime.proxy.instances import InstanceSpec
    from ascend_runtime.proxy.pool import InstancePool, NoInstanceError

    pool = InstancePool()
    for i, name in enumerate(("d0", "d1")):
        pool.add(InstanceSpec(name=name, role="decode", url=f"http://127.0.0.1:{9000 + i}"))
    pool.check_available("decode")
    pool.check_available("decode", {"d0": "failed"})
    with pytest.raises(NoInstanceError) as got:
        pool.check_available("decode", {"d0": "failed", "d1": "failed"})
    with pytest.raises(NoInstanceError) as want:
        pool.pick("decode", {"d0": "failed", "d1": "failed"}, count=False)
    assert str(got.value) == str(want.value) and "already failed" in str(got.value)
    pool.drain("d1")
    with pytest.raises(NoInstanceError, match="draining"):
        pool.check_available("decode", {"d0": "failed"})
    pool.drain("d1", draining=False)
    state = pool.get("d0")
    pool.eject(state, "errors", "test")  # ejected, not down: with d1 excluded, panic routing picks it
    assert state.ejected
    pool.check_available("decode", {"d1": "failed"})
    assert pool.pick("decode", {"d1": "failed"}, count=False) is state


async def test_no_decode_left_means_no_prefill(stubs, proxy, http):
    p, d = await stubs("prefill", "p0"), await stubs("decode", "d0")
    px = await proxy(p, d)
    px.pool.drain("d0")
    async with http.post(px.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as resp:
        assert resp.status == 503
        assert "d0" in (await resp.json())["error"]["message"]
    assert not p.engine.requests
    assert px.pool.get("d0").inflight == 0


def test_tune_gc_freezes_and_sets_thresholds() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


async def test_only_decode_drained_during_the_prefill(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    p.engine.faults.added_latency_ms = 200
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    task = asyncio.ensure_future(http.post(px.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}))
    for _ in range(200):
        if p.engine.running:
            break
        await asyncio.sleep(0.005)
    px.pool.drain("d0")
    resp = await task
    async with resp:
        assert resp.status == 503
        assert "d0: draining" in (await resp.json())["error"]["message"]
    assert not d.engine.requests
    for name in ("p0", "d0"):
        state = px.pool.get(name)
        assert state.inflight == 0 and state.active_seqs == 0 and state.outstanding_prompt_tokens == 0


async def test_the_engine_utility_routes_are_answered_by_an_instance():
    """/version, /ping, /tokenize and /detokenize through the proxy are the simulator's own answers (vLLM's
    utility routes), a 4xx of the engine's included."""
    import aiohttp

    from ascend_runtime.proxy.config import ProxyConfig
    from ascend_runtime.proxy.instances import specs_from_data
    from ascend_runtime.proxy.server import start_proxy
    from ascend_runtime.perf.sim_config import SimConfig
    from ascend_runtime.sim.server import start_simulator

    sims = [await start_simulator(SimConfig(role=role, instance=f"{role}-0", port=0, kv_port=0))
            for role in ("prefill", "decode")]
    specs = specs_from_data([{"name": f"{r}-0", "role": r, "url": f"http://127.0.0.1:{s.port}"}
                             for r, s in zip(("prefill", "decode"), sims)])
    px = await start_proxy(ProxyConfig(port=0, instances=specs, health_interval_s=0))
    try:
        async with aiohttp.ClientSession() as s:
            base, direct = f"http://127.0.0.1:{px.port}", f"http://127.0.0.1:{sims[1].port}"
            for method, path, body in (("GET", "/version", None), ("GET", "/ping", None), ("POST", "/ping", None),
                                       ("POST", "/tokenize", {"prompt": "a b c"}),
                                       ("POST", "/detokenize", {"tokens": [1, 2]}),
                                       ("POST", "/tokenize", {"prompt": "x", "model": "no-such-model"})):
                answers = []
                for url in (base, direct):
                    async with s.request(method, url + path, json=body) as r:
                        answers.append((r.status, await r.read()))
                assert answers[0] == answers[1], (path, answers)
            assert answers[0][0] == 404  # the engine's refusal of an unknown model, relayed
    finally:
        await px.stop()
        for sim in sims:
            await sim.stop()
