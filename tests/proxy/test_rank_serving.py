"""Rank serving through the admin API, real HTTP against stub engines: each DP rank is an endpoint of its own
(``<instance>-dp<rank>``, ``instance`` set); an instance's name drains, migrates and removes all its ranks,
a rank's name only that rank; the listing and the metrics show each rank with its instance."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from ascend_runtime.proxy.instances import InstanceSpec
from ascend_runtime.proxy.workers import merge_expositions

TOKEN = "r4nk-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PREFILL = ("prefill-0-dp0", "prefill-0-dp1")
DECODE0 = ("decode-0-dp0", "decode-0-dp1")
DECODE1 = ("decode-1-dp0", "decode-1-dp1")


def _instance_of(name: str) -> str:
    return name.rsplit("-dp", 1)[0]


async def _rank_proxy(stubs: Any, proxy: Any, **stub_kwargs: Any) -> Any:
    """A proxy over one prefill instance and two decode instances, two rank endpoints each."""
    specs = []
    for name in (*PREFILL, *DECODE0, *DECODE1):
        role = "prefill" if name.startswith("prefill") else "decode"
        handle = await stubs(role, name, **(stub_kwargs if role == "decode" else {}))
        specs.append(InstanceSpec(name=name, role=role, url=handle.url, instance=_instance_of(name)))  # type: ignore[arg-type]
    return await proxy(extra=specs, admin_token=TOKEN)


async def _post(http: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    async with http.post(url + path, json=body, headers=AUTH) as resp:
        assert resp.status == status, await resp.text()
        return await resp.json()


async def _listing(http: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    async with http.get(url + "/admin/instances", headers=AUTH) as resp:
        assert resp.status == 200
        return {i["name"]: i for i in (await resp.json())["instances"]}


async def _decodes(http: aiohttp.ClientSession, url: str, n: int) -> list[str]:
    """The decode endpoint of each of ``n`` completions sent one after the other."""
    out = []
    for _ in range(n):
        async with http.post(url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}) as resp:
            assert resp.status == 200, await resp.text()
            out.append(resp.headers["x-decode-instance"])
    return out


async def test_listing_shows_each_rank_with_its_instance(stubs, proxy, http):
    px = await _rank_proxy(stubs, proxy)
    listing = await _listing(http, px.url)
    assert {n: i.get("instance") for n, i in listing.items()} == {n: _instance_of(n) for n in (*PREFILL, *DECODE0, *DECODE1)}


async def test_drain_by_instance_drains_every_rank_and_undrain_restores(stubs, proxy, http):
    px = await _rank_proxy(stubs, proxy)
    answer = await _post(http, px.url, "/admin/instances/drain", {"name": "decode-0"})
    assert answer["drained"] == "decode-0"
    assert answer["endpoints"] == list(DECODE0)
    listing = {i["name"]: i for i in answer["instances"]}
    assert {n for n, i in listing.items() if i["draining"]} == set(DECODE0)
    assert set(await _decodes(http, px.url, 8)) <= set(DECODE1)

    answer = await _post(http, px.url, "/admin/instances/drain", {"name": "decode-0", "drain": False})
    assert answer["undrained"] == "decode-0" and answer["endpoints"] == list(DECODE0)
    listing = await _listing(http, px.url)
    assert not any(i["draining"] for i in listing.values())
    assert set(await _decodes(http, px.url, 12)) & set(DECODE0)  # ties rotate over all four ranks


async def test_drain_by_rank_name_drains_only_that_rank(stubs, proxy, http):
    px = await _rank_proxy(stubs, proxy)
    answer = await _post(http, px.url, "/admin/instances/drain", {"name": "decode-0-dp1"})
    assert answer["drained"] == "decode-0-dp1" and answer["endpoints"] == ["decode-0-dp1"]
    listing = await _listing(http, px.url)
    assert {n for n, i in listing.items() if i["draining"]} == {"decode-0-dp1"}
    seen = set(await _decodes(http, px.url, 12))
    assert "decode-0-dp1" not in seen and "decode-0-dp0" in seen


async def test_unknown_name_is_404_naming_it_and_changes_nothing(stubs, proxy, http):
    px = await _rank_proxy(stubs, proxy)
    answer = await _post(http, px.url, "/admin/instances/drain", {"name": "decode-9"}, status=404)
    assert "decode-9" in answer["error"]["message"]
    answer = await _post(http, px.url, "/admin/instances/remove", {"names": ["decode-1", "decode-9"]}, status=404)
    assert "decode-9" in answer["error"]["message"]
    listing = await _listing(http, px.url)
    assert len(listing) == 6 and not any(i["draining"] for i in listing.values())


async def test_remove_by_instance_removes_every_rank(stubs, proxy, http):
    px = await _rank_proxy(stubs, proxy)
    answer = await _post(http, px.url, "/admin/instances/remove", {"name": "decode-1"})
    assert answer["removed"] == ["decode-1"] and answer["endpoints"] == list(DECODE1)
    assert set(await _listing(http, px.url)) == {*PREFILL, *DECODE0}
    assert set(await _decodes(http, px.url, 6)) <= set(DECODE0)


async def test_drain_with_migrate_by_instance_moves_the_streams_of_every_rank(stubs, proxy, http):
    """A slow stream on each decode-0 rank; draining decode-0 with migrate moves both (to decode-1's ranks)."""
    px = await _rank_proxy(stubs, proxy, token_interval_s=0.05)
    await _post(http, px.url, "/admin/instances/drain", {"name": "decode-1"})  # the streams start on decode-0
    started: list[str] = []

    async def stream() -> bytes:
        body = {"prompt": "tell me", "max_tokens": 60, "stream": True}
        async with http.post(px.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            started.append(resp.headers["x-decode-instance"])
            return await resp.read()

    tasks = [asyncio.create_task(stream()) for _ in range(2)]
    for _ in range(100):
        listing = await _listing(http, px.url)
        if len(started) == 2 and all(listing[n]["active_seqs"] == 1 for n in DECODE0):
            break
        await asyncio.sleep(0.05)
    assert sorted(started) == list(DECODE0)
    await _post(http, px.url, "/admin/instances/drain", {"name": "decode-1", "drain": False})
    answer = await _post(http, px.url, "/admin/instances/drain", {"name": "decode-0", "migrate": True})
    assert answer["endpoints"] == list(DECODE0)
    assert answer["migrating"] == 2
    assert all(answer_i["evacuating"] for answer_i in answer["instances"] if answer_i["name"] in DECODE0)
    bodies = await asyncio.gather(*tasks)
    assert all(b.rstrip().endswith(b"data: [DONE]") for b in bodies), bodies


async def test_metrics_label_each_rank_and_map_it_to_its_instance(stubs, proxy, http):
    px = await _rank_proxy(stubs, proxy)
    await _decodes(http, px.url, 4)
    async with http.get(px.url + "/metrics") as resp:
        text = await resp.text()
    for name in (*PREFILL, *DECODE0, *DECODE1):
        role = "prefill" if name.startswith("prefill") else "decode"
        assert f'ascend_proxy_instance_routable{{instance="{name}",role="{role}"}} 1.0' in text, name
        assert (f'ascend_proxy_rank_endpoint{{engine_instance="{_instance_of(name)}",instance="{name}",'
                f'role="{role}"}} 1.0') in text, name
    # two workers' expositions merge to one membership series each, not a sum
    merged = merge_expositions({0: text.encode(), 1: text.encode()}).decode()
    assert 'ascend_proxy_rank_endpoint{engine_instance="decode-0",instance="decode-0-dp1",role="decode"} 1.0' in merged


async def test_instance_serving_answers_and_metrics_keep_their_shape(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d0 = await stubs("decode", "d0")
    d1 = await stubs("decode", "d1")
    px = await proxy(p, d0, d1, admin_token=TOKEN)
    answer = await _post(http, px.url, "/admin/instances/drain", {"name": "d0", "migrate": True})
    assert list(answer)[:3] == ["drained", "migrating", "instances"] and "endpoints" not in answer
    assert all("instance" not in i for i in answer["instances"])
    answer = await _post(http, px.url, "/admin/instances/remove", {"name": "d1"})
    assert list(answer)[:2] == ["removed", "instances"] and "endpoints" not in answer
    async with http.get(px.url + "/metrics") as resp:
        assert "ascend_proxy_rank_endpoint" not in await resp.text()
