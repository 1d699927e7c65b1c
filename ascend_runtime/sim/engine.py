"""Continuous-batching engine core: scheduler, step loop, expert-load accounting.

One asyncio task runs steps. Each step:

1. admits waiting sequences FCFS to the DP rank with the fewest running ones,
   while that rank has fewer than ``max_num_seqs`` running and KV room for
   prompt + max_tokens tokens (reserved up front, so no preemption);
2. builds each rank's batch: every decoding sequence computes 1 token (2 with
   MTP), then prefilling sequences take chunks FCFS up to the rank's
   ``max_num_batched_tokens`` (chunked prefill);
3. routes all of the step's tokens to experts, maps them to EP ranks through
   the current expert map, and asks the timing model for the step time;
4. sleeps until ``step / speedup`` after the previous step's end (absolute
   deadlines, so Python overhead does not add up), then applies progress: a
   sequence whose prefill completes samples its first token; each decoding
   sequence gets one token (plus the MTP draft token with probability
   ``mtp_acceptance``); a sequence reaching ``max_tokens`` finishes.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ascend_runtime.sim.capacity import kv_capacity_tokens
from ascend_runtime.sim.config import SimConfig
from ascend_runtime.sim.experts import ExpertMap, ExpertRouter, balancedness
from ascend_runtime.sim.faults import Faults
from ascend_runtime.sim.metrics import SimMetrics
from ascend_runtime.sim.timing import RankBatch, TimingModel

SNAPSHOTS_KEPT = 64
BALANCE_WINDOW = 64


class EngineFull(Exception):
    """A request that can never fit (longer than the KV cache of a DP rank)."""


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. Times are loop (wall) seconds."""

    req_id: str
    prompt_tokens: int
    max_tokens: int
    computed: int = 0  # prompt tokens whose KV exists
    generated: int = 0
    dp_rank: int = -1
    arrival: float = 0.0
    first_token_at: float | None = None
    last_token_at: float = 0.0
    finished: bool = False
    finish_reason: str | None = None
    aborted: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def reserve(self) -> int:
        """KV tokens reserved for the sequence's whole life."""
        return self.prompt_tokens + self.max_tokens


@dataclass
class RankState:
    """One DP rank's running sequences and KV reservation (tokens)."""

    running: list[Sequence] = field(default_factory=list)
    kv_used: int = 0


class Engine:
    """The simulated engine of one instance (all its DP ranks)."""

    def __init__(self, cfg: SimConfig, faults: Faults, metrics: SimMetrics, expert_map: ExpertMap | None = None,
                 retained_tokens: Callable[[], int] = lambda: 0) -> None:
        self.cfg = cfg
        self.faults, self.metrics = faults, metrics
        self.timing = TimingModel(cfg)
        shape = cfg.model_shape()
        self.layers, self.experts = shape.num_moe_layers, shape.num_routed_experts
        self.ranks = int(cfg.ep)  # type: ignore[arg-type]
        self.router = ExpertRouter(self.layers, self.experts, shape.experts_per_token, seed=cfg.seed, skew=0.6)
        self.expert_map = expert_map or ExpertMap.default(self.layers, self.experts, self.ranks, cfg.slots_per_rank)
        self.kv_capacity = kv_capacity_tokens(cfg)  # per DP rank
        self.dp = int(cfg.dp)  # type: ignore[arg-type]
        self.rank_states = [RankState() for _ in range(self.dp)]
        self.waiting: collections.deque[Sequence] = collections.deque()
        self._retained = retained_tokens
        self._wake = asyncio.Event()
        self._rng = random.Random(cfg.seed + 1)
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._deadline = 0.0
        self._last_step_end = -1.0
        # accounting
        self.seq = 0
        self.cum_expert = np.zeros((self.layers, self.experts), dtype=np.int64)
        self.cum_rank = np.zeros((self.layers, self.ranks), dtype=np.int64)
        self._snapshots: collections.OrderedDict[int, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
        self._snapshots[0] = (self.cum_expert.copy(), self.cum_rank.copy())
        self._balance: collections.deque[tuple[float, float]] = collections.deque(maxlen=BALANCE_WINDOW)
        self.modelled_time = 0.0
        self.busy_steps = 0
        #: decode-only steps by batch tokens: tokens -> [steps, modelled s, modelled MoE s (experts + all-to-all)]
        self.decode_by_batch: dict[int, list[float]] = {}
        self.tokens_generated = 0
        self.tokens_prefilled = 0

    # ---- lifecycle -------------------------------------------------------------
    def start(self) -> None:
        """Start the step loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"sim-engine-{self.cfg.instance}")

    async def stop(self) -> None:
        """Stop the step loop."""
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    # ---- requests --------------------------------------------------------------
    def submit(self, prompt_tokens: int, max_tokens: int, prefilled: bool = False) -> Sequence:
        """Queue a request; ``prefilled`` means its KV arrived from a prefill instance."""
        if prompt_tokens + max_tokens > self.kv_capacity:
            raise EngineFull(
                f"prompt + max_tokens = {prompt_tokens + max_tokens} tokens exceed the KV cache of a DP rank "
                f"({self.kv_capacity} tokens)"
            )
        now = asyncio.get_running_loop().time()
        seq = Sequence(f"seq-{next(self._ids)}", prompt_tokens, max_tokens,
                       computed=prompt_tokens if prefilled else 0, arrival=now, last_token_at=now)
        self.waiting.append(seq)
        self._wake.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence (client went away); its slot frees at the next step."""
        seq.aborted = True
        self._wake.set()

    @property
    def num_running(self) -> int:
        """Sequences in the running batches."""
        return sum(len(r.running) for r in self.rank_states)

    @property
    def kv_usage(self) -> float:
        """KV cache use (reserved + retained for remote decode) / capacity, 0..1."""
        used = sum(r.kv_used for r in self.rank_states) + self._retained()
        return min(1.0, used / (self.kv_capacity * self.dp))

    # ---- expert map ------------------------------------------------------------
    def apply_map(self, m: ExpertMap) -> float:
        """Switch to ``m``; returns its expected balancedness under the current routing."""
        self.expert_map = m
        return balancedness(m.expected_rank_loads(self.router.probabilities()))

    def recent_balancedness(self) -> float:
        """vLLM balancedness over the last BALANCE_WINDOW busy steps (1.0 before any)."""
        mean = sum(a for a, _ in self._balance)
        mx = sum(b for _, b in self._balance)
        return mean / mx if mx > 0 else 1.0

    def load_since(self, since: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(current seq, expert load (L, E), rank load (L, R)) accumulated since ``since``; KeyError if unknown."""
        base_e, base_r = self._snapshots[since]
        seq = self.seq
        if seq not in self._snapshots:
            self._snapshots[seq] = (self.cum_expert.copy(), self.cum_rank.copy())
            while len(self._snapshots) > SNAPSHOTS_KEPT:
                oldest = next(iter(self._snapshots))
                if oldest == 0:
                    self._snapshots.move_to_end(0)
                    oldest = next(iter(self._snapshots))
                del self._snapshots[oldest]
        return seq, self.cum_expert - base_e, self.cum_rank - base_r

    # ---- the loop --------------------------------------------------------------
    def _admit(self) -> None:
        cap = self.kv_capacity - self._retained() / self.dp
        mns = int(self.cfg.max_num_seqs)  # type: ignore[arg-type]
        while self.waiting:
            seq = self.waiting[0]
            if seq.aborted:
                self.waiting.popleft()
                continue
            fits = [i for i, r in enumerate(self.rank_states) if len(r.running) < mns and r.kv_used + seq.reserve <= cap]
            if not fits:
                return
            i = min(fits, key=lambda k: (len(self.rank_states[k].running), self.rank_states[k].kv_used))
            self.waiting.popleft()
            seq.dp_rank = i
            self.rank_states[i].running.append(seq)
            self.rank_states[i].kv_used += seq.reserve

    def _build(self) -> tuple[list[RankBatch], list[tuple[Sequence, int]]]:
        """Per-rank batches and the (sequence, prefill tokens or 0 for decode) scheduled."""
        mbt = int(self.cfg.max_num_batched_tokens)  # type: ignore[arg-type]
        per_decode = 2 if self.cfg.mtp else 1
        batches: list[RankBatch] = []
        sched: list[tuple[Sequence, int]] = []
        for rs in self.rank_states:
            b = RankBatch()
            keep = []
            for s in rs.running:
                if s.aborted:
                    rs.kv_used -= s.reserve
                    continue
                keep.append(s)
                if s.computed >= s.prompt_tokens:
                    b.decode_tokens += per_decode
                    b.decode_context += s.prompt_tokens + s.generated
                    sched.append((s, 0))
            rs.running = keep
            budget = mbt - b.decode_tokens
            for s in keep:
                if budget <= 0:
                    break
                if s.computed < s.prompt_tokens:
                    n = min(budget, s.prompt_tokens - s.computed)
                    b.prefill_chunks.append((n, s.computed))
                    sched.append((s, n))
                    budget -= n
            batches.append(b)
        return batches, sched

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.faults.hang:
                await self.faults.wait_not_hung()
            self._admit()
            batches, sched = self._build()
            if not sched:
                self._wake.clear()
                if self.waiting or self.num_running:
                    await asyncio.sleep(0.001)  # requests blocked on KV room; let retained KV expire
                else:
                    await self._wake.wait()
                continue
            tokens = sum(b.tokens for b in batches)
            loads = self.router.route(tokens)
            rank_load, active = self.expert_map.rank_loads(loads)
            st = self.timing.step(batches, rank_load, active)
            if not any(b.prefill_chunks for b in batches):
                acc = self.decode_by_batch.setdefault(tokens, [0, 0.0, 0.0])
                acc[0] += 1
                acc[1] += st.total
                acc[2] += self.timing.scale * (st.experts + st.all2all)
            self.cum_expert += loads
            self.cum_rank += rank_load
            self.seq += 1
            self._balance.append((float(rank_load.mean(axis=1).sum()), float(rank_load.max(axis=1).sum())))
            now = loop.time()
            if self._deadline < now - 0.05:
                self._deadline = now  # idle or fell behind: do not try to catch up
            self._deadline += st.total / self.cfg.speedup
            delay = self._deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            self._apply(sched, st.total, loop.time())

    def _apply(self, sched: list[tuple[Sequence, int]], step_s: float, now: float) -> None:
        m = self.metrics
        m.steps += 1
        m.step.observe(step_s)
        self.modelled_time += step_s
        self.busy_steps += 1
        step_wall = now - self._last_step_end if self._last_step_end > 0 else None
        chained = 0
        new_tokens = 0
        for seq, n in sched:
            if seq.aborted or seq.finished:
                continue
            if n:
                seq.computed += n
                self.tokens_prefilled += n
                m.prompt_tokens += n
                if seq.computed < seq.prompt_tokens:
                    continue
                emit = 1
            else:
                emit = 1
                if self.cfg.mtp and self._rng.random() < self.cfg.mtp_acceptance:
                    emit = 2
            emit = min(emit, seq.max_tokens - seq.generated)
            if seq.first_token_at is None:
                seq.first_token_at = now
                m.ttft.observe(now - seq.arrival)
            elif seq.last_token_at == self._last_step_end and step_wall is not None:
                chained += 1
            else:
                m.itl.observe(now - seq.last_token_at)
            if emit > 1:
                m.itl.observe(0.0, emit - 1)
            seq.generated += emit
            seq.last_token_at = now
            new_tokens += emit
            if seq.generated >= seq.max_tokens:
                self._finish(seq, "length", now)
            seq.event.set()
        if chained and step_wall is not None:
            m.itl.observe(step_wall, chained)
        m.generation_tokens += new_tokens
        self.tokens_generated += new_tokens
        self._last_step_end = now

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        seq.finished, seq.finish_reason = True, reason
        rs = self.rank_states[seq.dp_rank]
        rs.running.remove(seq)
        rs.kv_used -= seq.reserve
        self.metrics.success[reason] = self.metrics.success.get(reason, 0) + 1
        self.metrics.e2e.observe(now - seq.arrival)
