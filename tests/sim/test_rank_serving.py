"""Rank serving: one simulator per instance listens on every DP rank's own address, and a request to rank r's
server runs on DP rank r only; each rank's /metrics has its own series (``engine="r"``, as a vLLM API server
started with ``--data-parallel-rank r`` labels the one engine core it fronts)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ascend_runtime.cli import build_parser
from ascend_runtime.cli.commands.sim import config_from_args
from ascend_runtime.perf.from_plan import rank_endpoints, sim_config_from_plan
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.perf.sim_flags import argv_from_config
from ascend_runtime.planner import load_plan


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _series(text: str, name: str) -> dict[str, float]:
    """engine label -> value of sample ``name``."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[s.labels["engine"]] = out.get(s.labels["engine"], 0.0) + s.value
    return out


async def _complete(http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int = 4) -> aiohttp.ClientResponse:
    body = {"model": "deepseek-ai/DeepSeek-R1", "prompt": prompt, "max_tokens": max_tokens}
    async with http.post(url + "/v1/completions", json=body) as r:
        await r.read()
        return r


async def test_each_rank_server_admits_to_its_rank_and_exports_its_series(sim, http) -> None:  # type: ignore[no-untyped-def]
    ports = _free_ports(4)
    h = await sim(role="prefill", dp=4, tp=4, npus=16, ep=16, nodes=2, port=ports[0],
                  rank_endpoints=tuple(f"127.0.0.1:{p}" for p in ports))
    assert h.rank_urls == [f"http://127.0.0.1:{p}" for p in ports] and h.url == h.rank_urls[0]
    # rank 2 twice, rank 3 once, nothing on 0 and 1
    for url in (h.rank_urls[2], h.rank_urls[2], h.rank_urls[3]):
        r = await _complete(http, url, "hello " * 40)
        assert r.status == 200 and r.headers["x-instance"] == h.config.instance
        assert r.headers["x-dp-rank"] == str(h.rank_urls.index(url))
    for rank, url in enumerate(h.rank_urls):
        async with http.get(url + "/metrics") as r:
            text = await r.text()
        success = _series(text, "vllm:request_success_total")
        assert list(success) == [str(rank)]  # only this rank's series, labelled with its global DP rank
        assert success[str(rank)] == {0: 0, 1: 0, 2: 2, 3: 1}[rank]
        async with http.get(url + "/health") as r:
            assert r.status == 200
        async with http.get(url + "/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "deepseek-ai/DeepSeek-R1"


async def test_each_rank_has_its_own_prefix_cache(sim, http) -> None:  # type: ignore[no-untyped-def]
    ports = _free_ports(2)
    h = await sim(role="prefill", dp=2, tp=8, npus=16, ep=16, nodes=2, port=ports[0],
                  rank_endpoints=tuple(f"127.0.0.1:{p}" for p in ports))
    prompt = "shared prefix " * 200
    for url in (h.rank_urls[0], h.rank_urls[0], h.rank_urls[1]):
        assert (await _complete(http, url, prompt, 1)).status == 200
    hits = []
    for url in h.rank_urls:
        async with http.get(url + "/metrics") as r:
            hits.append(sum(_series(await r.text(), "vllm:prefix_cache_hits_total").values()))
    assert hits[0] > 0 and hits[1] == 0  # the second request hit rank 0's cache; rank 1's first saw the prompt


async def test_a_full_rank_holds_its_requests_while_another_rank_admits(sim, http) -> None:  # type: ignore[no-untyped-def]
    """Each rank schedules its own: rank 0 at max_num_seqs does not stop rank 1 from admitting."""
    ports = _free_ports(2)
    h = await sim(role="decode", dp=2, tp=8, npus=16, ep=16, nodes=2, max_num_seqs=1, speedup=5.0,
                  port=ports[0], rank_endpoints=tuple(f"127.0.0.1:{p}" for p in ports))
    slow = [asyncio.create_task(_complete(http, h.rank_urls[0], "x " * 20, 300)) for _ in range(3)]
    engine = h.state.engine
    for _ in range(200):
        await asyncio.sleep(0.05)
        if engine.num_running + len(engine.waiting) == 3:
            break
    assert engine.running_by_rank().tolist() == [1.0, 0.0] and engine.waiting_by_rank().tolist() == [2.0, 0.0]
    r = await _complete(http, h.rank_urls[1], "y " * 20, 2)
    assert r.status == 200 and not all(t.done() for t in slow)
    assert [t.status for t in await asyncio.gather(*slow)] == [200, 200, 200]


def test_engine_refuses_a_rank_it_does_not_have() -> None:
    from ascend_runtime.sim.engine import Engine
    from ascend_runtime.sim.faults import Faults
    from ascend_runtime.sim.metrics import SimMetrics

    cfg = SimConfig(role="prefill", instance="p", dp=2, tp=8, npus=16, ep=16).resolved()
    engine = Engine(cfg, Faults(0), SimMetrics(cfg.model, "p", dict))
    with pytest.raises(ValueError, match="not a DP rank"):
        asyncio.run(_submit(engine, 2))


async def _submit(engine, rank: int) -> None:  # type: ignore[no-untyped-def]
    engine.submit(10, 1, dp_rank=rank)


def test_rank_endpoints_must_be_one_per_rank() -> None:
    with pytest.raises(ValueError, match="one per DP rank"):
        SimConfig(role="prefill", instance="p", dp=2, rank_endpoints=("127.0.0.1:1",))
    with pytest.raises(ValueError, match="twice"):
        SimConfig(role="prefill", instance="p", rank_endpoints=("127.0.0.1:1", "127.0.0.1:1"))
    with pytest.raises(ValueError, match="host:port"):
        SimConfig(role="prefill", instance="p", rank_endpoints=("127.0.0.1",))


def test_plan_gives_every_rank_its_node_address_and_the_flags_round_trip() -> None:
    plan = load_plan("local-rank")
    for inst in plan.instances:
        config = sim_config_from_plan(plan, inst)
        want = sorted((ep.dp_rank, f"{ep.host}:{ep.port}") for ep in inst.api_endpoints)
        assert config.rank_endpoints == tuple(a for _, a in want) and len(want) == inst.dp
        assert config.rank_endpoints[0] == f"{config.host}:{config.port}"
        args = build_parser().parse_args(["sim", *argv_from_config(config)])
        assert config_from_args(args) == config
        stacked = config_from_args(build_parser().parse_args(["sim", "--stack", "local-rank", "--instance", inst.name]))
        assert stacked == config
    # instance serving: no rank endpoints, no flag
    local = load_plan("local")
    assert all(not sim_config_from_plan(local, i).rank_endpoints for i in local.instances)
    assert "--rank-endpoints" not in argv_from_config(sim_config_from_plan(local, local.instances[0]))
    # one bind address for ranks on two nodes that reuse ports: refused, naming the collision
    with pytest.raises(ValueError, match="collide"):
        rank_endpoints(plan.instance("prefill-0"), "0.0.0.0")


def test_cli_rejects_a_malformed_rank_endpoint(capsys: pytest.CaptureFixture[str]) -> None:
    from ascend_runtime.cli.commands.sim import handler

    args = build_parser().parse_args(["sim", "--role", "prefill", "--instance", "p", "--port", "18000",
                                      "--kv-port", "28000", "--rank-endpoints", "127.0.0.1:18000,nope"])
    assert handler(args) == 2
    assert "--rank-endpoints" in capsys.readouterr().err
