"""The proxy in front of the real engine simulator (ascend_runtime.sim), over real HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import specs_from_data
from ascend_runtime.proxy.server import start_proxy

sim_server = pytest.importorskip("ascend_runtime.sim.server")
sim_config = pytest.importorskip("ascend_runtime.perf.sim_config")


@pytest.fixture
async def sims() -> AsyncIterator[Any]:
    handles = []

    async def start(role: str, name: str) -> Any:
        h = await sim_server.start_simulator(sim_config.SimConfig(role=role, instance=name, port=0, kv_port=0,
                                                                  speedup=100.0, exit_on_fault=False))
        handles.append(h)
        return h

    yield start
    for h in handles:
        await h.stop()


async def test_pd_flow_against_simulators(sims, http):
    p = await sims("prefill", "sim-p0")
    d = await sims("decode", "sim-d0")
    specs = specs_from_data([{"name": "sim-p0", "role": "prefill", "url": p.url},
                             {"name": "sim-d0", "role": "decode", "url": d.url}])
    px = await start_proxy(ProxyConfig(port=0, instances=specs, health_interval_s=0))
    try:
        body = {"model": "deepseek-ai/DeepSeek-R1", "prompt": "one two three four", "max_tokens": 8,
                "stream": True, "ignore_eos": True}
        async with http.post(px.url + "/v1/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["x-prefill-instance"] == "sim-p0"
            assert resp.headers["x-decode-instance"] == "sim-d0"
            raw = await resp.read()
        events = [e for e in raw.decode().split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        text = "".join((json.loads(e[6:])["choices"] or [{}])[0].get("text") or "" for e in events[:-1])
        assert len(text.split()) == 8
        async with http.post(px.url + "/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                   "ignore_eos": True}) as resp:
            assert resp.status == 200, await resp.text()
            assert len((await resp.json())["choices"][0]["message"]["content"].split()) == 4
    finally:
        await px.stop()
