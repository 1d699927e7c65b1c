"""Fixtures: stub engines and proxies started in the test's event loop, on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import InstanceSpec
from ascend_runtime.proxy.server import ProxyHandle, start_proxy
from tests.proxy.stub_engine import StubHandle, start_stub


@pytest.fixture
async def stubs() -> AsyncIterator[Any]:
    started: list[StubHandle] = []

    async def make(role: str, name: str, **kwargs: Any) -> StubHandle:
        handle = await start_stub(role, name, **kwargs)
        started.append(handle)
        return handle

    yield make
    for h in started:
        await h.stop()


@pytest.fixture
async def proxy() -> AsyncIterator[Any]:
    started: list[ProxyHandle] = []

    async def make(*handles: StubHandle, extra: list[InstanceSpec] | None = None, **kwargs: Any) -> ProxyHandle:
        specs = [InstanceSpec(name=h.engine.name, role=h.engine.role, url=h.url) for h in handles]  # type: ignore[arg-type]
        cfg = ProxyConfig(host="127.0.0.1", port=0, instances=specs + (extra or []),
                          **{"health_interval_s": 0, **kwargs})
        handle = await start_proxy(cfg)
        started.append(handle)
        return handle

    yield make
    for h in started:
        await h.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
