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

All of it is vectorised over per-slot numpy arrays (see ``Engine``); idle time
is not caught up by later steps.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ascend_runtime.sim.capacity import kv_capacity_tokens
from ascend_runtime.sim.config import SimConfig
from ascend_runtime.sim.experts import ExpertMap, ExpertRouter, balancedness
from ascend_runtime.sim.faults import Faults
from ascend_runtime.sim.metrics import SimMetrics
from ascend_runtime.sim.timing import TimingModel

SNAPSHOTS_KEPT = 64
BALANCE_WINDOW = 64


class EngineFull(Exception):
    """A request that can never fit (longer than the KV cache of a DP rank)."""


class Sequence:
    """One request inside the engine. Times are loop (wall) seconds.

    While a sequence runs, its counters live in the engine's per-slot numpy
    arrays (``computed``, ``generated``, ``first_token_at``, ``last_token_at``
    read through); they are copied back when it finishes or is aborted.
    ``event`` is set when the sequence finishes, and, for a sequence submitted
    with ``stream=True``, after every step that gave it tokens.
    """

    __slots__ = ("req_id", "prompt_tokens", "max_tokens", "_computed", "_generated", "dp_rank", "arrival",
                 "_first_token_at", "_last_token_at", "finished", "finish_reason", "aborted", "event", "stream",
                 "_engine", "_slot")

    def __init__(self, req_id: str, prompt_tokens: int, max_tokens: int, computed: int = 0, arrival: float = 0.0,
                 last_token_at: float = 0.0, stream: bool = False) -> None:
        self.req_id, self.prompt_tokens, self.max_tokens = req_id, prompt_tokens, max_tokens
        self._computed, self._generated = computed, 0
        self.dp_rank = -1
        self.arrival = arrival
        self._first_token_at: float | None = None
        self._last_token_at = last_token_at
        self.finished = False
        self.finish_reason: str | None = None
        self.aborted = False
        self.event = asyncio.Event()
        self.stream = stream
        self._engine: Engine | None = None
        self._slot = -1

    @property
    def computed(self) -> int:
        """Prompt tokens whose KV exists."""
        return int(self._engine._computed[self._slot]) if self._slot >= 0 else self._computed  # type: ignore[union-attr]

    @property
    def generated(self) -> int:
        """Tokens generated so far."""
        return int(self._engine._gen[self._slot]) if self._slot >= 0 else self._generated  # type: ignore[union-attr]

    @property
    def first_token_at(self) -> float | None:
        if self._slot >= 0:
            e = self._engine
            return float(e._first_at[self._slot]) if e._has_first[self._slot] else None  # type: ignore[union-attr]
        return self._first_token_at

    @property
    def last_token_at(self) -> float:
        return float(self._engine._last[self._slot]) if self._slot >= 0 else self._last_token_at  # type: ignore[union-attr]

    @property
    def reserve(self) -> int:
        """KV tokens reserved for the sequence's whole life."""
        return self.prompt_tokens + self.max_tokens


@dataclass
class _Plan:
    """What one step computes: decoding slots, prefilling slots and their chunk sizes."""

    decode: np.ndarray
    prefill: np.ndarray
    chunks: np.ndarray
    tokens: int
    decode_tokens: np.ndarray
    decode_context: np.ndarray
    prefill_tokens: np.ndarray
    prefill_attn: np.ndarray


class Engine:
    """The simulated engine of one instance (all its DP ranks).

    Running sequences occupy slots ``0 .. dp * max_num_seqs - 1`` of per-slot
    numpy arrays, so a step's scheduling, token accounting, KV accounting and
    metrics are a few array operations whatever the batch; per-sequence Python
    runs only when a sequence is admitted or finishes, and for streaming
    sequences (one ``event.set()`` per step that gave them tokens).
    """

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
        self.max_num_seqs = int(cfg.max_num_seqs)  # type: ignore[arg-type]
        self.waiting: collections.deque[Sequence] = collections.deque()
        self._retained = retained_tokens
        self._wake = asyncio.Event()
        self._rng = np.random.default_rng(cfg.seed + 1)
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._deadline = 0.0
        self._last_step_end = -1.0
        # per-slot state of running sequences
        C = self.dp * self.max_num_seqs
        self._seqs: list[Sequence | None] = [None] * C
        self._active = np.zeros(C, dtype=bool)
        self._rank = np.zeros(C, dtype=np.int64)
        self._prompt = np.zeros(C, dtype=np.int64)
        self._max = np.zeros(C, dtype=np.int64)
        self._computed = np.zeros(C, dtype=np.int64)
        self._gen = np.zeros(C, dtype=np.int64)
        self._order = np.zeros(C, dtype=np.int64)
        self._arrival = np.zeros(C)
        self._last = np.zeros(C)
        self._first_at = np.zeros(C)
        self._has_first = np.zeros(C, dtype=bool)
        self._stream = np.zeros(C, dtype=bool)
        self._free = list(range(C - 1, -1, -1))
        self._admitted = 0
        self._aborts: list[Sequence] = []
        # per DP rank: running sequences and KV reserved (tokens)
        self._nrun = [0] * self.dp
        self._kv = [0] * self.dp
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
    def submit(self, prompt_tokens: int, max_tokens: int, prefilled: bool = False, stream: bool = False,
               req_id: str | None = None) -> Sequence:
        """Queue a request; ``prefilled`` means its KV arrived from a prefill instance.

        ``stream``: set ``seq.event`` after every step that gives the sequence tokens (not only at the end).
        ``req_id``: the engine-side request id (``api.engine_request_id``; default ``seq-N``). Like vLLM's
        engine-side ids it is made unique by the caller, so it is not checked here.
        """
        if prompt_tokens + max_tokens > self.kv_capacity:
            raise EngineFull(
                f"prompt + max_tokens = {prompt_tokens + max_tokens} tokens exceed the KV cache of a DP rank "
                f"({self.kv_capacity} tokens)"
            )
        now = asyncio.get_running_loop().time()
        seq = Sequence(req_id or f"seq-{next(self._ids)}", prompt_tokens, max_tokens,
                       computed=prompt_tokens if prefilled else 0, arrival=now, last_token_at=now, stream=stream)
        self.waiting.append(seq)
        self._wake.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence (client went away); its slot frees at the next step."""
        seq.aborted = True
        if seq._slot >= 0:
            self._aborts.append(seq)
        self._wake.set()

    @property
    def num_running(self) -> int:
        """Sequences in the running batches."""
        return sum(self._nrun)

    @property
    def kv_usage(self) -> float:
        """KV cache use (reserved + retained for remote decode) / capacity, 0..1."""
        used = sum(self._kv) + self._retained()
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
        """FCFS: each waiting sequence to the fitting rank with the fewest running (then least KV, lowest id)."""
        if not self.waiting:
            return
        cap = self.kv_capacity - self._retained() / self.dp
        mns = self.max_num_seqs
        nrun, kv = self._nrun, self._kv
        heap = [(nrun[r], kv[r], r) for r in range(self.dp) if nrun[r] < mns]
        heapq.heapify(heap)
        while self.waiting and heap:
            seq = self.waiting[0]
            if seq.aborted:
                self.waiting.popleft()
                continue
            reserve = seq.prompt_tokens + seq.max_tokens
            skipped = []
            pick = -1
            while heap:
                item = heapq.heappop(heap)
                if item[1] + reserve <= cap:
                    pick = item[2]
                    break
                skipped.append(item)
            for item in skipped:
                heapq.heappush(heap, item)
            if pick < 0:
                return
            self.waiting.popleft()
            nrun[pick] += 1
            kv[pick] += reserve
            if nrun[pick] < mns:
                heapq.heappush(heap, (nrun[pick], kv[pick], pick))
            self._place(seq, pick)

    def _place(self, seq: Sequence, rank: int) -> None:
        i = self._free.pop()
        seq.dp_rank, seq._engine, seq._slot = rank, self, i
        self._seqs[i] = seq
        self._active[i] = True
        self._rank[i] = rank
        self._prompt[i] = seq.prompt_tokens
        self._max[i] = seq.max_tokens
        self._computed[i] = seq._computed
        self._gen[i] = seq._generated
        self._order[i] = self._admitted
        self._admitted += 1
        self._arrival[i] = seq.arrival
        self._last[i] = seq._last_token_at
        self._has_first[i] = seq._first_token_at is not None
        self._first_at[i] = seq._first_token_at or 0.0
        self._stream[i] = seq.stream

    def _release(self, seq: Sequence) -> None:
        """Copy a slot's counters back to its sequence and free the slot and its KV reservation."""
        i = seq._slot
        seq._computed, seq._generated = int(self._computed[i]), int(self._gen[i])
        seq._last_token_at = float(self._last[i])
        seq._first_token_at = float(self._first_at[i]) if self._has_first[i] else None
        seq._slot = -1
        self._seqs[i] = None
        self._active[i] = False
        self._free.append(i)
        self._nrun[seq.dp_rank] -= 1
        self._kv[seq.dp_rank] -= seq.prompt_tokens + seq.max_tokens

    def _reap_aborts(self) -> None:
        if not self._aborts:
            return
        for seq in self._aborts:
            if seq._slot >= 0 and not seq.finished:
                self._release(seq)
        self._aborts.clear()

    def _build(self) -> _Plan | None:
        """The step's plan: every decoding sequence computes 1 token (2 with MTP), then prefill chunks FCFS per
        rank up to its max_num_batched_tokens. None when nothing runs."""
        self._reap_aborts()
        act = np.flatnonzero(self._active)
        if act.size == 0:
            return None
        dp = self.dp
        per_decode = 2 if self.cfg.mtp else 1
        comp, prompt = self._computed[act], self._prompt[act]
        is_dec = comp >= prompt
        dec = act[is_dec]
        dec_rank = self._rank[dec]
        dec_tokens = np.bincount(dec_rank, minlength=dp).astype(np.float64) * per_decode
        dec_ctx = np.bincount(dec_rank, weights=self._prompt[dec] + self._gen[dec], minlength=dp)
        pre = act[~is_dec]
        if pre.size:
            mbt = int(self.cfg.max_num_batched_tokens)  # type: ignore[arg-type]
            pre = pre[np.lexsort((self._order[pre], self._rank[pre]))]
            r = self._rank[pre]
            c = self._computed[pre]
            rem = self._prompt[pre] - c
            before = np.cumsum(rem) - rem  # tokens of earlier chunks, then made per rank
            first = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
            group = np.cumsum(np.r_[True, r[1:] != r[:-1]]) - 1
            before = before - before[first][group]
            budget = mbt - dec_tokens[r]
            n = np.clip(budget - before, 0, rem).astype(np.int64)
            keep = n > 0
            pre, n, r, c = pre[keep], n[keep], r[keep], c[keep]
            pre_tokens = np.bincount(r, weights=n, minlength=dp)
            pre_attn = np.bincount(r, weights=n * (c + n / 2.0), minlength=dp)
        else:
            n = np.zeros(0, dtype=np.int64)
            pre_tokens = pre_attn = np.zeros(dp)
        if dec.size == 0 and pre.size == 0:
            return None
        tokens = int(dec.size * per_decode + n.sum())
        return _Plan(dec, pre, n, tokens, dec_tokens, dec_ctx, pre_tokens, pre_attn)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if self.faults.hang:
                await self.faults.wait_not_hung()
            self._admit()
            plan = self._build()
            if plan is None:
                self._deadline = 0.0  # idle time is not caught up by the next steps
                self._wake.clear()
                if self.waiting or self.num_running:
                    await asyncio.sleep(0.001)  # requests blocked on KV room; let retained KV expire
                else:
                    await self._wake.wait()
                continue
            tokens = plan.tokens
            loads = self.router.route(tokens)
            rank_load, active = self.expert_map.rank_loads(loads)
            st = self.timing.step_ranks(plan.decode_tokens, plan.decode_context, plan.prefill_tokens,
                                        plan.prefill_attn, rank_load, active)
            if plan.prefill.size == 0:
                acc = self.decode_by_batch.setdefault(tokens, [0, 0.0, 0.0])
                acc[0] += 1
                acc[1] += st.total
                acc[2] += self.timing.scale * (st.experts + st.all2all)
            self.cum_expert += loads
            self.cum_rank += rank_load
            self.seq += 1
            self._balance.append((st.load_mean, st.load_max))
            now = loop.time()
            if self._deadline < now - 0.05:
                self._deadline = now  # idle or fell behind: do not try to catch up
            self._deadline += st.total / self.cfg.speedup
            delay = self._deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
            self._apply(plan, st.total, loop.time())

    def _apply(self, plan: _Plan, step_s: float, now: float) -> None:
        m = self.metrics
        m.steps += 1
        m.step.observe(step_s)
        self.modelled_time += step_s
        self.busy_steps += 1
        step_wall = now - self._last_step_end if self._last_step_end > 0 else None
        dec, pre, chunks = plan.decode, plan.prefill, plan.chunks
        if self._aborts:  # aborted while the step ran: drop them from it
            self._reap_aborts()
            ok = self._active[dec]
            dec = dec[ok]
            ok = self._active[pre]
            pre, chunks = pre[ok], chunks[ok]
        # prefill progress; a sequence whose prompt completes samples its first token
        if pre.size:
            self._computed[pre] += chunks
            n = int(chunks.sum())
            self.tokens_prefilled += n
            m.prompt_tokens += n
            pre = pre[self._computed[pre] >= self._prompt[pre]]
        emit = np.ones(dec.size, dtype=np.int64)
        if self.cfg.mtp and dec.size:
            emit += self._rng.random(dec.size) < self.cfg.mtp_acceptance
        em = np.concatenate([pre, dec]) if pre.size else dec
        if em.size == 0:
            self._last_step_end = now
            return
        if pre.size:
            emit = np.concatenate([np.ones(pre.size, dtype=np.int64), emit])
        gen = self._gen[em]
        emit = np.minimum(emit, self._max[em] - gen)
        # latencies: TTFT for first tokens, one step-wall ITL for sequences that also got a token last step,
        # the gap for the others, 0 for the extra (accepted MTP draft) tokens
        first = ~self._has_first[em]
        if first.any():
            f = em[first]
            m.ttft.observe_many(now - self._arrival[f])
            self._has_first[f] = True
            self._first_at[f] = now
            rest = em[~first]
        else:
            rest = em
        if rest.size:
            last = self._last[rest]
            chained = last == self._last_step_end if step_wall is not None else np.zeros(rest.size, dtype=bool)
            n_chained = int(chained.sum())
            if n_chained:
                m.itl.observe(step_wall, n_chained)  # type: ignore[arg-type]
            if n_chained < rest.size:
                m.itl.observe_many(now - last[~chained])
        extra = int((emit - 1).clip(min=0).sum())
        if extra:
            m.itl.observe(0.0, extra)
        gen = gen + emit
        self._gen[em] = gen
        self._last[em] = now
        new_tokens = int(emit.sum())
        m.generation_tokens += new_tokens
        self.tokens_generated += new_tokens
        self._last_step_end = now
        done = gen >= self._max[em]
        if done.any():
            fin = em[done]
            m.e2e.observe_many(now - self._arrival[fin])
            m.success["length"] = m.success.get("length", 0) + int(fin.size)
            seqs = self._seqs
            for i in fin.tolist():
                seq = seqs[i]
                seq.finished, seq.finish_reason = True, "length"  # type: ignore[union-attr]
                self._release(seq)  # type: ignore[arg-type]
                seq.event.set()  # type: ignore[union-attr]
            em = em[~done]
        if em.size:
            watched = em[self._stream[em]]
            if watched.size:
                seqs = self._seqs
                for i in watched.tolist():
                    seqs[i].event.set()  # type: ignore[union-attr]
