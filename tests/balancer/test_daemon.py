import asyncio
import json
import socket

import aiohttp
import numpy as np
from aiohttp import web

from ascend_runtime.balancer.apply import SimulatorApplier
from ascend_runtime.balancer.daemon import (
    BalancerConfig,
    BalancerDaemon,
    Instance,
    start_in_thread,
)
from ascend_runtime.balancer.expert_map import validate_map
from ascend_runtime.balancer.publish import FilePublisher
from ascend_runtime.balancer.sources import DirLoadSource, HttpLoadSource

from .fakesim import FakeSim


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def serve(app):
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def make_daemon(urls, tmp_path, dry_run=False, **kw):
    cfg = BalancerConfig(num_experts=32, ranks=4, slots=9, interval_s=0.01, dry_run=dry_run, **kw)
    instances = [Instance(f"d{i}", HttpLoadSource(f"d{i}", u), SimulatorApplier(f"d{i}", u)) for i, u in enumerate(urls)]
    return BalancerDaemon(cfg, instances, FilePublisher(tmp_path / "map.json", 32, 4, 9))


async def test_daemon_balances_two_simulators_over_http(tmp_path):
    sims = [FakeSim(seed=1), FakeSim(seed=1)]
    servers = [await serve(s.app()) for s in sims]
    try:
        before = [s.balancedness() for s in sims]
        step_before = [np.mean(s.step_ms or [0]) for s in sims]
        for s in sims:
            s.step(10)
        step_before = [np.mean(s.step_ms) for s in sims]
        daemon = make_daemon([u for _, u in servers], tmp_path)
        await daemon.run(max_cycles=3)
        outcomes = [h["outcome"] for h in daemon.history]
        assert "published" in outcomes
        doc = json.loads((tmp_path / "map.json").read_text())
        assert validate_map(doc, 32, 4, 9) == []
        for s, b0, t0 in zip(sims, before, step_before):
            assert s.applied >= 1
            s.step(10)
            assert s.balancedness() > b0 + 0.1
            assert np.mean(s.step_ms) < t0
        text = __import__("prometheus_client").generate_latest(daemon.metrics.registry).decode()
        assert 'ascend_balancer_balancedness{phase="after"}' in text
        assert "ascend_balancer_last_rebalance_timestamp_seconds" in text
    finally:
        for runner, _ in servers:
            await runner.cleanup()


async def test_dry_run_never_publishes_or_applies(tmp_path):
    sim = FakeSim(seed=2)
    runner, url = await serve(sim.app())
    try:
        daemon = make_daemon([url], tmp_path, dry_run=True)
        await daemon.run(max_cycles=3)
        assert daemon.history[-1]["outcome"] == "dry_run"
        assert not (tmp_path / "map.json").exists() and sim.applied == 0
    finally:
        await runner.cleanup()


async def test_failed_apply_stops_rollout_and_is_counted(tmp_path):
    sims = [FakeSim(seed=3, reject_maps=True), FakeSim(seed=3)]
    servers = [await serve(s.app()) for s in sims]
    try:
        daemon = make_daemon([u for _, u in servers], tmp_path)
        await daemon.run(max_cycles=2)
        assert sims[1].applied == 0  # one instance at a time: stopped at the first failure
        assert daemon.metrics.apply_failures.labels("d0")._value.get() >= 1
    finally:
        for runner, _ in servers:
            await runner.cleanup()


def test_metrics_port_and_thread_handle(tmp_path):
    port = free_port()
    daemon = BalancerDaemon(
        BalancerConfig(num_experts=32, ranks=4, slots=9, interval_s=0.05, dry_run=True, metrics_port=port),
        [Instance("d0", DirLoadSource("d0", tmp_path), SimulatorApplier("d0", "http://127.0.0.1:1"))], None,
    )
    handle = start_in_thread(daemon)
    try:
        async def fetch():
            async with aiohttp.ClientSession() as s:
                for _ in range(100):
                    try:
                        async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                            return await r.text()
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.05)
        text = asyncio.run(fetch())
        assert "ascend_balancer_dry_run 1.0" in text
    finally:
        handle.stop()
    assert not handle.thread.is_alive()


def test_dir_source_returns_deltas_and_handles_restart(tmp_path):
    def dump(rank, seq, arr):
        (tmp_path / f"rank_{rank}.json").write_text(json.dumps(
            {"rank": rank, "seq": seq, "layers": 2, "experts": 3, "expert_load": arr}))
    src = DirLoadSource("d", tmp_path)
    dump(0, 1, [[1, 2, 3], [0, 0, 6]])
    dump(1, 1, [[1, 0, 0], [1, 1, 1]])
    assert src.read().expert_load.tolist() == [[2, 2, 3], [1, 1, 7]]
    dump(0, 2, [[2, 2, 3], [0, 0, 6]])
    assert src.read().expert_load.tolist() == [[1, 0, 0], [0, 0, 0]]
    dump(1, 1, [[5, 5, 5], [1, 1, 1]])  # counts went down... no: same seq is ignored
    assert src.read() is None
    dump(1, 0, [[1, 0, 0], [0, 0, 0]])  # restarted rank: counted in full
    assert src.read().expert_load.tolist() == [[1, 0, 0], [0, 0, 0]]
    (tmp_path / "rank_2.json").write_text("{partial")
    assert src.read() is None


async def test_the_cycle_records_kept_are_bounded(tmp_path, monkeypatch):
    import ascend_runtime.balancer.daemon as daemon_mod

    monkeypatch.setattr(daemon_mod, "HISTORY_CYCLES", 4)
    sim = FakeSim(seed=3)
    runner, url = await serve(sim.app())
    try:
        daemon = make_daemon([url], tmp_path, dry_run=True)
        await daemon.run(max_cycles=7)
        assert daemon.cycles == 7  # every cycle counted
        assert len(daemon.history) == 4  # only the last records kept: a months-long daemon does not grow
        assert daemon.history[-1]["outcome"] == "dry_run"
    finally:
        await runner.cleanup()
