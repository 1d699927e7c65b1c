"""End to end against the real decode simulator (ascend_runtime.sim.server), over HTTP on loopback.

Step time is compared under identical load: the same requests (same prompt,
``max_tokens``, ``ignore_eos``) before and after balancing, and only over
decode-only steps of batch sizes seen in both phases (the simulator's
``decode_steps_by_batch``), each batch size weighted by the smaller step count.
The figures are the simulator's *modelled* step times, so a slow or loaded
machine changes how many steps of each size happen, not what a step costs.
"""

import asyncio
import inspect

import aiohttp
import pytest

import ascend_runtime.sim.server as sim_server
from ascend_runtime.balancer.apply import SimulatorApplier  # noqa: E402
from ascend_runtime.balancer.daemon import BalancerConfig, BalancerDaemon, Instance  # noqa: E402
from ascend_runtime.balancer.expert_map import map_to_placement  # noqa: E402
from ascend_runtime.balancer.publish import FilePublisher  # noqa: E402
from ascend_runtime.balancer.sources import HttpLoadSource  # noqa: E402
from ascend_runtime.perf.sim_config import SimConfig

from .test_daemon import free_port  # noqa: E402

pytestmark = pytest.mark.slow

REQUESTS = 256  # concurrent requests per instance per drive
ADMIN_TOKEN = "e2e-sim-admin-token"  # the simulators' /admin API; the session below sends it
MAX_TOKENS = 24


async def _maybe(x):
    return await x if inspect.isawaitable(x) else x


def batch_delta(a: dict, b: dict) -> dict[int, tuple[int, float, float]]:
    """Per batch size: (steps, mean step ms, mean MoE ms) of decode-only steps between two stats snapshots."""
    out = {}
    for t, v in b["decode_steps_by_batch"].items():
        u = a["decode_steps_by_batch"].get(t, {"steps": 0, "mean_step_ms": 0.0, "mean_moe_ms": 0.0})
        n = v["steps"] - u["steps"]
        if n > 0:
            out[int(t)] = (n, (v["steps"] * v["mean_step_ms"] - u["steps"] * u["mean_step_ms"]) / n,
                           (v["steps"] * v["mean_moe_ms"] - u["steps"] * u["mean_moe_ms"]) / n)
    return out


def same_mix(before: dict, after: dict, part: int) -> tuple[float, float, int]:
    """Modelled time (ms) of the common step mix under each placement: part 1 = whole step, 2 = MoE."""
    common = before.keys() & after.keys()
    w = {t: min(before[t][0], after[t][0]) for t in common}
    tb = sum(w[t] * before[t][part] for t in common)
    ta = sum(w[t] * after[t][part] for t in common)
    return tb, ta, sum(w.values())


def test_same_mix_compares_only_common_batch_sizes():
    before = {64: (10, 20.0, 12.0), 32: (3, 15.0, 8.0)}
    after = {64: (4, 19.0, 11.0), 16: (9, 1.0, 1.0)}
    assert same_mix(before, after, 1) == (80.0, 76.0, 4)
    assert same_mix(before, after, 2) == (48.0, 44.0, 4)


async def test_daemon_raises_balancedness_and_lowers_step_time(tmp_path):
    ports = [free_port(), free_port()]
    servers = []
    for i, port in enumerate(ports):
        cfg = SimConfig(role="decode", instance=f"decode-{i}", host="127.0.0.1", port=port, kv_port=0,
                        npus=32, dp=32, tp=1, ep=32, redundant_experts=32, speedup=5.0, seed=i,
                        admin_token=ADMIN_TOKEN)
        servers.append(await _maybe(sim_server.start_simulator(cfg)))
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as s:
            async def stats(u):
                async with s.get(f"{u}/admin/stats") as r:
                    return await r.json()

            async def one(u):
                body = {"model": "deepseek-ai/DeepSeek-R1", "prompt": "a b c d e f g h",
                        "max_tokens": MAX_TOKENS, "ignore_eos": True}
                async with s.post(f"{u}/v1/completions", json=body) as r:
                    assert r.status == 200
                    await r.read()

            async def drive():  # the same fixed load every time
                await asyncio.gather(*[one(u) for u in urls for _ in range(REQUESTS)])

            async def measure():
                a = [await stats(u) for u in urls]
                await drive()
                b = [await stats(u) for u in urls]
                return [batch_delta(x, y) for x, y in zip(a, b)], b

            async with s.get(f"{urls[0]}/admin/expert_map") as r:
                current = await r.json()
            current = current.get("expert_map", current)
            _, ranks, slots = map_to_placement(current, 256, allow_duplicates=True)
            mix_before, st_before = await measure()
            daemon = BalancerDaemon(
                BalancerConfig(num_experts=256, ranks=ranks, slots=slots, interval_s=0.2),
                [Instance(f"d{i}", HttpLoadSource(f"d{i}", u), SimulatorApplier(f"d{i}", u)) for i, u in enumerate(urls)],
                FilePublisher(tmp_path / "map.json", 256, ranks, slots),
            )
            daemon.adopt(current)
            for _ in range(3):
                await drive()
                await daemon.run_cycle(s)
            assert any(h["outcome"] == "published" for h in daemon.history)
            mix_after, st_after = await measure()
        for i in range(len(urls)):
            assert st_after[i]["balancedness"] > st_before[i]["balancedness"] + 0.05, (st_before[i], st_after[i])
            step_b, step_a, n = same_mix(mix_before[i], mix_after[i], 1)
            moe_b, moe_a, _ = same_mix(mix_before[i], mix_after[i], 2)
            assert n >= 10, (n, mix_before[i], mix_after[i])  # enough identical steps to compare
            # identical batches, modelled time: the balanced placement must be faster, step and MoE part
            assert step_a < step_b * 0.99, (i, step_b / n, step_a / n)
            assert moe_a < moe_b * 0.98, (i, moe_b / n, moe_a / n)
    finally:
        for srv in servers:
            for name in ("stop", "close", "shutdown", "cleanup"):
                if hasattr(srv, name):
                    await _maybe(getattr(srv, name)())
                    break
