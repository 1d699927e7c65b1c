"""The P:D planner under rank serving, real HTTP against a proxy over stub engines whose instances are two DP
rank endpoints each: instances are counted, loads summed and idleness judged per engine instance, not per
rank endpoint; new instances are registered as one endpoint per rank and removed by the instance's name."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ascend_runtime.pdplanner.actuate import GroupMover, PlannerProxyAdmin
from ascend_runtime.pdplanner.actuate_local import LocalBackend
from ascend_runtime.pdplanner.observe import parse
from ascend_runtime.planner import load_plan
from ascend_runtime.proxy.server import ProxyHandle
from tests.proxy.rank_stack import start_rank_stack
from tests.proxy.stub_engine import StubHandle

TOKEN = "pl4nner-rank"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
INSTANCES = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}


@pytest.fixture
async def proxy() -> AsyncIterator[tuple[ProxyHandle, dict[str, StubHandle]]]:
    stack = await start_rank_stack(INSTANCES, TOKEN)
    try:
        yield stack.proxy, stack.stubs
    finally:
        await stack.stop()


async def _drain(session: aiohttp.ClientSession, url: str, name: str, drain: bool = True) -> None:
    async with session.post(url + "/admin/instances/drain", json={"name": name, "drain": drain}, headers=AUTH) as r:
        assert r.status == 200, await r.text()


async def _routable(session: aiohttp.ClientSession, url: str) -> dict[str, int]:
    async with session.get(url + "/metrics") as r:
        return parse(await r.text(), time.monotonic()).routable


def _mover(plan: Any, session: aiohttp.ClientSession, url: str, drain_timeout_s: float = 5.0) -> GroupMover:
    admin = PlannerProxyAdmin(session, TOKEN, static=[url])
    return GroupMover(plan, backend=None, proxy=admin, layout={}, endpoint=lambda n: f"http://{n}:1",  # type: ignore[arg-type]
                      drain_timeout_s=drain_timeout_s, poll_s=0.05)


async def test_routable_instances_count_engine_instances_not_ranks(proxy) -> None:
    handle, _ = proxy
    async with aiohttp.ClientSession() as s:
        assert await _routable(s, handle.url) == {"prefill": 1, "decode": 2}
        await _drain(s, handle.url, "decode-1-dp0")  # one rank of decode-1 still serves: the instance counts
        assert await _routable(s, handle.url) == {"prefill": 1, "decode": 2}
        await _drain(s, handle.url, "decode-0")
        assert await _routable(s, handle.url) == {"prefill": 1, "decode": 1}
        await _drain(s, handle.url, "decode-1-dp1")
        assert await _routable(s, handle.url) == {"prefill": 1, "decode": 0}


async def test_busy_and_idle_wait_sum_every_rank_of_an_instance(proxy) -> None:
    handle, _ = proxy
    plan = load_plan("local-rank")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
        await _drain(s, handle.url, "decode-1")
        await _drain(s, handle.url, "decode-0-dp0")

        async def slow_stream() -> None:  # on decode-0-dp1, the only decode rank left routable
            async with s.post(handle.url + "/v1/completions", json={"prompt": "x", "max_tokens": 30, "stream": True}) as r:
                assert r.headers["x-decode-instance"] == "decode-0-dp1"
                await r.read()

        task = asyncio.create_task(slow_stream())
        mover = _mover(plan, s, handle.url, drain_timeout_s=0.2)
        want = {"prefill-0": 0.0, "decode-0": 1.0, "decode-1": 0.0}  # once the prefill handed over
        for _ in range(100):
            busy = await mover.busy()
            if busy == want:
                break
            await asyncio.sleep(0.02)
        assert busy == want
        assert await mover._wait_idle(["decode-0"]) is False  # the stream on dp1 is still running
        await task
        assert await mover._wait_idle(["decode-0"]) is True


async def test_new_instances_are_added_per_rank_and_removed_by_instance(proxy) -> None:
    handle, _ = proxy
    plan = load_plan("local-rank")
    async with aiohttp.ClientSession() as s:
        mover = _mover(plan, s, handle.url)
        specs = mover._specs(["decode-1"])
        expected = [e for e in plan.endpoints() if e.get("instance") == "decode-1"]
        assert len(expected) == plan.instance("decode-1").dp and specs == expected
        await mover.proxy.remove(handle.url, ["decode-1"])  # the stubs' decode-1 ranks
        await mover.proxy.add(handle.url, specs)
        listing = await mover.proxy.listing(handle.url)
        assert sorted(n for n, v in listing.items() if v.get("instance") == "decode-1") == sorted(e["name"] for e in expected)
        await mover.proxy.remove(handle.url, ["decode-1"])
        assert not [n for n, v in (await mover.proxy.listing(handle.url)).items() if v.get("instance") == "decode-1"]


def test_local_instances_file_lists_each_rank_with_its_instance(tmp_path: Path) -> None:
    plan = load_plan("local-rank")
    backend = LocalBackend.__new__(LocalBackend)
    backend.plan, backend.state_dir = plan, tmp_path
    backend.running = lambda name: name != "decode-1"  # type: ignore[method-assign]
    backend.write_instances_file()
    written = json.loads((tmp_path / "instances.json").read_text())["instances"]
    assert written == [e for e in plan.endpoints() if e["instance"] != "decode-1"]
    local = load_plan("local")
    backend.plan = local
    backend.running = lambda name: True  # type: ignore[method-assign]
    backend.write_instances_file()
    assert json.loads((tmp_path / "instances.json").read_text())["instances"] == [
        {"name": i.name, "role": i.role, "url": i.api_url} for i in local.instances]
