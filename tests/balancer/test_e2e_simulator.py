"""End to end against the real decode simulator (ascend_runtime.sim.server), over HTTP on loopback."""

import asyncio
import inspect

import aiohttp
import pytest

sim_server = pytest.importorskip(
    "ascend_runtime.sim.server", reason="simulator module ascend_runtime.sim.server not available yet (issue 6)"
)
from ascend_runtime.sim.config import SimConfig  # noqa: E402

from ascend_runtime.balancer.apply import SimulatorApplier  # noqa: E402
from ascend_runtime.balancer.daemon import BalancerConfig, BalancerDaemon, Instance  # noqa: E402
from ascend_runtime.balancer.expert_map import map_to_placement  # noqa: E402
from ascend_runtime.balancer.publish import FilePublisher  # noqa: E402
from ascend_runtime.balancer.sources import HttpLoadSource  # noqa: E402

from .test_daemon import free_port  # noqa: E402

pytestmark = pytest.mark.slow


async def _maybe(x):
    return await x if inspect.isawaitable(x) else x


async def test_daemon_raises_balancedness_and_lowers_step_time(tmp_path):
    ports = [free_port(), free_port()]
    servers = []
    for i, port in enumerate(ports):
        cfg = SimConfig(role="decode", instance=f"decode-{i}", host="127.0.0.1", port=port, kv_port=0,
                        npus=32, dp=32, tp=1, ep=32, redundant_experts=32, speedup=50.0, seed=i)
        servers.append(await _maybe(sim_server.start_simulator(cfg)))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        async with aiohttp.ClientSession() as s:
            async def stats(u):
                async with s.get(f"{u}/admin/stats") as r:
                    return await r.json()
            async with s.get(f"{urls[0]}/admin/expert_map") as r:
                current = await r.json()
            current = current.get("expert_map", current)
            _, ranks, slots = map_to_placement(current, 256, allow_duplicates=True)
            # drive some decode load so that steps happen
            async def drive():
                body = {"model": "deepseek-ai/DeepSeek-R1", "prompt": "x" * 64, "max_tokens": 24, "ignore_eos": True}
                await asyncio.gather(*[s.post(f"{u}/v1/completions", json=body) for u in urls for _ in range(512)])
            def phase(a, b):  # mean modelled step time between two /admin/stats snapshots (cumulative means)
                return (b["steps"] * b["mean_step_ms"] - a["steps"] * a["mean_step_ms"]) / max(b["steps"] - a["steps"], 1)

            s0 = [await stats(u) for u in urls]
            await drive()
            before = [await stats(u) for u in urls]
            step_before = [phase(a, b) for a, b in zip(s0, before)]
            daemon = BalancerDaemon(
                BalancerConfig(num_experts=256, ranks=ranks, slots=slots, interval_s=0.2),
                [Instance(f"d{i}", HttpLoadSource(f"d{i}", u), SimulatorApplier(f"d{i}", u)) for i, u in enumerate(urls)],
                FilePublisher(tmp_path / "map.json", 256, ranks, slots),
            )
            daemon.adopt(current)
            for _ in range(4):
                await drive()
                await daemon.run_cycle(s)
            assert any(h["outcome"] == "published" for h in daemon.history)
            s1 = [await stats(u) for u in urls]
            await drive()
            after = [await stats(u) for u in urls]
            step_after = [phase(a, b) for a, b in zip(s1, after)]
        for b, a, tb, ta in zip(before, after, step_before, step_after):
            assert a["balancedness"] > b["balancedness"]
            # Per-phase step time in the simulator is dominated by batch composition at this scale; the
            # MoE term it models is small, so only guard against a regression here (the strict
            # step-time check runs against tests/balancer/fakesim.py in test_daemon.py). See docs/balancer.md.
            assert ta < tb * 1.05
    finally:
        for srv in servers:
            for name in ("stop", "close", "shutdown", "cleanup"):
                if hasattr(srv, name):
                    await _maybe(getattr(srv, name)())
                    break
