"""The P:D decision: a pure function of the forecast load, the pool and the planner's state.

Requirement per stage (instances, fractional; docs/pd-planner.md has the derivation):

    prefill: for n prompts per DP rank (1 .. max_num_batched_tokens // P):
             T = prefill_step_s(P, n), cap = dp * n / T (requests/s per instance),
             F = T + kv_transfer_s(P) (modelled TTFT without queueing),
             x = (TTFT_slo - F) / T, rho_ok = min(rho_max, 2x / (1 + 2x))   (M/D/1 mean wait T rho / 2(1 - rho) <= x T)
             need_p = min_n lambda / (cap * rho_ok)
    decode:  c = P + O / 2 (mean context), b = max_decode_batch(c, TPOT_slo) per DP rank,
             need_d = lambda * O * tpot(b) / (dp * b * rho_max)            (Little: sequences in decode / slots)

The optimum is (ceil need_p, ceil need_d), at least ``min_instances`` each: each stage's
count is minimal, so their sum of NPUs is. If it needs more nodes than the pool has, the
pool's split maximising min(p / need_p, d / need_d) is taken (reason ``pool_exhausted``).

A change is wanted only outside the margin band (up: ceil(need / (1 + margin)) > current;
down: ceil(need * (1 + margin)) < current), for ``k_intervals`` consecutive intervals in the
same direction (else ``hysteresis``), and at most ``max_changes_per_hour`` (else ``rate_limited``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ascend_runtime.perf import model as pm

#: Every reason a decision can carry (the ``reason`` label of the planner's metrics).
REASONS = ("slo_ttft", "slo_tpot", "scale_down", "idle", "steady", "hysteresis", "rate_limited", "pool_exhausted",
           "slo_unattainable", "no_data", "acting")


@dataclass(frozen=True)
class StagePool:
    """One stage's instance shape and the whole nodes one instance takes."""

    shape: pm.StageShape
    nodes_per_instance: int


@dataclass(frozen=True)
class Pool:
    """The nodes the planner may spread prefill and decode instances over."""

    nodes: int
    prefill: StagePool
    decode: StagePool

    def nodes_used(self, p: int, d: int) -> int:
        """Nodes ``p`` prefill and ``d`` decode instances take."""
        return p * self.prefill.nodes_per_instance + d * self.decode.nodes_per_instance

    def npus(self, p: int, d: int) -> int:
        """NPUs of ``p`` prefill and ``d`` decode instances."""
        return p * self.prefill.shape.npus + d * self.decode.shape.npus


@dataclass(frozen=True)
class Slo:
    """Latency objectives in seconds."""

    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Load:
    """Forecast of the next interval: requests/s, mean prompt and output tokens per request."""

    arrival_rate: float
    prompt_tokens: float
    output_tokens: float


@dataclass(frozen=True)
class PlannerConfig:
    """Decision knobs. ``rho_max``: highest modelled utilisation a stage is planned for."""

    rho_max: float = 0.85
    margin: float = 0.15
    k_intervals: int = 3
    max_changes_per_hour: int = 4
    idle_rate: float = 0.01  # requests/s below which the load counts as idle
    min_instances: int = 1
    mtp_acceptance: float = 0.9


@dataclass(frozen=True)
class PlannerState:
    """What the decision carries between intervals (times in seconds)."""

    streak: int = 0
    direction: tuple[int, int] = (0, 0)
    change_times: tuple[float, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Requirement:
    """Fractional instances each stage needs, and the modelled figures behind them (s, requests/s)."""

    need_p: float
    need_d: float
    prefill_batch: int
    prefill_step_s: float
    prefill_capacity: float
    ttft_floor_s: float
    decode_batch: int
    decode_tpot_s: float


@dataclass(frozen=True)
class Decision:
    """Target instance counts, whether they differ from the current ones, and why."""

    prefill: int
    decode: int
    reason: str
    change: bool
    optimum: tuple[int, int]
    requirement: Requirement | None
    state: PlannerState
    detail: str = ""
    #: Flexible groups in the prefill shape the decision wants (:func:`decide_split` only).
    prefill_groups: int | None = None


def requirement(load: Load, pool: Pool, slo: Slo, cfg: PlannerConfig) -> Requirement:
    """Fractional prefill and decode instances the load needs under the SLOs (inf: unattainable)."""
    P = max(1, round(load.prompt_tokens))
    O = max(1.0, load.output_tokens)
    lam = max(0.0, load.arrival_rate)
    sp, sd = pool.prefill.shape, pool.decode.shape
    kv = pm.kv_transfer_s(sp, P)
    best = (math.inf, 1, math.inf, 0.0, math.inf)
    for n in range(1, pm.max_prefill_batch(sp, P) + 1):
        T = pm.prefill_step_s(sp, P, n)
        cap = sp.dp * n / T
        floor = T + kv
        x = (slo.ttft_s - floor) / T
        if x <= 0:
            continue
        rho = min(cfg.rho_max, 2 * x / (1 + 2 * x))
        need = lam / (cap * rho)
        if need < best[0] or (need == best[0] and floor < best[4]):
            best = (need, n, T, cap, floor)
    need_p, n, T, cap, floor = best
    ctx = P + O / 2
    b = pm.max_decode_batch(sd, ctx, slo.tpot_s, cfg.mtp_acceptance)
    if b == 0:
        need_d, tpot = math.inf, math.inf
    else:
        tpot = pm.decode_tpot_s(sd, b, ctx, cfg.mtp_acceptance)
        need_d = lam * O * tpot / (sd.dp * b * cfg.rho_max)
    return Requirement(need_p, need_d, n, T, cap, floor, b, tpot)


def _pool_split(pool: Pool, need_p: float, need_d: float, lo: int) -> tuple[int, int]:
    """The split within the pool maximising min(p / need_p, d / need_d), then fewer NPUs."""
    best: tuple[float, int, int, int] | None = None
    for p in range(lo, pool.nodes // pool.prefill.nodes_per_instance + 1):
        left = pool.nodes - p * pool.prefill.nodes_per_instance
        d = left // pool.decode.nodes_per_instance
        if d < lo:
            break
        d = min(d, max(lo, math.ceil(need_d)))
        score = min(p / need_p if need_p > 0 else math.inf, d / need_d if need_d > 0 else math.inf)
        key = (score, -pool.npus(p, d), p, d)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        return lo, lo
    return best[2], best[3]


def _ceil(x: float, lo: int) -> int:
    return max(lo, pm.ceil_div(x, 1.0)) if math.isfinite(x) else lo


def decide(load: Load | None, current: tuple[int, int], pool: Pool, slo: Slo, cfg: PlannerConfig,
           state: PlannerState, now: float) -> Decision:
    """Target (prefill, decode) instances for the next interval; ``now`` in seconds (for the rate limit)."""
    cur_p, cur_d = current
    lo = cfg.min_instances
    if load is None:
        return Decision(cur_p, cur_d, "no_data", False, current, None, replace(state, streak=0, direction=(0, 0)))
    req = requirement(load, pool, slo, cfg)
    detail = ""
    if load.arrival_rate < cfg.idle_rate:
        opt = (lo, lo)
        base = "idle"
        wanted = opt != current
    elif not (math.isfinite(req.need_p) and math.isfinite(req.need_d)):
        which = "TTFT" if not math.isfinite(req.need_p) else "TPOT"
        return Decision(cur_p, cur_d, "slo_unattainable", False, current, req,
                        replace(state, streak=0, direction=(0, 0)),
                        f"the {which} SLO cannot be met by this instance shape at any load")
    else:
        opt = (_ceil(req.need_p, lo), _ceil(req.need_d, lo))
        up_p = _ceil(req.need_p / (1 + cfg.margin), lo) > cur_p
        up_d = _ceil(req.need_d / (1 + cfg.margin), lo) > cur_d
        down_p = _ceil(req.need_p * (1 + cfg.margin), lo) < cur_p
        down_d = _ceil(req.need_d * (1 + cfg.margin), lo) < cur_d
        if pool.nodes_used(*opt) > pool.nodes:
            split = _pool_split(pool, req.need_p, req.need_d, lo)
            base = "pool_exhausted"
            detail = (f"optimum {opt[0]}P + {opt[1]}D needs {pool.nodes_used(*opt)} nodes, pool has {pool.nodes}; "
                      f"best split {split[0]}P + {split[1]}D")
            score = lambda p, d: min(p / req.need_p if req.need_p else math.inf,
                                     d / req.need_d if req.need_d else math.inf)
            wanted = split != current and score(*split) > score(cur_p, cur_d) * (1 + cfg.margin)
            opt = split
        else:
            wanted = up_p or up_d or down_p or down_d
            if opt[0] > cur_p and opt[1] > cur_d:
                base = "slo_ttft" if req.need_p / cur_p >= req.need_d / cur_d else "slo_tpot"
            elif opt[0] > cur_p:
                base = "slo_ttft"
            elif opt[1] > cur_d:
                base = "slo_tpot"
            else:
                base = "scale_down"
            # a move inside the band in one stage rides along with a wanted move of the other
    if not wanted:
        reason = "pool_exhausted" if base == "pool_exhausted" else ("steady" if opt == current else "hysteresis")
        return Decision(cur_p, cur_d, reason, False, opt, req, replace(state, streak=0, direction=(0, 0)),
                        detail or ("" if reason == "steady" else "inside the margin band"))
    direction = ((opt[0] > cur_p) - (opt[0] < cur_p), (opt[1] > cur_d) - (opt[1] < cur_d))
    streak = state.streak + 1 if direction == state.direction else 1
    if streak < cfg.k_intervals:
        return Decision(cur_p, cur_d, "hysteresis", False, opt, req, replace(state, streak=streak, direction=direction),
                        f"{base} wanted for {streak} of {cfg.k_intervals} intervals")
    recent = tuple(t for t in state.change_times if now - t < 3600.0)
    if len(recent) >= cfg.max_changes_per_hour:
        return Decision(cur_p, cur_d, "rate_limited", False, opt, req,
                        PlannerState(streak, direction, recent),
                        f"{base} held: {len(recent)} changes in the last hour (limit {cfg.max_changes_per_hour})")
    return Decision(opt[0], opt[1], base, True, opt, req, PlannerState(0, (0, 0), recent + (now,)), detail)


@dataclass(frozen=True)
class GroupPool:
    """A stack's pool with flexible node groups (``pd_ratio.mode: auto``).

    ``fixed_prefill`` / ``fixed_decode`` instances always run; each of ``groups`` groups runs either
    ``per_group_prefill`` prefill or ``per_group_decode`` decode instances. ``min_prefill`` /
    ``min_decode``: fewest instances of each stage in service.
    """

    prefill: StagePool
    decode: StagePool
    fixed_prefill: int
    fixed_decode: int
    groups: int
    per_group_prefill: int
    per_group_decode: int
    min_prefill: int = 1
    min_decode: int = 1

    def counts(self, k: int) -> tuple[int, int]:
        """(prefill, decode) instances with ``k`` groups in the prefill shape."""
        return (self.fixed_prefill + k * self.per_group_prefill,
                self.fixed_decode + (self.groups - k) * self.per_group_decode)

    def feasible(self) -> list[int]:
        """Group splits that keep both minimums."""
        return [k for k in range(self.groups + 1)
                if self.counts(k)[0] >= self.min_prefill and self.counts(k)[1] >= self.min_decode]

    def as_pool(self) -> Pool:
        """The same nodes as a :class:`Pool` (for :func:`requirement`)."""
        nodes = (self.fixed_prefill * self.prefill.nodes_per_instance + self.fixed_decode * self.decode.nodes_per_instance
                 + self.groups * self.per_group_prefill * self.prefill.nodes_per_instance)
        return Pool(nodes, self.prefill, self.decode)


def headroom(pool: GroupPool, k: int, req: Requirement) -> float:
    """min over stages of instances / needed instances with ``k`` prefill groups (inf: no load)."""
    p, d = pool.counts(k)
    hp = p / req.need_p if req.need_p > 0 else math.inf
    hd = d / req.need_d if req.need_d > 0 else math.inf
    return min(hp, hd)


def decide_split(load: Load | None, current_k: int, pool: GroupPool, slo: Slo, cfg: PlannerConfig,
                 state: PlannerState, now: float) -> Decision:
    """How many flexible groups serve prefill next (``prefill_groups``), the others serving decode.

    The pool's NPUs are all in service whatever the split. Headroom is min(p / need_p, d / need_d);
    the target is the split nearest the current one (fewest groups moved) whose headroom is at least
    1 + margin, or, when none is, the split with the most headroom. A move is wanted only when
    the current split is short or near it (headroom below 1 + margin) and the best split's headroom
    beats it by the margin; it then passes the same K-interval streak and hourly limit as
    :func:`decide`. Reasons: ``slo_ttft`` (groups move to prefill), ``slo_tpot`` (to decode),
    ``pool_exhausted`` (even the best split is short; moved if it helps, else held), ``steady``,
    ``hysteresis``, ``rate_limited``, ``idle`` (no load: nothing moves), ``slo_unattainable``, ``no_data``.
    """
    cur = pool.counts(current_k)
    keep = lambda reason, st, detail="", req=None, opt=cur: Decision(  # noqa: E731
        cur[0], cur[1], reason, False, opt, req, st, detail, current_k)
    reset = replace(state, streak=0, direction=(0, 0))
    if load is None:
        return keep("no_data", reset)
    req = requirement(load, pool.as_pool(), slo, cfg)
    if load.arrival_rate < cfg.idle_rate:
        return keep("idle", reset, "no load: the split is kept", req)
    if not (math.isfinite(req.need_p) and math.isfinite(req.need_d)):
        which = "TTFT" if not math.isfinite(req.need_p) else "TPOT"
        return keep("slo_unattainable", reset, f"the {which} SLO cannot be met by this instance shape at any load", req)
    ks = pool.feasible() or [current_k]
    enough = [k for k in ks if headroom(pool, k, req) >= 1 + cfg.margin]
    if enough:  # the fewest groups moved that give both stages the margin (then the most headroom)
        best = min(enough, key=lambda k: (abs(k - current_k), -headroom(pool, k, req)))
    else:  # the pool is short whatever the split: the most headroom
        best = max(ks, key=lambda k: (headroom(pool, k, req), -abs(k - current_k)))
    h_cur, h_best = headroom(pool, current_k, req), headroom(pool, best, req)
    opt = pool.counts(best)
    detail = (f"headroom {h_cur:.2f} with {current_k} prefill groups, {h_best:.2f} with {best} "
              f"(need {req.need_p:.2f}P + {req.need_d:.2f}D)")
    if best == current_k or h_cur >= 1 + cfg.margin or h_best <= h_cur * (1 + cfg.margin):
        if best == current_k:
            reason = "pool_exhausted" if h_cur < 1 else "steady"
        else:
            reason = "steady" if h_cur >= 1 + cfg.margin else ("pool_exhausted" if h_best < 1 else "hysteresis")
        return keep(reason, reset, detail, req, opt)
    base = "slo_ttft" if best > current_k else "slo_tpot"
    if h_best < 1:
        base = "pool_exhausted"
    direction = (1 if best > current_k else -1, -1 if best > current_k else 1)
    streak = state.streak + 1 if direction == state.direction else 1
    if streak < cfg.k_intervals:
        return keep("hysteresis", replace(state, streak=streak, direction=direction),
                    f"{base} wanted for {streak} of {cfg.k_intervals} intervals; {detail}", req, opt)
    recent = tuple(t for t in state.change_times if now - t < 3600.0)
    if len(recent) >= cfg.max_changes_per_hour:
        return keep("rate_limited", PlannerState(streak, direction, recent),
                    f"{base} held: {len(recent)} changes in the last hour (limit {cfg.max_changes_per_hour}); {detail}",
                    req, opt)
    return Decision(opt[0], opt[1], base, True, opt, req, PlannerState(0, (0, 0), recent + (now,)), detail, best)
