"""KV-cache-affinity routing of prefill against load-only routing and an oracle, on simulated prefill instances.

Setup: ``--prefills`` in-process engine simulators (``ascend_runtime.sim``, the published A2 prefill
shape: 16 NPUs DP2 TP8, prefix caching on, block 128, ``--gpu-memory-utilization`` and ``--speedup``
as given) on 127.0.0.1. Requests are the proxy's prefill requests (``pd.build_prefill_request``:
``max_tokens`` 1, not streamed) sent over loopback HTTP; the instance is chosen by
``InstancePool.pick_prefill`` exactly as the proxy's prefill path calls it, and charged with
``begin``/``end`` as the proxy does (prompt minus expected cached tokens). Routers:

- ``load-only``: ``prefill_affinity_weight = 0`` (no affinity at all; charged the whole prompt);
- ``affinity``: the defaults (proxy/affinity.py: routing history + rendezvous home);
- ``oracle``: the same score and charge, but the expected cached prefix of each instance is read from
  the simulators' prefix caches at pick time (the longest hit over its DP ranks; no home guess).

Serving (``--serving``, default ``instance``; ``instance,rank`` runs both, one after the other):

- ``instance``: one API server per instance (the simulator admits each request to its least-loaded DP
  rank); the pool has one entry per instance and the oracle reads the best of its ranks' caches;
- ``rank``: rank serving, one API server per DP rank (vLLM's ``--data-parallel-rank``; the simulator's
  ``rank_endpoints``), a request to rank r's server runs on rank r with rank r's prefix cache; the pool
  has one ``InstanceSpec`` per rank (``<instance>-dp<r>``, ``instance`` set) and the oracle reads each
  rank's own cache.

With ``R`` proxy replicas each request goes to a random replica (a Service spreads connections); the
replicas keep independent routing state.

Workloads (the generator's parameters are flags; defaults in brackets):

- ``sharing``, a multi-turn chat: ``--tenants`` [4] tenants with ``--system-prompts`` [2] system
  prompts each of ``--system-words`` [1000..2000] words; ``--sessions`` [224] conversations, each of a
  tenant drawn uniformly and one of its system prompts, with ``--turns`` [4..10] turns. Turn ``t``'s
  prompt is the system prompt, every earlier user message and answer, then a new user message of
  ``--user-words`` [30..300] words; answers have ``--answer-words`` [100..500] words (ranges are uniform).
  A session's next turn is sent when the previous prefill answered plus a think time, exponential with
  mean ``--think-s`` [1.0] modelled seconds (standing for the decode of the answer and the user).
  Sessions start as a Poisson process at ``--rate`` [64] requests/s / the mean turns. In PD the prefill
  instance caches the prompt only (the answer is produced on the decode), so turn ``t+1`` finds turn
  ``t``'s prompt on the instance (and DP rank) that prefilled turn ``t``. The distinct prefix tokens of
  the run exceed one instance's prefix cache but fit the aggregate (printed at start).
- ``no-sharing``, the control: single-turn chats with unique words and the sharing workload's prompt
  lengths (shuffled), Poisson arrivals at ``--control-rate`` [16] requests/s: nobody can reuse anything.

Measured per run: prefix hit rate (``vllm:prefix_cache_hits / vllm:prefix_cache_queries`` over all
instances), prompt tokens computed (``vllm:prompt_tokens_by_source{source="local_compute"}``: independent
of machine load), TTFT p50/p99 of the prefill leg (wall x speedup = modelled seconds). Robustness on a
shared machine: every router runs on the same simulators (caches cleared between runs) with the same
arrival times and contents, in ``--rounds`` [3] rounds whose router order rotates; the table gives the
median over rounds and the verdicts use the median of the per-round ratios.

Run: ``python -m benchmarks.kv_affinity [--serving instance,rank] [--write]`` (``--write`` updates
docs/benchmarks.md: the instance section for ``--serving instance``, the rank serving section, with the
instance figures of the same run beside it, when rank is among them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from ascend_runtime import eventloop
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.proxy.affinity import AffinitySettings, PrefixAffinity, PromptBlocks
from ascend_runtime.proxy.config import RoutingWeights
from ascend_runtime.proxy.instances import InstanceSpec
from ascend_runtime.proxy.pd import build_prefill_request, estimate_prompt_tokens
from ascend_runtime.proxy.pool import InstancePool
from ascend_runtime.sim.prefix_cache import chat_tokens, request_block_hashes
from ascend_runtime.sim.server import SimHandle, start_simulator

MODEL = "deepseek-ai/DeepSeek-R1"


# ---------------------------------------------------------------- workloads
@dataclass
class Turn:
    """One request of a workload: its body, its session and index, and its think time before the next turn."""

    body: dict[str, Any]
    session: int
    index: int
    think_s: float = 0.0


@dataclass
class Workload:
    """Sessions (lists of turns) and each session's start, modelled seconds from the run's start."""

    name: str
    sessions: list[list[Turn]]
    starts: list[float]
    distinct_tokens: int = 0

    @property
    def requests(self) -> int:
        return sum(len(s) for s in self.sessions)


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("..")
    a, b = int(lo), int(hi or lo)
    if a < 1 or b < a:
        raise ValueError(text)
    return a, b


def _text(rng: random.Random, n: int, tag: str) -> str:
    return " ".join(f"{tag}{rng.randrange(50_000)}" for _ in range(n))


def sharing_workload(rng: random.Random, a: argparse.Namespace) -> Workload:
    """Multi-turn chat sessions of tenants with a few system prompts each (see the module docstring)."""
    sw, tw, uw, aw = _range(a.system_words), _range(a.turns), _range(a.user_words), _range(a.answer_words)
    systems = [[_text(rng, rng.randint(*sw), f"t{t}s{k}_") for k in range(a.system_prompts)]
               for t in range(a.tenants)]
    sessions, distinct = [], sum(len(chat_tokens([{"role": "system", "content": s}])) for ts in systems for s in ts)
    for c in range(a.sessions):
        system = rng.choice(systems[rng.randrange(a.tenants)])
        msgs: list[dict[str, str]] = [{"role": "system", "content": system}]
        turns = []
        for t in range(rng.randint(*tw)):
            msgs = msgs + [{"role": "user", "content": _text(rng, rng.randint(*uw), f"c{c}u{t}_")}]
            turns.append(Turn({"model": MODEL, "messages": list(msgs), "max_tokens": 64}, c, t,
                              rng.expovariate(1.0 / a.think_s) if a.think_s > 0 else 0.0))
            msgs = msgs + [{"role": "assistant", "content": _text(rng, rng.randint(*aw), f"c{c}a{t}_")}]
        # the last prompt of a session holds every earlier one; the system prompt is counted once above
        distinct += len(chat_tokens(turns[-1].body["messages"])) - len(chat_tokens(msgs[:1]))
        sessions.append(turns)
    mean_turns = sum(len(s) for s in sessions) / len(sessions)
    return Workload("sharing", sessions, _poisson(rng, len(sessions), a.rate / mean_turns), distinct)


def no_sharing_workload(rng: random.Random, a: argparse.Namespace, lengths: list[int]) -> Workload:
    """Single-turn chats with unique words, one per given prompt length (tokens), Poisson at --control-rate."""
    sessions = [[Turn({"model": MODEL, "messages": [{"role": "user", "content": _text(rng, max(1, n - 4), f"n{i}_")}],
                       "max_tokens": 64}, i, 0)] for i, n in enumerate(lengths)]
    return Workload("no-sharing", sessions, _poisson(rng, len(sessions), a.control_rate), sum(lengths))


def _poisson(rng: random.Random, n: int, rate: float) -> list[float]:
    out, t = [], 0.0
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


# ---------------------------------------------------------------- routers
@dataclass(frozen=True)
class Endpoint:
    """One API server the routers pick among: a whole instance (``rank`` None) or one DP rank of it."""

    name: str
    url: str
    sim: SimHandle
    rank: int | None = None

    def caches(self) -> list[Any]:
        """The prefix caches a request sent here can hit: the instance's ranks', or this rank's."""
        caches = self.sim.state.engine.prefix_caches or []
        return caches if self.rank is None else [caches[self.rank]]


def endpoints_of(sims: dict[str, SimHandle]) -> dict[str, Endpoint]:
    """Every routable server: per instance, or per DP rank (``<instance>-dp<r>``) for rank-serving simulators."""
    out: dict[str, Endpoint] = {}
    for name, h in sims.items():
        if h.rank_urls:
            out.update({f"{name}-dp{r}": Endpoint(f"{name}-dp{r}", url, h, r) for r, url in enumerate(h.rank_urls)})
        else:
            out[name] = Endpoint(name, h.url, h)
    return out


class OracleAffinity(PrefixAffinity):
    """Expected cached prefix = what the endpoints' prefix caches hold now (an instance: its best DP rank;
    a rank: its own); no home guess."""

    def __init__(self, sims: dict[str, Endpoint]) -> None:
        super().__init__(AffinitySettings(weight=1.0, home_weight=0.0, block_tokens=128))
        self.sims = sims
        self._body: dict[str, Any] = {}

    def blocks(self, req: dict[str, Any]) -> PromptBlocks:
        self._body = req
        return super().blocks(req)

    def expected(self, blocks: PromptBlocks, names: Any) -> dict[str, int]:
        n = len(chat_tokens(self._body.get("messages") or []))
        out = {}
        for name in names:
            ep = self.sims[name]
            e = ep.sim.state.engine
            hashes = request_block_hashes(self._body, True, [n], e.block_size)[0]
            out[name] = max((c.match(hashes, n - 1) for c in ep.caches()), default=0) * e.block_size
        return out

    def record(self, name: str, blocks: PromptBlocks) -> None:
        pass


def make_pool(kind: str, sims: dict[str, Endpoint]) -> InstancePool:
    if kind == "load-only":
        pool = InstancePool(weights=RoutingWeights(prefill_affinity_weight=0.0))
    elif kind == "affinity":
        pool = InstancePool(weights=RoutingWeights())
    elif kind == "affinity-no-home":
        pool = InstancePool(weights=RoutingWeights(prefill_affinity_home_weight=0.0))
    elif kind == "oracle":
        pool = InstancePool(weights=RoutingWeights(), affinity=OracleAffinity(sims))
    else:
        raise ValueError(kind)
    for name, ep in sims.items():
        pool.add(InstanceSpec(name, "prefill", ep.url, instance=None if ep.rank is None else ep.sim.config.instance))
    return pool


# ---------------------------------------------------------------- one run
@dataclass
class Result:
    """One run of one router on one workload; TTFTs in modelled ms."""

    workload: str
    router: str
    replicas: int
    requests: int
    hit_rate: float
    computed_tokens: int
    prompt_tokens: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    wall_s: float
    errors: int
    credited: int = 0  # picks with an expected cached prefix on some instance


def _counters(sims: dict[str, SimHandle]) -> tuple[float, float, float, float]:
    q = h = comp = prompt = 0.0
    for s in sims.values():
        m = s.state.engine.metrics
        q += float(m.prefix_queries.sum())
        h += float(m.prefix_hits.sum())
        comp += float(m.prompt_by_source["local_compute"].sum())
        prompt += float(m.prompt_tokens.sum())
    return q, h, comp, prompt


async def _idle(sims: dict[str, SimHandle]) -> None:
    while any(s.state.engine.num_running or s.state.engine.waiting for s in sims.values()):
        await asyncio.sleep(0.01)


async def run(wl: Workload, router: str, replicas: int, sims: dict[str, SimHandle], speedup: float,
              seed: int) -> Result:
    await _idle(sims)
    for s in sims.values():  # every run starts from empty caches
        for c in s.state.engine.prefix_caches or []:
            c.clear()
    eps = endpoints_of(sims)
    pools = [make_pool(router, eps) for _ in range(replicas)]
    rng = random.Random(seed)  # replica choices: the same sequence for every router
    before = _counters(sims)
    ttfts: list[float] = []
    errors = credited = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(turn: Turn) -> None:
            nonlocal errors, credited
            pool = pools[rng.randrange(replicas)]
            body = turn.body
            state, charge = pool.pick_prefill((), body, estimate_prompt_tokens(body))
            credited += pool.last_expected_hit > 0
            pool.begin(state, charge)
            t0 = time.perf_counter()
            try:
                async with session.post(state.spec.url + "/v1/chat/completions",
                                        data=json.dumps(build_prefill_request(body)),
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        return
                ttfts.append((time.perf_counter() - t0) * speedup)
            finally:
                pool.end(state, charge)

        async def conversation(turns: list[Turn], start: float) -> None:
            await asyncio.sleep(start / speedup)
            for t in turns:
                await one(t)
                await asyncio.sleep(t.think_s / speedup)

        wall0 = time.perf_counter()
        await asyncio.gather(*(conversation(c, s) for c, s in zip(wl.sessions, wl.starts)))
        wall = time.perf_counter() - wall0
    await _idle(sims)
    after = _counters(sims)
    q, h, comp, prompt = (x - y for x, y in zip(after, before))
    arr = np.array(ttfts) if ttfts else np.array([float("nan")])
    return Result(wl.name, router, replicas, wl.requests, h / q if q else 0.0, int(comp), int(prompt),
                  float(np.percentile(arr, 50)) * 1000, float(np.percentile(arr, 99)) * 1000, wall, errors, credited)


# ---------------------------------------------------------------- report
@dataclass
class Summary:
    """All rounds of one (workload, router, replicas)."""

    runs: list[Result] = field(default_factory=list)

    def med(self, attr: str) -> float:
        return float(statistics.median(getattr(r, attr) for r in self.runs))


def table(by: dict[tuple[str, str, int], Summary]) -> str:
    head = ("| workload | router | proxy replicas | requests | prefix hit rate | prompt tokens computed | "
            "TTFT p50 (ms) | TTFT p99 (ms) | p50 per round |\n|---|---|---|---|---|---|---|---|---|\n")
    rows = ""
    for (wl, router, reps), s in by.items():
        r0 = s.runs[0]
        rows += (f"| {wl} | {router} | {reps} | {r0.requests} | {s.med('hit_rate'):.1%} | "
                 f"{s.med('computed_tokens'):,.0f} of {r0.prompt_tokens:,} | {s.med('ttft_p50_ms'):.0f} | "
                 f"{s.med('ttft_p99_ms'):.0f} | {' / '.join(f'{r.ttft_p50_ms:.0f}' for r in s.runs)} |\n")
    return head + rows


def _paired(a: Summary, b: Summary, attr: str) -> float:
    """Median over rounds of a's ``attr`` / b's ``attr`` (the same round: side by side)."""
    return float(statistics.median(getattr(x, attr) / getattr(y, attr) for x, y in zip(a.runs, b.runs)
                                   if getattr(y, attr)))


def goals(by: dict[tuple[str, str, int], Summary], hit_goal: float = 0.9, p50_goal: float = 0.3) -> list[str]:
    s_aff, s_load, s_orc = by[("sharing", "affinity", 1)], by[("sharing", "load-only", 1)], by[("sharing", "oracle", 1)]
    n_aff, n_load = by[("no-sharing", "affinity", 1)], by[("no-sharing", "load-only", 1)]
    hit_ratio = _paired(s_aff, s_orc, "hit_rate")
    p50_gain = 1 - _paired(s_aff, s_load, "ttft_p50_ms")
    comp_gain = 1 - _paired(s_aff, s_load, "computed_tokens")
    p99_reg = _paired(n_aff, n_load, "ttft_p99_ms") - 1
    out = [
        (f"- hit rate, affinity / oracle (sharing): {hit_ratio:.1%} (goal >= {hit_goal:.0%}): "
         f"{'met' if hit_ratio >= hit_goal else 'MISSED'}"),
        (f"- TTFT p50, affinity vs load-only (sharing): {abs(p50_gain):.1%} {'lower' if p50_gain >= 0 else 'HIGHER'} "
         f"(goal >= {p50_goal:.0%} lower): {'met' if p50_gain >= p50_goal else 'MISSED'}; prompt tokens computed "
         f"{comp_gain:.1%} fewer"),
        (f"- TTFT p99, affinity vs load-only (no-sharing): {p99_reg:+.1%} (goal <= +5%): "
         f"{'met' if p99_reg <= 0.05 else 'MISSED'}; no-sharing picks with an expected cached prefix: "
         f"{max(r.credited for r in n_aff.runs)} of {n_aff.runs[0].requests} (0: routed as load-only routes them)"),
    ]
    for r in (2, 4):
        rr = by.get(("sharing", "affinity", r))
        if rr is not None:
            out.append(f"- {r} proxy replicas (independent routing state): hit rate {rr.med('hit_rate'):.1%} = "
                       f"{_paired(rr, s_aff, 'hit_rate'):.1%} of one replica's, prompt tokens computed "
                       f"{_paired(rr, s_aff, 'computed_tokens'):.1%} of one replica's, TTFT p50 "
                       f"{1 - _paired(rr, s_load, 'ttft_p50_ms'):.1%} lower than load-only")
    return out


#: DP ranks of the benchmark's prefill instances (the A2 prefill shape, DP2 TP8).
PREFILL_DP = 2
#: The goals (hit rate vs the oracle, TTFT p50 cut vs load-only) by serving mode.
GOALS = {"instance": (0.9, 0.3), "rank": (0.95, 0.35)}


async def main_async(a: argparse.Namespace, serving: str = "instance") -> dict[tuple[str, str, int], Summary]:
    sims: dict[str, SimHandle] = {}
    for i in range(a.prefills):
        # rank serving: every DP rank its own server (free ports on loopback)
        ranks = tuple("127.0.0.1:0" for _ in range(PREFILL_DP)) if serving == "rank" else ()
        h = await start_simulator(SimConfig(role="prefill", instance=f"prefill-{i}", port=0, kv_port=0,
                                            speedup=a.speedup, exit_on_fault=False, seed=i, kv_timeout_s=5.0,
                                            gpu_memory_utilization=a.gpu_memory_utilization, dp=PREFILL_DP,
                                            rank_endpoints=ranks))
        sims[h.state.cfg.instance] = h
    try:
        rng = random.Random(a.seed)
        share = sharing_workload(rng, a)
        lengths = [len(chat_tokens(t.body["messages"])) for c in share.sessions for t in c]
        rng.shuffle(lengths)
        control = no_sharing_workload(rng, a, lengths)
        e = next(iter(sims.values())).state.engine
        one = e.kv_capacity * e.dp
        print(f"serving: {serving} ({len(endpoints_of(sims))} routable API servers)", file=sys.stderr)
        print(f"sharing: {share.requests} requests in {len(share.sessions)} sessions, {share.distinct_tokens:,} "
              f"distinct prefix tokens; prefix cache {one:,} tokens per instance ({e.dp} DP ranks), "
              f"{one * len(sims):,} in all", file=sys.stderr)
        if not one < share.distinct_tokens <= one * len(sims):
            print("kv_affinity: note: the distinct prefix tokens do not lie between one instance's cache and the "
                  "aggregate", file=sys.stderr)
        plan = [(share, "load-only", 1), (share, "affinity", 1), (share, "oracle", 1),
                (control, "load-only", 1), (control, "affinity", 1)]
        plan += [(share, "affinity", n) for n in a.replicas if n != 1]
        by: dict[tuple[str, str, int], Summary] = {(wl.name, r, n): Summary() for wl, r, n in plan}
        t0 = time.perf_counter()
        for rnd in range(a.rounds):
            order = plan[rnd % len(plan):] + plan[:rnd % len(plan)]  # rotate who goes first
            for k, (wl, router, replicas) in enumerate(order, 1):
                print(f"[{serving}, round {rnd + 1}/{a.rounds}, {k}/{len(order)}] {wl.name:10s} {router:10s} x{replicas} ...",
                      end=" ", flush=True, file=sys.stderr)
                r = await run(wl, router, replicas, sims, a.speedup, a.seed + 1)
                print(f"hit {r.hit_rate:.1%}  computed {r.computed_tokens:,}  p50 {r.ttft_p50_ms:.0f} ms  "
                      f"p99 {r.ttft_p99_ms:.0f} ms  ({r.wall_s:.1f} s wall, {r.errors} errors, "
                      f"{time.perf_counter() - t0:.0f} s so far)", file=sys.stderr)
                by[(wl.name, router, replicas)].runs.append(r)
        return by
    finally:
        for h in sims.values():
            await h.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefills", type=int, default=4, help="prefill simulators (default 4)")
    ap.add_argument("--speedup", type=float, default=2.0, help="simulator speedup (default 2)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.95,
                    help="the simulators' --gpu-memory-utilization: sets the prefix cache size (default 0.95)")
    ap.add_argument("--rate", type=float, default=64.0, help="sharing: mean requests/s, modelled (default 64)")
    ap.add_argument("--control-rate", type=float, default=16.0, help="no-sharing: requests/s, modelled (default 16)")
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--system-prompts", type=int, default=2, help="distinct system prompts per tenant (default 2)")
    ap.add_argument("--system-words", default="1000..2000")
    ap.add_argument("--sessions", type=int, default=224)
    ap.add_argument("--turns", default="4..10", help="turns per session (default 4..10)")
    ap.add_argument("--user-words", default="30..300")
    ap.add_argument("--answer-words", default="100..500")
    ap.add_argument("--think-s", type=float, default=1.0, help="mean think time between turns, modelled s")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every router (median reported; default 3)")
    ap.add_argument("--replicas", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 4],
                    help="proxy replica counts for the sharing affinity runs (default 1,2,4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--serving", type=lambda v: v.split(","), default=["instance"],
                    help="instance, rank, or instance,rank (both, one after the other; default instance)")
    ap.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    a = ap.parse_args(argv)
    if not a.serving or any(m not in GOALS for m in a.serving) or len(set(a.serving)) != len(a.serving):
        print(f"kv_affinity: --serving must be instance, rank or instance,rank, got {','.join(a.serving)!r}",
              file=sys.stderr)
        return 2
    for name in ("prefills", "sessions", "tenants", "system_prompts", "rounds"):
        if getattr(a, name) < 1:
            print(f"kv_affinity: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    for name in ("system_words", "turns", "user_words", "answer_words"):
        try:
            _range(getattr(a, name))
        except ValueError:
            print(f"kv_affinity: --{name.replace('_', '-')} must be N or LO..HI with 1 <= LO <= HI, "
                  f"got {getattr(a, name)!r}", file=sys.stderr)
            return 2
    if a.speedup <= 0 or a.rate <= 0 or a.control_rate <= 0 or a.think_s < 0 or min(a.replicas) < 1 \
            or not 0 < a.gpu_memory_utilization <= 1:
        print("kv_affinity: --speedup, --rate and --control-rate must be > 0, --think-s >= 0, --replicas >= 1, "
              "--gpu-memory-utilization in (0, 1]", file=sys.stderr)
        return 2
    results = {mode: eventloop.run(main_async(a, mode)) for mode in a.serving}
    texts = {mode: table(by) + "\n" + "\n".join(goals(by, *GOALS[mode])) + "\n" for mode, by in results.items()}
    for mode, text in texts.items():
        print(f"serving: {mode}\n{text}")
    if a.write and "rank" in results:
        write_rank_section(a, ap, texts)
    if a.write and a.serving == ["instance"]:
        text = texts["instance"]
        from benchmarks.report import machine_line, write_section

        cmd = _command(a, ap)
        write_section("kv_affinity", (
            "## KV-cache-affinity routing of prefill (simulated)\n\n"
            f"Command: `{cmd}` ({machine_line()}). {a.prefills} prefill simulators (A2 prefill shape, 16 NPUs "
            f"DP2 TP8, prefix caching, block 128, speedup {a.speedup:g}) over loopback HTTP; routing and load "
            "charging by `InstancePool.pick_prefill` as the proxy's prefill path calls it. Sharing (multi-turn "
            f"chat): {a.sessions} sessions of {a.turns} turns, {a.tenants} tenants x {a.system_prompts} system "
            f"prompts of {a.system_words} words, user messages of {a.user_words} words, answers of "
            f"{a.answer_words} words (answers are in the next prompt, not in the prefill's cache), think time "
            f"mean {a.think_s:g} s, {a.rate:g} requests/s (modelled). No-sharing (control): unique single-turn "
            f"chats of the same prompt lengths at {a.control_rate:g} requests/s. TTFT is the prefill leg's "
            "(modelled ms = wall x speedup); hit rate is vllm:prefix_cache_hits / vllm:prefix_cache_queries; "
            "the oracle reads the engines' caches at pick time. Replicas keep independent routing state; each "
            f"request goes to a random replica. {a.rounds} rounds, router order rotating; the table gives "
            "medians over rounds, the verdicts medians of per-round ratios.\n\n"
            + text))
    return 0


def _command(a: argparse.Namespace, ap: argparse.ArgumentParser) -> str:
    return "python -m benchmarks.kv_affinity --write" + "".join(
        f" --{k.replace('_', '-')} {v if not isinstance(v, list) else ','.join(map(str, v))}"
        for k, v in vars(a).items() if k != "write" and v != ap.get_default(k))


def write_rank_section(a: argparse.Namespace, ap: argparse.ArgumentParser, texts: dict[str, str]) -> None:
    """The rank serving section of docs/benchmarks.md (with the instance figures of the same run, if run)."""
    from benchmarks.report import machine_line, write_section

    same = ("\n\nInstance serving in the same run (one API server per instance, the simulator's least-loaded "
            "rank; goals as in the section above):\n\n" + texts["instance"]) if "instance" in texts else ""
    write_section("kv_affinity_rank", (
        "## KV-cache-affinity routing of prefill with rank serving (simulated)\n\n"
        f"Command: `{_command(a, ap)}` ({machine_line()}). The workloads and routers of the section above, on "
        f"{a.prefills} prefill simulators of the A2 prefill shape (DP{PREFILL_DP} TP8) with rank serving: every "
        "DP rank its own API server (`--data-parallel-rank`; the simulator's `rank_endpoints`), a request to a "
        "rank's server runs on that rank with that rank's prefix cache. The routers pick among the "
        f"{a.prefills * PREFILL_DP} rank servers (one `InstanceSpec` per rank, `instance` set); the oracle reads "
        "each rank's own cache at pick time. Sharing: "
        f"{a.sessions} sessions of {a.turns} turns at {a.rate:g} requests/s (modelled), speedup {a.speedup:g}; "
        f"{a.rounds} rounds, router order rotating; medians over rounds, verdicts medians of per-round ratios. "
        "Goals with rank serving: affinity's hit rate >= 95% of the oracle's, TTFT p50 >= 35% below "
        "load-only.\n\n" + texts["rank"] + same))


if __name__ == "__main__":
    raise SystemExit(main())
