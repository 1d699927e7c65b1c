"""`balance record`: running instances' expert load written as the dumps `balance evaluate` and `plan` read."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from aiohttp import web

from ascend_runtime.balancer.record import split_over_ranks
from ascend_runtime.cli import main

from .fakesim import FakeSim


@pytest.fixture
def sims() -> Iterator[list[str]]:
    """Two fake simulators (the expert admin API) on 127.0.0.1, served from a thread of their own."""
    loop = asyncio.new_event_loop()
    runners, urls = [], []

    async def start() -> None:
        for seed in (1, 2):
            runner = web.AppRunner(FakeSim(layers=4, experts=32, ranks=4, slots=9, seed=seed).app())
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    yield urls
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_record_writes_the_dumps_evaluate_and_plan_read(sims, tmp_path, capsys) -> None:
    out = tmp_path / "dumps"
    rc = main(["balance", "record", "--instance", f"a={sims[0]}", "--instance", f"b={sims[1]}", "--out", str(out),
               "--windows", "3", "--every-s", "0.05"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert sorted(p.name for p in out.iterdir()) == ["w0000", "w0001", "w0002"]
    assert sorted(p.name for p in (out / "w0000").iterdir()) == [f"rank_{r}.json" for r in range(4)]
    first, last = (json.loads((out / w / "rank_1.json").read_text()) for w in ("w0000", "w0002"))
    assert (first["rank"], first["seq"], last["seq"], first["layers"], first["experts"]) == (1, 1, 3, 4, 32)
    assert (np.asarray(last["expert_load"]) >= np.asarray(first["expert_load"])).all()  # cumulative
    assert f"balance evaluate --load-dir {out}" in text
    assert main(["balance", "evaluate", "--load-dir", str(out), "--ranks", "4", "--interval", "1", "--policy", "greedy",
                 "--plot", str(tmp_path / "p.png")]) == 0
    assert main(["balance", "plan", "--history", str(out), "--ranks", "4", "--slots", "9",
                 "--out", str(tmp_path / "map.json")]) == 0


def test_record_refuses_bad_input_naming_the_flag(sims, tmp_path, capsys) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "w0000").mkdir()
    cases = [
        (["--out", str(tmp_path / "o")], "--stack/--instance"),
        (["--instance", f"a={sims[0]}", "--out", str(tmp_path / "o"), "--windows", "1"], "--windows"),
        (["--instance", f"a={sims[0]}", "--out", str(tmp_path / "used")], "--out"),
        (["--instance", "a=ftp://x", "--out", str(tmp_path / "o")], "--instance a"),
        (["--instance", f"a={sims[0]}", "--out", str(tmp_path / "o"), "--every-s", "0"], "--every-s"),
    ]
    for argv, flag in cases:
        assert main(["balance", "record", *argv]) == 2, argv
        assert flag in capsys.readouterr().err, argv


def test_an_idle_instance_is_a_failure_saying_to_send_requests(tmp_path, capsys, unused_tcp_port) -> None:
    rc = main(["balance", "record", "--instance", f"a=http://127.0.0.1:{unused_tcp_port}", "--out", str(tmp_path / "o"),
               "--windows", "2", "--every-s", "0.01"])
    assert rc == 1 and "/admin/expert_load" in capsys.readouterr().err


@pytest.mark.parametrize("ranks", [1, 3, 8])
def test_split_over_ranks_is_whole_non_negative_and_exact(ranks: int) -> None:
    load = np.random.default_rng(ranks).poisson(3.0, size=(2, 16)).astype(np.float64)
    shares = split_over_ranks(load, ranks)
    assert shares.shape == (ranks, 2, 16) and (shares >= 0).all() and (shares.sum(axis=0) == load).all()


@pytest.mark.slow
async def test_record_reads_the_real_simulator_under_traffic(tmp_path) -> None:
    """The simulator's own endpoint, with its admin token, while requests run: every window is written."""
    import aiohttp

    import ascend_runtime.sim.server as sim_server
    from ascend_runtime.balancer.record import record
    from ascend_runtime.balancer.sources import HttpLoadSource, DirLoadSource
    from ascend_runtime.perf.sim_config import SimConfig

    from .test_daemon import free_port

    port = free_port()
    handle = await sim_server.start_simulator(SimConfig(
        role="decode", instance="decode-0", host="127.0.0.1", port=port, kv_port=0, npus=32, dp=32, tp=1, ep=32,
        speedup=20.0, admin_token="t0ken"))
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(headers={"Authorization": "Bearer t0ken"}) as session:
            async def traffic() -> None:
                body = {"model": "deepseek-ai/DeepSeek-R1", "prompt": "a b c d", "max_tokens": 64, "ignore_eos": True}
                while True:
                    async with session.post(f"{url}/v1/completions", json=body) as resp:
                        await resp.read()

            load = asyncio.gather(*[traffic() for _ in range(8)])
            try:
                written = await record({"decode": [HttpLoadSource("decode-0", url)]}, tmp_path, 3, 0.3, session,
                                       say=lambda _: None)
            finally:
                load.cancel()
    finally:
        await handle.stop()
    assert written == {"decode": 3}
    snaps = sorted((tmp_path / "decode").iterdir())
    assert len(snaps) == 3 and len(list(snaps[0].glob("rank_*.json"))) == 32
    source = DirLoadSource("decode", snaps[0])
    for snap in snaps:
        source.directory = snap
        window = source.read()
        assert not source.skipped and window is not None and window.expert_load.shape == (58, 256)
