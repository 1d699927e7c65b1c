"""Expert load and expert map endpoints; placement changes decode step time."""

from __future__ import annotations

import asyncio
import copy

import numpy as np

from ascend_runtime.sim.experts import ExpertMap, balanced_map, skewed_map


async def run_batch(http, url: str, n: int = 256, tokens: int = 12) -> None:
    async def one() -> None:
        body = {"prompt": "a b c d e f g h", "max_tokens": tokens, "ignore_eos": True}
        async with http.post(f"{url}/v1/completions", json=body) as r:
            assert r.status == 200

    await asyncio.gather(*(one() for _ in range(n)))


async def stats(http, url: str) -> dict:
    async with http.get(f"{url}/admin/stats") as r:
        return await r.json()


async def mean_step_ms(http, url: str) -> float:
    before = await stats(http, url)
    await run_batch(http, url)
    after = await stats(http, url)
    return (after["modelled_seconds"] - before["modelled_seconds"]) / (after["steps"] - before["steps"]) * 1000


async def test_expert_load_since(sim, http):
    h = await sim()
    async with http.get(f"{h.url}/admin/expert_load?since=0") as r:
        first = await r.json()
    await run_batch(http, h.url, n=8, tokens=3)
    async with http.get(f"{h.url}/admin/expert_load?since={first['seq']}") as r:
        load = await r.json()
    assert (load["layers"], load["experts"], load["ranks"]) == (58, 256, 32)
    e, rk = np.array(load["expert_load"]), np.array(load["rank_load"])
    assert e.shape == (58, 256) and rk.shape == (58, 32)
    assert load["seq"] > first["seq"]
    # per layer, expert and rank loads both sum to the step tokens x top-8 routed
    assert (e.sum(axis=1) == rk.sum(axis=1)).all() and e.sum() > 0
    async with http.get(f"{h.url}/admin/expert_load?since={load['seq']}") as r:
        again = await r.json()
    assert np.array(again["expert_load"]).sum() == 0
    async with http.get(f"{h.url}/admin/expert_load?since=999999") as r:
        assert r.status == 400


async def test_expert_map_validation(sim, http):
    h = await sim(redundant_experts=32)  # 9 slots per rank
    async with http.get(f"{h.url}/admin/expert_map") as r:
        good = await r.json()
    assert good["moe_layer_count"] == 58 and len(good["layer_list"][0]["device_list"][0]["device_expert"]) == 9
    async with http.post(f"{h.url}/admin/expert_map", json=good) as r:
        assert r.status == 200 and (await r.json())["applied"] is True

    def broken(fn):
        doc = copy.deepcopy(good)
        fn(doc)
        return doc

    cases = {
        "moe_layer_count": broken(lambda d: d.update(moe_layer_count=57)),
        "device_count": broken(lambda d: d["layer_list"][3].update(device_count=16)),
        "slots": broken(lambda d: d["layer_list"][0]["device_list"][1]["device_expert"].pop()),
        "missing": broken(lambda d: d["layer_list"][5]["device_list"][31].update(device_expert=[0] * 9)),
        "out of range": broken(lambda d: d["layer_list"][7]["device_list"][2]["device_expert"].__setitem__(0, 256)),
    }
    for expect, doc in cases.items():
        async with http.post(f"{h.url}/admin/expert_map", json=doc) as r:
            assert r.status == 400, expect
            assert expect in (await r.json())["error"]["message"], expect
    async with http.get(f"{h.url}/admin/expert_map") as r:
        assert await r.json() == good  # rejected maps leave the placement alone


async def test_balanced_map_lowers_decode_step_time(sim, http):
    h = await sim(speedup=200.0, seed=3)
    await run_batch(http, h.url, n=64, tokens=4)
    async with http.get(f"{h.url}/admin/expert_load?since=0") as r:
        load = np.array((await r.json())["expert_load"])
    skewed = skewed_map(load, 32, 8).to_vllm_json()
    balanced = balanced_map(load, 32, 8).to_vllm_json()
    async with http.post(f"{h.url}/admin/expert_map", json=skewed) as r:
        b_skewed = (await r.json())["balancedness"]
    skewed_ms = await mean_step_ms(http, h.url)
    recent_skewed = (await stats(http, h.url))["balancedness"]
    async with http.post(f"{h.url}/admin/expert_map", json=balanced) as r:
        b_balanced = (await r.json())["balancedness"]
    balanced_ms = await mean_step_ms(http, h.url)
    assert b_balanced > 0.8 > 0.4 > b_skewed
    assert balanced_ms < 0.75 * skewed_ms, (balanced_ms, skewed_ms)
    assert (await stats(http, h.url))["balancedness"] > recent_skewed


def test_default_map_round_trips_through_validation():
    m = ExpertMap.default(58, 256, 16, 17)
    again = ExpertMap.from_vllm_json(m.to_vllm_json(), 58, 256, 16, 17)
    assert (again.slots == m.slots).all()
    loads = np.ones((58, 256), dtype=np.int64) * 3
    rank_load, _ = m.rank_loads(loads)
    assert (rank_load.sum(axis=1) == 768).all()
