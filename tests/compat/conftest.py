"""Targets for the compatibility suite: a simulator alone, or a prefill + decode simulator behind the proxy.

Everything runs in-process on 127.0.0.1 with free ports (as tests/sim/conftest.py and
tests/proxy/test_with_simulator.py start them), and is driven with the official ``openai`` SDK.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest

from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import specs_from_data
from ascend_runtime.proxy.server import ProxyHandle, start_proxy
from ascend_runtime.sim.server import SimHandle, start_simulator

MODEL = "deepseek-ai/DeepSeek-R1"


@dataclass
class Target:
    """Where the client sends requests (``url``) and the simulators behind it."""

    kind: str
    url: str
    sims: list[SimHandle] = field(default_factory=list)
    proxy: ProxyHandle | None = None

    async def stop(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        for h in self.sims:
            await h.stop()


async def _sim(role: str, name: str, **kw: Any) -> SimHandle:
    return await start_simulator(SimConfig(role=role, instance=name, port=0, kv_port=0, speedup=100.0,
                                           exit_on_fault=False, **kw))


async def start_target(kind: str) -> Target:
    if kind == "direct":
        d = await _sim("decode", "d0")
        return Target(kind, d.url, [d])
    p, d = await _sim("prefill", "p0"), await _sim("decode", "d0")
    specs = specs_from_data([{"name": "p0", "role": "prefill", "url": p.url}, {"name": "d0", "role": "decode",
                                                                                "url": d.url}])
    px = await start_proxy(ProxyConfig(port=0, instances=specs, health_interval_s=0))
    return Target(kind, px.url, [p, d], px)


@pytest.fixture(params=["direct", "pd"])
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    """A simulator (``direct``) or prefill + decode simulators behind the PD proxy (``pd``)."""
    t = await start_target(request.param)
    yield t
    await t.stop()


@pytest.fixture
async def client(target: Target) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official SDK, pointed at the target; no retries, so every answer is the first one."""
    c = openai.AsyncOpenAI(base_url=target.url + "/v1", api_key="EMPTY", max_retries=0, timeout=30.0)
    yield c
    await c.close()
