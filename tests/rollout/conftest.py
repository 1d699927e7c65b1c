"""Fixtures of the rollout tests: a running two-per-role local stack, and a load through its proxy.

:class:`Load` is the load generator's own request (``ascend_runtime.checks.loadgen.stream_request``:
streaming completions, failing on a non-200 status, an SSE error event, a stream without
``[DONE]`` or a broken connection) sent by ``workers`` clients back to back until stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from ascend_runtime.checks.loadgen import stream_request
from ascend_runtime.checks.metrics import RequestResult
from ascend_runtime.checks.prompts import request_body
from ascend_runtime.local.processes import is_alive
from ascend_runtime.local.state import StackState
from tests.local.conftest import cli, kill_recorded

from .stack import two_per_role_stacks

MODEL = "deepseek-ai/DeepSeek-R1"


@dataclass
class RunningStack:
    """A local stack started by ``up --detach`` from a copy of stacks/."""

    stacks: Path
    state_dir: Path

    @property
    def state(self) -> StackState:
        state = StackState.load(self.state_dir)
        assert state is not None, f"no state in {self.state_dir}"
        return state

    def pids(self) -> dict[str, int]:
        """Simulator name -> pid, as state.json records it."""
        return {p.name: p.pid for p in self.state.processes if p.kind == "simulator"}

    def token(self, name: str) -> str:
        return (self.state_dir / name).read_text().strip()


@pytest.fixture(scope="module")
def running_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    """One stack for the module's tests (starting one takes seconds); each test starts from what it finds."""
    tmp_path = tmp_path_factory.mktemp("rollout-stack")
    stacks = two_per_role_stacks(tmp_path)
    if stacks is None:
        pytest.skip("no free block of ports for a copy of the local stack")
    state_dir = tmp_path / "state"
    up = cli("up", "--stack", "local", "--stacks-dir", str(stacks), "--state-dir", str(state_dir), "--detach",
             "--no-checks")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield RunningStack(stacks, state_dir)
    finally:
        state = StackState.load(state_dir)
        cli("down", "--stack", "local", "--state-dir", str(state_dir))
        kill_recorded(state_dir)
        for record in state.processes if state else []:
            if is_alive(record.pid):
                os.killpg(record.pid, signal.SIGKILL)


@dataclass
class Load:
    """``workers`` clients, each sending one streaming completion after the other through ``proxy_url``."""

    proxy_url: str
    workers: int = 12
    max_tokens: int = 48
    results: list[RequestResult] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        body = json.dumps(request_body("completions", MODEL, "one two three four five six seven eight",
                                       self.max_tokens, stream=True)).encode()
        self._tasks = [asyncio.create_task(self._worker(body)) for _ in range(self.workers)]

    async def _worker(self, body: bytes) -> None:
        assert self._session is not None
        while not self._stop.is_set():
            self.results.append(await stream_request(self._session, self.proxy_url + "/v1/completions", body))

    async def stop(self) -> list[RequestResult]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        if self._session is not None:
            await self._session.close()
        return self.results

    @property
    def failures(self) -> list[RequestResult]:
        return [r for r in self.results if not r.success]


async def sim_stats(url: str, token: str) -> dict:
    """A simulator's ``GET /admin/stats``."""
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/admin/stats", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()


async def undrain_all(proxy_url: str, token: str) -> None:
    """Undrain every instance (a test starting after another that failed half way)."""
    async with aiohttp.ClientSession() as session:
        for name in await proxy_listing(proxy_url, token):
            async with session.post(proxy_url + "/admin/instances/drain", json={"name": name, "drain": False},
                                    headers={"Authorization": f"Bearer {token}"}) as resp:
                assert resp.status == 200, await resp.text()


async def proxy_listing(proxy_url: str, token: str) -> dict[str, dict]:
    """The proxy's ``GET /admin/instances``: name -> snapshot."""
    async with aiohttp.ClientSession() as session:
        async with session.get(proxy_url + "/admin/instances", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200, await resp.text()
            return {i["name"]: i for i in (await resp.json())["instances"]}
