"""The simulator's prefix cache: chained block hashes, capped lookup, LRU capacity, metrics and prefill time."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.sim.engine import Engine
from ascend_runtime.sim.faults import Faults
from ascend_runtime.sim.metrics import SimMetrics
from ascend_runtime.sim.prefix_cache import (
    PrefixCache,
    block_hashes,
    chat_tokens,
    request_block_hashes,
)


def words(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


def test_hashes_are_chained_over_full_blocks_only():
    a = block_hashes(words(300), 128)
    assert len(a) == 2  # 300 tokens: two full blocks, the partial third has no hash
    b = block_hashes(words(256) + ["x"] * 10, 128)
    assert b == a  # same first 256 tokens, same hashes
    c = block_hashes(["other"] + words(300)[1:], 128)
    assert c[0] != a[0] and c[1] != a[1]  # block 2 has the same tokens but a different prefix
    assert block_hashes(words(300), 128, cache_salt="s")[0] != a[0]  # cache_salt keys the first block


def test_chat_turns_share_the_earlier_turns_blocks():
    sys_msg = {"role": "system", "content": " ".join(words(200, "s"))}
    turn1 = [sys_msg, {"role": "user", "content": " ".join(words(60, "u"))}]
    turn2 = turn1 + [{"role": "assistant", "content": " ".join(words(80, "a"))},
                     {"role": "user", "content": "next question"}]
    t1, t2 = chat_tokens(turn1), chat_tokens(turn2)
    assert len(t1) == 200 + 60 + 8 and t2[:len(t1)] == t1
    h1 = request_block_hashes({"messages": turn1}, True, [len(t1)], 16)[0]
    h2 = request_block_hashes({"messages": turn2}, True, [len(t2)], 16)[0]
    assert len(h1) == len(t1) // 16 and h2[:len(h1)] == h1


def test_lookup_is_capped_below_the_prompt_and_lru_evicts_the_tail_first():
    c = PrefixCache(capacity_blocks=4, block_size=10)
    h = block_hashes(words(40), 10)
    c.insert(h)
    assert c.lookup(h, 40) == 30  # all 4 blocks cached, but the last token is always computed
    assert c.lookup(h, 41) == 40
    other = block_hashes(words(20, "o"), 10)
    c.insert(other)  # 6 blocks > 4: the two least recent go, h's tail first
    assert len(c) == 4 and c.evictions == 2
    assert c.match(h, 100) == 2 and h[3] not in c and h[2] not in c
    c.insert([], reserved_blocks=3)  # running sequences need room: only 1 cached block fits
    assert len(c) == 1


def _engine(**kw) -> Engine:  # type: ignore[no-untyped-def]
    cfg = SimConfig(**{"role": "prefill", "instance": "t", "port": 0, "kv_port": 0, "speedup": 1e9,
                       "exit_on_fault": False, "dp": 1, "tp": 16, "npus": 16, **kw}).resolved()
    return Engine(cfg, Faults(0), SimMetrics(cfg.model, "t", dict))


async def _run_one(e: Engine, prompt: int, hashes: list[bytes] | None) -> float:
    """Submit one sequence and run steps until it finishes; returns the modelled seconds it took."""
    seq = e.submit(prompt, 1, block_hashes=hashes)
    t0 = e.modelled_time
    while not seq.finished:
        e._admit()
        plan = e._build()
        assert plan is not None
        st = e.timing.step_ranks(plan.decode_tokens, plan.decode_context, plan.prefill_tokens, plan.prefill_attn,
                                 *e.expert_map.rank_loads(e.router.route(plan.tokens)))
        e.modelled_time += st.total
        e._apply(plan, st.total, asyncio.get_running_loop().time())
    return e.modelled_time - t0


async def test_a_cached_prefix_is_not_recomputed_and_counts_in_vllm_metrics():
    e = _engine()
    m = e.metrics
    prompt = 12_000
    h = block_hashes(words(prompt), e.block_size)
    cold = await _run_one(e, prompt, h)
    assert m.prefix_queries.sum() == prompt and m.prefix_hits.sum() == 0
    warm = await _run_one(e, prompt, h)
    hit = (prompt - 1) // e.block_size * e.block_size
    assert m.prefix_queries.sum() == 2 * prompt and m.prefix_hits.sum() == hit
    assert m.prompt_by_source["local_cache_hit"].sum() == hit
    assert m.prompt_by_source["local_compute"].sum() == 2 * prompt - hit
    assert m.prompt_cached.sum() == hit
    assert warm < 0.5 * cold  # only the last partial block is prefilled
    # a different prompt of the same length gets no hit and costs as much as the cold one
    other = await _run_one(e, prompt, block_hashes(words(prompt, "z"), e.block_size))
    assert m.prefix_hits.sum() == hit and other == pytest.approx(cold, rel=0.05)


async def test_disabled_prefix_caching_neither_queries_nor_hits():
    e = _engine(enable_prefix_caching=False)
    h = block_hashes(words(4000), 128)
    await _run_one(e, 4000, h)
    await _run_one(e, 4000, h)
    assert e.prefix_caches is None
    assert e.metrics.prefix_queries.sum() == 0 and e.metrics.prefix_hits.sum() == 0


async def test_the_http_prefill_path_hits_on_a_repeated_chat_prefix(sim):  # type: ignore[no-untyped-def]
    h = await sim(role="prefill", instance="p0", dp=1, tp=16, npus=16)
    sys_text = " ".join(words(1000, "s"))
    body = {"model": "deepseek-ai/DeepSeek-R1", "max_tokens": 1,
            "messages": [{"role": "system", "content": sys_text}, {"role": "user", "content": "hello there"}]}
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(h.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
                await r.read()
        async with s.get(h.url + "/metrics") as r:
            text = await r.text()
    hits = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total")]
    queries = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_queries_total")]
    prompt = 1000 + 2 + 8  # words + 4 markers per message
    assert sum(queries) == 2 * prompt
    assert sum(hits) == (prompt - 1) // 128 * 128
    assert 'enable_prefix_caching="True"' in text
