"""Continuous-batching engine core: scheduler, step loop, expert-load accounting.

One asyncio task runs steps. Each step:

1. admits waiting sequences FCFS to the DP rank with the fewest running ones,
   while that rank has fewer than ``max_num_seqs`` running and KV room for
   prompt + max_tokens tokens (reserved up front, so no preemption); a
   sequence submitted for one DP rank (rank serving: it reached that rank's
   own API server) is admitted to that rank only, FCFS among that rank's;
2. builds each rank's batch: every decoding sequence computes 1 token (2 with
   MTP), then prefilling sequences take chunks FCFS up to the rank's
   ``max_num_batched_tokens`` (chunked prefill);
3. routes all of the step's tokens to experts, maps them to EP ranks through
   the current expert map, and asks the timing model for the step time;
4. sleeps until ``step / speedup`` after the previous step's end (absolute
   deadlines, so Python overhead does not add up), then applies progress: a
   sequence whose prefill completes samples its first token; each decoding
   sequence gets one token (plus the MTP draft token with probability
   ``mtp_acceptance``); a sequence reaching ``max_tokens`` finishes, with the
   finish reason its request planned (``length``, or ``stop`` for a stop
   string, stop token or EOS: the API layer knows up front where the
   deterministic text stops and submits that many tokens).

All of it is vectorised over per-slot numpy arrays (see ``Engine``); idle time
is not caught up by later steps. Metrics are per DP rank (vLLM's ``engine``
label) and follow what vLLM 0.23.0 records (vllm/v1/metrics/stats.py): prompt
tokens when a request's first token comes out (the whole prompt, also on a
decode instance whose KV was transferred: ``PrefillStats`` counts it, by source
``external_kv_transfer``); TTFT from the request's arrival at the instance
(before a KV pull); queue time from arrival to the first scheduling; one
inter-token latency per sequence and step, however many tokens (MTP) the step
gave it; request-level histograms when a request finishes.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ascend_runtime.perf.capacity import kv_capacity_tokens
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.perf.timing import TimingModel
from ascend_runtime.sim.experts import ExpertMap, ExpertRouter, balancedness
from ascend_runtime.sim.faults import Faults
from ascend_runtime.sim.metrics import SimMetrics
from ascend_runtime.sim.prefix_cache import PrefixCache

SNAPSHOTS_KEPT = 64
BALANCE_WINDOW = 64


class EngineFull(Exception):
    """A request that can never fit (longer than the KV cache of a DP rank)."""


class RequestGroup:
    """The ``n`` choices of one prompt (vLLM's ``ParentRequest``, vllm/v1/engine/parallel_sampling.py): when the
    last one finishes, ``vllm:request_params_n`` and ``vllm:request_max_num_generation_tokens`` are observed."""

    __slots__ = ("n", "left", "max_generated")

    def __init__(self, n: int) -> None:
        self.n, self.left, self.max_generated = n, n, 0


class Sequence:
    """One request inside the engine. Times are loop (wall) seconds.

    While a sequence runs, its counters live in the engine's per-slot numpy
    arrays (``computed``, ``generated``, ``first_token_at``, ``last_token_at``
    read through); they are copied back when it finishes or is aborted.
    ``event`` (which the sequences of one request may share) is set when the
    sequence finishes, and, for a sequence submitted with ``stream=True``, after
    every step that gave it tokens. ``end_reason`` is the finish reason it gets
    on reaching ``max_tokens``.
    """

    __slots__ = ("req_id", "prompt_tokens", "max_tokens", "_computed", "_generated", "dp_rank", "arrival",
                 "_first_token_at", "_last_token_at", "finished", "finish_reason", "aborted", "event", "stream",
                 "_engine", "_slot", "end_reason", "group", "max_tokens_param", "cached", "block_hashes", "pin")

    def __init__(self, req_id: str, prompt_tokens: int, max_tokens: int, computed: int = 0, arrival: float = 0.0,
                 last_token_at: float = 0.0, stream: bool = False, end_reason: str = "length",
                 event: asyncio.Event | None = None, group: RequestGroup | None = None,
                 max_tokens_param: int | None = None, block_hashes: list[bytes] | None = None) -> None:
        self.req_id, self.prompt_tokens, self.max_tokens = req_id, prompt_tokens, max_tokens
        #: Chained hashes of the prompt's full KV blocks (sim/prefix_cache.py); None: not cacheable.
        self.block_hashes = block_hashes
        self._computed, self._generated = computed, 0
        #: Prompt tokens whose KV arrived from elsewhere (a KV transfer); not computed here.
        self.cached = computed
        self.dp_rank = -1
        self.arrival = arrival
        self._first_token_at: float | None = None
        self._last_token_at = last_token_at
        self.finished = False
        self.finish_reason: str | None = None
        self.end_reason = end_reason
        self.aborted = False
        self.event = event if event is not None else asyncio.Event()
        self.stream = stream
        self.group = group
        self.max_tokens_param = max_tokens if max_tokens_param is None else max_tokens_param
        self._engine: Engine | None = None
        self._slot = -1
        #: The DP rank the sequence must run on (rank serving), or None: the scheduler picks.
        self.pin: int | None = None

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
        #: One automatic prefix cache per DP rank (each vLLM engine core has its own KV cache manager).
        self.block_size = int(cfg.block_size)
        self.prefix_caches: list[PrefixCache] | None = (
            [PrefixCache(self.kv_capacity // self.block_size, self.block_size) for _ in range(self.dp)]
            if cfg.enable_prefix_caching else None)
        metrics.configure(self.dp, shape.max_model_len, spec_decode=cfg.mtp)
        #: Requests waiting for their KV transfer before they are submitted (vLLM's WAITING_FOR_REMOTE_KVS).
        self.deferred = 0
        #: Of ``deferred``, those bound for one DP rank (rank serving), per rank.
        self.deferred_pinned = [0] * self.dp
        #: Waiting sequences bound for one DP rank (rank serving), per rank.
        self._waiting_pinned = [0] * self.dp
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
        self._sched = np.zeros(C)  # first scheduled (admitted)
        self._cached = np.zeros(C, dtype=np.int64)  # prompt tokens whose KV was transferred
        self._local_hit = np.zeros(C, dtype=np.int64)  # prompt tokens found in the local prefix cache
        self._maxparam = np.zeros(C, dtype=np.int64)
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
               req_id: str | None = None, *, arrival: float | None = None, end_reason: str = "length",
               event: asyncio.Event | None = None, group: RequestGroup | None = None,
               max_tokens_param: int | None = None, block_hashes: list[bytes] | None = None,
               dp_rank: int | None = None) -> Sequence:
        """Queue a request; ``prefilled`` means its KV arrived from a prefill instance.

        ``stream``: set ``seq.event`` after every step that gives the sequence tokens (not only at the end).
        ``req_id``: the engine-side request id (``api.engine_request_ids``; default ``seq-N``). Like vLLM's
        engine-side ids it is made unique by the caller, so it is not checked here. ``arrival``: when the
        request reached the instance (loop time; default now), the start of its TTFT and queue time.
        ``end_reason``: the finish reason at ``max_tokens``; ``event``: an event to share with the request's
        other sequences; ``group``: its choices' group; ``max_tokens_param``: its ``max_tokens`` parameter.
        ``block_hashes``: the prompt's block hashes (``prefix_cache.request_block_hashes``), looked up in the
        DP rank's prefix cache when the sequence is first scheduled (not for ``prefilled`` ones).
        ``dp_rank``: run on this DP rank only (rank serving: the request reached that rank's API server, as
        with vLLM's ``--data-parallel-rank``, where each rank's server fronts its own engine core); None: the
        rank with the fewest running sequences.
        """
        if dp_rank is not None and not 0 <= dp_rank < self.dp:
            raise ValueError(f"dp_rank {dp_rank} is not a DP rank of this instance (0..{self.dp - 1})")
        self.check_fits(prompt_tokens, max_tokens)
        now = asyncio.get_running_loop().time()
        seq = Sequence(req_id or f"seq-{next(self._ids)}", prompt_tokens, max_tokens,
                       computed=prompt_tokens if prefilled else 0, arrival=now if arrival is None else arrival,
                       last_token_at=now, stream=stream, end_reason=end_reason, event=event, group=group,
                       max_tokens_param=max_tokens_param, block_hashes=block_hashes)
        if dp_rank is not None:
            seq.pin = dp_rank
            self._waiting_pinned[dp_rank] += 1
        self.waiting.append(seq)
        self._wake.set()
        return seq

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Raise :class:`EngineFull` for a sequence that can never fit a DP rank's KV cache."""
        if prompt_tokens + max_tokens > self.kv_capacity:
            raise EngineFull(
                f"prompt + max_tokens = {prompt_tokens + max_tokens} tokens exceed the KV cache of a DP rank "
                f"({self.kv_capacity} tokens)"
            )

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

    def kv_usage_by_rank(self) -> np.ndarray:
        """KV cache use per DP rank, 0..1 (KV retained for remote decodes spread evenly over the ranks)."""
        used = np.asarray(self._kv, dtype=np.float64) + self._retained() / self.dp
        return np.minimum(1.0, used / self.kv_capacity)

    def running_by_rank(self) -> np.ndarray:
        """Running sequences per DP rank."""
        return np.asarray(self._nrun, dtype=np.float64)

    def waiting_by_rank(self) -> np.ndarray:
        """Waiting sequences per DP rank: those bound for a rank on it, the others spread (:meth:`spread`)."""
        pinned = np.asarray(self._waiting_pinned, dtype=np.float64)
        return pinned + self.spread(len(self.waiting) - int(pinned.sum()))

    def deferred_by_rank(self) -> np.ndarray:
        """Requests waiting for their KV transfer per DP rank: those bound for a rank on it, the others spread."""
        pinned = np.asarray(self.deferred_pinned, dtype=np.float64)
        return pinned + self.spread(self.deferred - int(pinned.sum()))

    def spread(self, count: int) -> np.ndarray:
        """``count`` spread over the DP ranks (the simulator has one FCFS queue for all of them)."""
        base, extra = divmod(int(count), self.dp)
        out = np.full(self.dp, float(base))
        out[:extra] += 1.0
        return out
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
        if any(self._waiting_pinned):
            self._admit_pinned()
            return
        cap = self.kv_capacity - self._retained() / self.dp
        mns = self.max_num_seqs
        nrun, kv = self._nrun, self._kv
        heap = [(nrun[r], kv[r], r) for r in range(self.dp) if nrun[r] < mns]
        heapq.heapify(heap)
        now = asyncio.get_running_loop().time()
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
            self._place(seq, pick, now)

    def _admit_pinned(self) -> None:
        """FCFS with sequences bound for one DP rank among the waiting: each rank admits its own in arrival order
        (a head that does not fit holds back that rank's later ones, as one engine core's scheduler does), and
        an unbound sequence takes the fitting rank with the fewest running, as :meth:`_admit`."""
        cap = self.kv_capacity - self._retained() / self.dp
        mns = self.max_num_seqs
        nrun, kv = self._nrun, self._kv
        blocked = [nrun[r] >= mns for r in range(self.dp)]
        free_blocked = False  # an unbound sequence found no rank: later unbound ones wait behind it
        keep: collections.deque[Sequence] = collections.deque()
        now = asyncio.get_running_loop().time()
        while self.waiting:
            seq = self.waiting.popleft()
            r = seq.pin
            if seq.aborted:
                if r is not None:
                    self._waiting_pinned[r] -= 1
                continue
            reserve = seq.prompt_tokens + seq.max_tokens
            if r is None:
                fits = [q for q in range(self.dp) if not blocked[q] and kv[q] + reserve <= cap]
                if free_blocked or not fits:
                    free_blocked = True
                    keep.append(seq)
                    continue
                r = min(fits, key=lambda q: (nrun[q], kv[q], q))
            elif blocked[r] or kv[r] + reserve > cap:
                blocked[r] = True
                keep.append(seq)
                if all(blocked):
                    break
                continue
            else:
                self._waiting_pinned[r] -= 1
            nrun[r] += 1
            kv[r] += reserve
            blocked[r] = blocked[r] or nrun[r] >= mns
            self._place(seq, r, now)
        keep.extend(self.waiting)
        self.waiting = keep

    def _place(self, seq: Sequence, rank: int, now: float) -> None:
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
        self._sched[i] = now
        self._cached[i] = seq.cached
        self._maxparam[i] = seq.max_tokens_param
        # the scheduler's cache lookups when it first schedules a request (vllm/v1/core/sched/scheduler.py):
        # the local prefix cache (KVCacheManager.get_computed_blocks; queries only with caching enabled), then
        # the KV connector. A sequence whose KV was transferred is not looked up locally (hits 0).
        m = self.metrics
        hit = 0
        caches = self.prefix_caches
        if caches is not None:
            m.prefix_queries[rank] += seq.prompt_tokens
            if seq.block_hashes and seq._computed == 0:
                hit = caches[rank].lookup(seq.block_hashes, seq.prompt_tokens)
                m.prefix_hits[rank] += hit
                self._computed[i] = hit
        self._local_hit[i] = hit
        m.external_queries[rank] += seq.prompt_tokens
        m.external_hits[rank] += seq.cached

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
        dp = self.dp
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
            self.tokens_prefilled += int(chunks.sum())
            pre = pre[self._computed[pre] >= self._prompt[pre]]
            if pre.size and self.prefix_caches is not None:
                self._cache_prompts(pre)
        emit = np.ones(dec.size, dtype=np.int64)
        if self.cfg.mtp and dec.size:
            accepted = self._rng.random(dec.size) < self.cfg.mtp_acceptance
            emit += accepted
            # one draft token per decoding sequence (vllm/v1/spec_decode/metrics.py SpecDecodingStats)
            r = self._rank[dec]
            drafts = np.bincount(r, minlength=dp)
            m.spec_drafts += drafts
            m.spec_draft_tokens += drafts
            m.spec_accepted += np.bincount(r, weights=accepted, minlength=dp)
        em = np.concatenate([pre, dec]) if pre.size else dec
        if em.size == 0:
            self._last_step_end = now
            return
        if pre.size:
            emit = np.concatenate([np.ones(pre.size, dtype=np.int64), emit])
        ranks = self._rank[em]
        gen = self._gen[em]
        emit = np.minimum(emit, self._max[em] - gen)
        # latencies: TTFT for first tokens (from arrival), then one inter-token latency per sequence: a step's
        # wall time for sequences that also got a token last step, the gap for the others
        first = ~self._has_first[em]
        computed_prompt = None
        if first.any():
            f, fr = em[first], ranks[first]
            m.ttft.observe_many(now - self._arrival[f], fr)
            self._has_first[f] = True
            self._first_at[f] = now
            # prompt tokens are counted when the first token comes out (IterationStats.update_from_output)
            prompt, cached, local = self._prompt[f], self._cached[f], self._local_hit[f]
            m.prompt_tokens += np.bincount(fr, weights=prompt, minlength=dp)
            computed_prompt = np.bincount(fr, weights=prompt - cached - local, minlength=dp)
            m.prompt_by_source["local_compute"] += computed_prompt
            external = np.bincount(fr, weights=cached, minlength=dp)
            local_hit = np.bincount(fr, weights=local, minlength=dp)
            m.prompt_by_source["external_kv_transfer"] += external
            m.prompt_by_source["local_cache_hit"] += local_hit
            m.prompt_cached += external + local_hit
            rest, rest_ranks = em[~first], ranks[~first]
        else:
            rest, rest_ranks = em, ranks
        if rest.size:
            last = self._last[rest]
            chained = last == self._last_step_end if step_wall is not None else np.zeros(rest.size, dtype=bool)
            if chained.any():
                m.itl.observe_many(np.full(int(chained.sum()), step_wall), rest_ranks[chained])
            if not chained.all():
                m.itl.observe_many(now - last[~chained], rest_ranks[~chained])
        gen = gen + emit
        self._gen[em] = gen
        self._last[em] = now
        per_rank = np.bincount(ranks, weights=emit, minlength=dp)
        m.generation_tokens += per_rank
        new_tokens = int(emit.sum())
        self.tokens_generated += new_tokens
        # vllm:iteration_tokens_total: prompt tokens computed by the requests that got their first token, plus
        # the generated tokens, per engine that had outputs
        if computed_prompt is not None:
            per_rank = per_rank + computed_prompt
        busy = np.flatnonzero(per_rank > 0)
        m.iteration_tokens.observe_many(per_rank[busy], busy)
        self._last_step_end = now
        done = gen >= self._max[em]
        if done.any():
            fin, fr, g = em[done], ranks[done], gen[done]
            self._finish_stats(fin, fr, g, now)
            seqs = self._seqs
            success = m.success
            for i, r, n_gen in zip(fin.tolist(), fr.tolist(), g.tolist()):
                seq = seqs[i]
                seq.finished, seq.finish_reason = True, seq.end_reason  # type: ignore[union-attr]
                success[seq.end_reason][r] += 1  # type: ignore[union-attr]
                grp = seq.group  # type: ignore[union-attr]
                if grp is not None:
                    grp.left -= 1
                    grp.max_generated = max(grp.max_generated, n_gen)
                    if grp.left == 0:  # parallel_sampling.py observe_finished_request
                        m.max_generation.observe(grp.max_generated, 1, r)
                        m.params_n.observe(grp.n, 1, r)
                else:
                    m.max_generation.observe(n_gen, 1, r)
                    m.params_n.observe(1, 1, r)
                self._release(seq)  # type: ignore[arg-type]
                seq.event.set()  # type: ignore[union-attr]
            em = em[~done]
        if em.size:
            watched = em[self._stream[em]]
            if watched.size:
                seqs = self._seqs
                for i in watched.tolist():
                    seqs[i].event.set()  # type: ignore[union-attr]

    def _cache_prompts(self, done: np.ndarray) -> None:
        """Put the full blocks of the prompts whose prefill completed this step into their rank's prefix cache
        (blocks are cached as they are computed, block_pool.py ``cache_full_blocks``)."""
        caches, bs, seqs = self.prefix_caches, self.block_size, self._seqs
        assert caches is not None
        for i, r in zip(done.tolist(), self._rank[done].tolist()):
            hashes = seqs[i].block_hashes  # type: ignore[union-attr]
            if hashes:
                reserved = -(-self._kv[r] // bs)
                caches[r].insert(hashes, reserved)

    def _finish_stats(self, fin: np.ndarray, ranks: np.ndarray, generated: np.ndarray, now: float) -> None:
        """Request-level histograms of finished slots (stats.py ``update_from_finished_request``)."""
        m = self.metrics
        arrival, sched, first = self._arrival[fin], self._sched[fin], self._first_at[fin]
        decode = now - first
        m.e2e.observe_many(now - arrival, ranks)
        m.queue.observe_many(sched - arrival, ranks)
        m.prefill_time.observe_many(first - sched, ranks)
        m.inference.observe_many(now - sched, ranks)
        m.decode_time.observe_many(decode, ranks)
        m.tpot.observe_many(np.where(generated > 1, decode / np.maximum(generated - 1, 1), 0.0), ranks)
        prompt = self._prompt[fin]
        m.request_prompt.observe_many(prompt, ranks)
        m.request_generation.observe_many(generated, ranks)
        m.prefill_kv_computed.observe_many(prompt - self._cached[fin] - self._local_hit[fin], ranks)
        maxp = self._maxparam[fin]
        has = maxp > 0
        m.params_max_tokens.observe_many(maxp[has], ranks[has])
