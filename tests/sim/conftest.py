"""Fixtures: in-process simulators on 127.0.0.1 with free ports."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.sim.server import SimHandle, start_simulator

Starter = Callable[..., Awaitable[SimHandle]]
#: Admin bearer token of the fixtures' simulators; the ``http`` session sends it.
ADMIN_TOKEN = "sim-test-admin-token"


@pytest.fixture
async def sim() -> AsyncIterator[Starter]:
    """Start simulators with SimConfig overrides; all are stopped at the end."""
    handles: list[SimHandle] = []

    async def start(**overrides: Any) -> SimHandle:
        fields: dict[str, Any] = dict(role="decode", instance=f"sim{len(handles)}", port=0, kv_port=0, speedup=100.0,
                                      exit_on_fault=False, admin_token=ADMIN_TOKEN)
        fields.update(overrides)
        h = await start_simulator(SimConfig(**fields))
        handles.append(h)
        return h

    yield start
    for h in handles:
        await h.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session with no connection limit that authenticates to the simulators' admin API."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as s:
        yield s
