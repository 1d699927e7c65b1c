"""Request ids as vLLM 0.23.0 handles them: header > body request_id > random; duplicates accepted."""

from __future__ import annotations

import asyncio
import json
import re

from tests.sim.test_pd import PROXY_PREFILL_PARAMS

SUFFIX = r"-[0-9a-f]{8}"


async def test_answer_id_is_built_from_the_x_request_id_header(sim, http):
    d = await sim(role="decode", instance="d0")
    async with http.post(f"{d.url}/v1/completions", json={"prompt": "a b", "max_tokens": 2},
                         headers={"X-Request-Id": "abc"}) as r:
        assert r.status == 200
        assert (await r.json())["id"] == "cmpl-abc"
        assert "X-Request-Id" not in r.headers  # vLLM echoes it only with --enable-request-id-headers
    async with http.post(f"{d.url}/v1/chat/completions", headers={"X-Request-Id": "xyz"},
                         json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in (await r.text()).split("\n\n") if line.startswith("data: {")]
    assert events and {e["id"] for e in events} == {"chatcmpl-xyz"}
    comp, chat = d.state.request_ids
    assert comp.header == "abc" and re.fullmatch("cmpl-abc-0" + SUFFIX, comp.internal_id)
    assert chat.header == "xyz" and re.fullmatch("chatcmpl-xyz" + SUFFIX, chat.internal_id)


async def test_header_wins_over_body_request_id_then_body_then_random(sim, http):
    d = await sim(role="decode", instance="d0")
    body = {"prompt": "a", "max_tokens": 1, "request_id": "from-body"}
    async with http.post(f"{d.url}/v1/completions", json=body, headers={"X-Request-Id": "from-header"}) as r:
        assert (await r.json())["id"] == "cmpl-from-header"
    async with http.post(f"{d.url}/v1/completions", json=body) as r:
        assert (await r.json())["id"] == "cmpl-from-body"
    async with http.post(f"{d.url}/v1/completions", json={"prompt": "a", "max_tokens": 1}) as r:
        assert re.fullmatch(r"cmpl-[0-9a-f]{16}", (await r.json())["id"])
    async with http.post(f"{d.url}/v1/completions", json={**body, "request_id": 7}) as r:
        assert r.status == 400


async def test_a_live_duplicate_id_is_accepted_as_vllm_does(sim, http):
    d = await sim(role="decode", instance="d0", speedup=1.0)

    async def one() -> tuple[int, str]:
        async with http.post(f"{d.url}/v1/completions", json={"prompt": "a b c", "max_tokens": 20, "stream": True},
                             headers={"X-Request-Id": "dup"}) as r:
            return r.status, await r.text()

    t1 = asyncio.create_task(one())
    e = d.state.engine
    for _ in range(200):
        if e.num_running + len(e.waiting):
            break
        await asyncio.sleep(0.01)
    assert e.num_running + len(e.waiting) == 1 and not t1.done()  # the first one is live
    results = await asyncio.gather(t1, one())
    assert [s for s, _ in results] == [200, 200]
    assert all(t.rstrip().endswith("data: [DONE]") for _, t in results)
    a, b = d.state.request_ids
    assert a.header == b.header == "dup" and a.response_id == b.response_id == "cmpl-dup"
    assert a.internal_id != b.internal_id


async def test_prefill_announces_its_engine_id_as_remote_request_id(sim, http):
    p = await sim(role="prefill", instance="p0")
    d = await sim(role="decode", instance="d0")
    body = {"prompt": "a b c", "max_tokens": 1, "min_tokens": 1, "stream": False,
            "kv_transfer_params": PROXY_PREFILL_PARAMS}
    async with http.post(f"{p.url}/v1/completions", json=body, headers={"X-Request-Id": "p-attempt"}) as r:
        kv = (await r.json())["kv_transfer_params"]
    (prec,) = p.state.request_ids
    assert kv["remote_request_id"] == prec.internal_id
    assert re.fullmatch("cmpl-p-attempt-0" + SUFFIX, kv["remote_request_id"])
    async with http.post(f"{d.url}/v1/completions", headers={"X-Request-Id": "d-attempt"},
                         json={"prompt": "a b c", "max_tokens": 2, "kv_transfer_params": kv}) as r:
        assert r.status == 200
        assert (await r.json())["id"] == "cmpl-d-attempt"
    (drec,) = d.state.request_ids
    assert drec.remote_request_id == prec.internal_id
