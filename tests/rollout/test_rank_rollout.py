"""A rollout under rank serving, real HTTP: a proxy over stub engines whose instances are two DP rank endpoints
each. Rolling ``decode-0`` drains both its ranks, waits for a request in flight on either, replaces it (a
test double that records what the proxy showed then), post-checks every rank (``/health`` and a PD round
trip through it) and undrains both."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from ascend_runtime.faults.proxies import ProxyAdmin
from ascend_runtime.rollout.order import Target
from ascend_runtime.rollout.postcheck import EnginePostCheck
from ascend_runtime.rollout.steps import Rollout, RolloutOptions, endpoints_of, inflight_of
from tests.proxy.rank_stack import RankStack, start_rank_stack

TOKEN = "r0llout-rank"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RANKS = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}


def _target(stack: RankStack, instance: str) -> Target:
    """The instance as a rollout target (its URL: DP rank 0's, as the Plan's ``api_url``)."""
    return Target(instance, RANKS[instance], stack.stubs[f"{instance}-dp0"].url)


@pytest.fixture
async def stack() -> AsyncIterator[RankStack]:
    started = await start_rank_stack(RANKS, TOKEN)
    try:
        yield started
    finally:
        await started.stop()


class RecordingDriver:
    """Replaces nothing; records, at the moment it is asked to, what every replica shows of the target."""

    kind = "local"

    def __init__(self, admin: ProxyAdmin, replicas: list[str]) -> None:
        self.admin, self.replicas = admin, replicas
        self.seen: list[dict[str, tuple[bool, int]]] = []
        self.at: list[float] = []

    def describe(self, target: Target) -> str:
        return f"restart {target.name} (test double)"

    async def replace(self, target: Target) -> str:
        self.at.append(time.monotonic())
        for url in self.replicas:
            listing = await self.admin.listing(url)
            self.seen.append({s["name"]: (s["draining"], s["inflight"]) for s in endpoints_of(listing, target.name)})
        return "replaced (test double)"


async def _admin(session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any]) -> None:
    async with session.post(url + path, json=body, headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()


async def test_rollout_of_a_rank_instance_waits_on_every_rank_and_checks_every_rank(stack: RankStack) -> None:
    px = stack.proxy.url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        # a slow stream on decode-0's second rank: the one a wait that looked at one endpoint would miss
        await _admin(session, px, "/admin/instances/drain", {"name": "decode-1"})
        await _admin(session, px, "/admin/instances/drain", {"name": "decode-0-dp0"})
        ended: list[float] = []

        async def slow_stream() -> str:
            body = {"prompt": "hello", "max_tokens": 30, "stream": True}
            async with session.post(px + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                decode = resp.headers["x-decode-instance"]
                data = await resp.read()
            ended.append(time.monotonic())
            assert data.rstrip().endswith(b"data: [DONE]")
            return decode

        stream = asyncio.create_task(slow_stream())
        admin = ProxyAdmin(session, TOKEN, static=[px])
        for _ in range(100):
            if inflight_of(await admin.listing(px), "decode-0") == 1:
                break
            await asyncio.sleep(0.02)
        await _admin(session, px, "/admin/instances/drain", {"name": "decode-1", "drain": False})
        await _admin(session, px, "/admin/instances/drain", {"name": "decode-0-dp0", "drain": False})

        said: list[str] = []
        driver = RecordingDriver(admin, [px])
        rollout = Rollout([_target(stack, "decode-0")], [_target(stack, n) for n in RANKS], admin, driver,
                          EnginePostCheck(session, timeout_s=10.0),
                          RolloutOptions(drain_timeout_s=20.0, routable_timeout_s=10.0, poll_s=0.05), said.append)
        outcome = await rollout.run()
        assert outcome.ok, (outcome, said)
        assert await stream == "decode-0-dp1"

        assert outcome.done == ["decode-0"]
        assert any("waiting for 1 request(s) in flight" in line for line in said), said
        # replaced only once both ranks were drained and idle, after the stream on dp1 ended
        assert driver.seen == [{"decode-0-dp0": (True, 0), "decode-0-dp1": (True, 0)}]
        assert ended and ended[0] <= driver.at[0]
        # every rank post-checked: /health and a PD round trip through it
        check = next(line for line in said if "post-check:" in line)
        assert "decode-0-dp0: /health 200; PD round trip" in check and "decode-0-dp1: /health 200" in check, check
        assert "-> decode-0-dp0" in check and "-> decode-0-dp1" in check, check
        assert stack.stubs["decode-0-dp0"].engine.health_calls and stack.stubs["decode-0-dp1"].engine.health_calls
        assert not stack.stubs["decode-1-dp0"].engine.health_calls
        # undrained: both ranks take requests again
        listing = await admin.listing(px)
        assert all(s["routable"] and not s["draining"] for s in listing.values()), listing


async def test_preflight_knows_an_instance_by_its_ranks_and_sees_a_drained_rank(stack: RankStack) -> None:
    px = stack.proxy.url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        admin = ProxyAdmin(session, TOKEN, static=[px])
        await _admin(session, px, "/admin/instances/drain", {"name": "decode-0-dp1"})
        said: list[str] = []
        rollout = Rollout([_target(stack, "decode-0"), Target("decode-7", "decode", "http://127.0.0.1:9")],
                          [_target(stack, n) for n in RANKS], admin, RecordingDriver(admin, [px]),
                          EnginePostCheck(session), RolloutOptions(poll_s=0.05), said.append)
        outcome = await rollout.run()
        assert outcome.step == "preflight" and "does not route to decode-7" in outcome.reason, outcome
        rollout.targets = [_target(stack, "decode-0")]
        outcome = await rollout.run()
        assert outcome.step == "preflight" and "decode-0 already drained" in outcome.reason, outcome
