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

The group split (:func:`decide_split`) adds three change rules (docs/pd-planner.md, "Change rules"):
the measured prefill backlog is sized into need_p (:func:`with_backlog`), a move to prefill skips the
streak when the TTFT projected one interval ahead is ``evidence_factor`` x the SLO on both the forecast
and the measured backlog growth (:func:`overwhelming`), and groups moved with a backlog term return
to decode once it is cleared (reason ``backlog_cleared``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from ascend_runtime.perf import model as pm

#: Every reason a decision can carry (the ``reason`` label of the planner's metrics).
REASONS = ("slo_ttft", "slo_tpot", "scale_down", "idle", "steady", "hysteresis", "rate_limited", "pool_exhausted",
           "observed_slo_miss",
           "slo_unattainable", "no_data", "acting", "backlog_cleared")


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
    """Forecast of the next interval: requests/s, mean prompt and output tokens per request.

    ``backlog``: requests waiting for (or in) prefill at the end of the last interval, as measured
    (the proxy's ``inflight{role="prefill"}``); ``backlog_growth``: its measured change over that
    interval in requests/s (None: not measured). Both 0 / None leave the decision to the rate alone.
    """

    arrival_rate: float
    prompt_tokens: float
    output_tokens: float
    backlog: float = 0.0
    backlog_growth: float | None = None
    #: the median TTFT and TPOT (s) the proxy measured over the last interval (None: not measured)
    ttft_observed_s: float | None = None
    tpot_observed_s: float | None = None

    def missed(self, slo: "Slo") -> tuple[bool, bool]:
        """(prefill, decode): whether the measured median TTFT resp. TPOT is over its SLO. What is measured
        overrules the model: a stage whose clients wait too long is never given fewer instances."""
        ttft = self.ttft_observed_s is not None and self.ttft_observed_s > slo.ttft_s
        tpot = self.tpot_observed_s is not None and self.tpot_observed_s > slo.tpot_s
        return ttft, tpot

    def miss_detail(self, slo: "Slo") -> str:
        """The measured misses in words ("" when none)."""
        ttft, tpot = self.missed(slo)
        words = []
        if ttft:
            words.append(f"measured median TTFT {self.ttft_observed_s * 1000:.0f} ms > SLO {slo.ttft_s * 1000:.0f} ms")
        if tpot:
            words.append(f"measured median TPOT {self.tpot_observed_s * 1000:.0f} ms > SLO {slo.tpot_s * 1000:.0f} ms")
        return "; ".join(words)


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
    #: seconds from a decision until the moved groups serve (drain + restart + weight load)
    move_s: float = 300.0
    #: seconds within which the prefill backlog projected at ``move_s`` is to be cleared
    drain_s: float = 120.0
    #: act on one interval (no K streak) when the TTFT projected one interval ahead is at least this many
    #: times the SLO on both the forecast and the measured backlog growth (0: never)
    evidence_factor: float = 3.0
    #: seconds between decisions (the horizon of the one-interval projection)
    interval_s: float = 30.0


@dataclass(frozen=True)
class PlannerState:
    """What the decision carries between intervals (times in seconds)."""

    streak: int = 0
    direction: tuple[int, int] = (0, 0)
    change_times: tuple[float, ...] = field(default_factory=tuple)
    #: groups the last change moved to prefill sized with a backlog term (those the steady need does not
    #: keep return to decode once the backlog is cleared)
    surge: int = 0


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
    #: prefill instances (included in ``need_p``) that clear the projected backlog within ``drain_s``
    backlog_p: float = 0.0


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


def with_backlog(req: Requirement, load: Load, current_p: int, cfg: PlannerConfig) -> Requirement:
    """``req`` with the prefill instances that clear the measured backlog added to ``need_p``.

    A move serves ``move_s`` after the decision; until then the ``current_p`` instances serve
    C = current_p * prefill_capacity requests/s, so the backlog then is
    Q_R = max(0, backlog + (lambda - C) * move_s) requests. Clearing it within ``drain_s`` on top
    of the arrivals takes Q_R / (drain_s * prefill_capacity) more instances (at full rate: the
    backlog is work already waiting). Every request behind that backlog waits longer than the
    TTFT SLO, so sizing for the steady rate alone leaves the queue to drain on the spare
    1 - rho_max only. No backlog, or one the current instances clear by then: ``req`` unchanged.
    """
    if load.backlog <= 0 or req.prefill_capacity <= 0 or not math.isfinite(req.need_p) or cfg.drain_s <= 0:
        return req
    C = current_p * req.prefill_capacity
    q_ready = max(0.0, load.backlog + (load.arrival_rate - C) * cfg.move_s)
    extra = q_ready / (cfg.drain_s * req.prefill_capacity)
    return replace(req, need_p=req.need_p + extra, backlog_p=extra) if extra > 0 else req


def projected_ttft(req: Requirement, load: Load, current_p: int, interval_s: float) -> tuple[float, float]:
    """TTFT (s) of a request arriving one interval from now if nothing moves: (on the forecast, on the
    measured backlog growth). The backlog grows by (lambda - C) per second on the forecast and by
    ``backlog_growth`` as measured; a request waits backlog / C, plus the modelled floor. inf: no
    prefill capacity; the measured one is 0 when no growth was measured."""
    C = current_p * req.prefill_capacity
    if C <= 0:
        return math.inf, math.inf
    on_forecast = req.ttft_floor_s + max(0.0, load.backlog + (load.arrival_rate - C) * interval_s) / C
    if load.backlog_growth is None:
        return on_forecast, 0.0
    measured = req.ttft_floor_s + max(0.0, load.backlog + load.backlog_growth * interval_s) / C
    return on_forecast, measured


def overwhelming(req: Requirement, load: Load, current_p: int, slo: Slo, cfg: PlannerConfig) -> str:
    """Why the evidence for growing prefill is overwhelming ("" if it is not): the TTFT projected one
    interval ahead is at least ``evidence_factor`` x the SLO both on the forecast and on the measured
    backlog growth (which must be positive: the queue is really growing). Noise moves one of the two,
    rarely both by that much; a real step moves both, and each interval waited adds
    (lambda - C) x interval requests that all miss the SLO."""
    if cfg.evidence_factor <= 0 or load.backlog_growth is None or load.backlog_growth <= 0:
        return ""
    f, m = projected_ttft(req, load, current_p, cfg.interval_s)
    limit = cfg.evidence_factor * slo.ttft_s
    if f >= limit and m >= limit:
        return (f"overwhelming: projected TTFT {f:.0f} s (forecast) and {m:.0f} s (measured backlog growth "
                f"{load.backlog_growth:.1f} req/s) >= {cfg.evidence_factor:g} x SLO {slo.ttft_s:g} s")
    return ""


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


def _keep_missing(pool: Pool, split: tuple[int, int], current: tuple[int, int], miss_p: bool, miss_d: bool,
                  lo: int) -> tuple[int, int]:
    """``split`` with no fewer instances than now of a stage whose measured latency misses its SLO, the other
    stage giving up what no longer fits (both missing: the current split)."""
    if miss_p and miss_d:
        return current
    p, d = split
    if miss_p:
        p = max(p, current[0])
        while d > lo and pool.nodes_used(p, d) > pool.nodes:
            d -= 1
    if miss_d:
        d = max(d, current[1])
        while p > lo and pool.nodes_used(p, d) > pool.nodes:
            p -= 1
    return (p, d) if pool.nodes_used(p, d) <= pool.nodes else current


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
        # what the proxy measured overrules the model: a stage missing its SLO grows by one, never shrinks
        miss_p, miss_d = load.missed(slo)
        if miss_p:
            opt, up_p, down_p = (max(opt[0], cur_p + 1), opt[1]), True, False
        if miss_d:
            opt, up_d, down_d = (opt[0], max(opt[1], cur_d + 1)), True, False
        if miss_p or miss_d:
            detail = load.miss_detail(slo) + f" (the model asks {_ceil(req.need_p, lo)}P + {_ceil(req.need_d, lo)}D)"
        if pool.nodes_used(*opt) > pool.nodes:
            split = _keep_missing(pool, _pool_split(pool, req.need_p, req.need_d, lo), (cur_p, cur_d), miss_p, miss_d, lo)
            base = "pool_exhausted"
            detail = (f"optimum {opt[0]}P + {opt[1]}D needs {pool.nodes_used(*opt)} nodes, pool has {pool.nodes}; "
                      f"best split {split[0]}P + {split[1]}D" + (f"; {detail}" if detail else ""))
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
    steady_req, req = req, with_backlog(req, load, cur[0], cfg)
    if not (math.isfinite(req.need_p) and math.isfinite(req.need_d)):
        which = "TTFT" if not math.isfinite(req.need_p) else "TPOT"
        return keep("slo_unattainable", reset, f"the {which} SLO cannot be met by this instance shape at any load", req)
    ks = pool.feasible() or [current_k]
    best = _target(pool, ks, current_k, req, cfg)
    h_cur, h_best = headroom(pool, current_k, req), headroom(pool, best, req)
    opt = pool.counts(best)
    detail = (f"headroom {h_cur:.2f} with {current_k} prefill groups, {h_best:.2f} with {best} "
              f"(need {req.need_p:.2f}P + {req.need_d:.2f}D"
              + (f", of which {req.backlog_p:.2f}P clear a backlog of {load.backlog:.0f}" if req.backlog_p else "") + ")")
    surge = 0
    if best == current_k or h_cur >= 1 + cfg.margin or h_best <= h_cur * (1 + cfg.margin):
        back = _release(pool, ks, current_k, steady_req, load, slo, cfg, state)
        if back is None:
            if best == current_k:
                reason = "pool_exhausted" if h_cur < 1 else "steady"
            else:
                reason = "steady" if h_cur >= 1 + cfg.margin else ("pool_exhausted" if h_best < 1 else "hysteresis")
            return keep(reason, replace(reset, surge=state.surge), detail, req, opt)
        best, base, req = back, "backlog_cleared", steady_req
        opt = pool.counts(best)
        detail = (f"backlog cleared: {current_k - best} of the {state.surge} group(s) moved to prefill with it return to "
                  f"decode; headroom {headroom(pool, best, req):.2f} with {best} prefill groups "
                  f"(need {req.need_p:.2f}P + {req.need_d:.2f}D)")
    else:
        base = "slo_ttft" if best > current_k else "slo_tpot"
        if h_best < 1:
            base = "pool_exhausted"
        if best > current_k and req.backlog_p > 0:  # a move sized with the backlog: returnable once it is cleared
            surge = best - current_k
    miss_p, miss_d = load.missed(slo)
    if (best > current_k and miss_d) or (best < current_k and miss_p):
        # the move would take groups from a stage whose measured latency misses its SLO: held
        return keep("observed_slo_miss", reset, f"{load.miss_detail(slo)}: no group leaves that stage; {detail}",
                    req, cur)
    direction = (1 if best > current_k else -1, -1 if best > current_k else 1)
    streak = state.streak + 1 if direction == state.direction else 1
    urgent = overwhelming(req, load, cur[0], slo, cfg) if best > current_k else ""
    if streak < cfg.k_intervals and not urgent:
        return keep("hysteresis", replace(state, streak=streak, direction=direction),
                    f"{base} wanted for {streak} of {cfg.k_intervals} intervals; {detail}", req, opt)
    if urgent:
        detail = f"{urgent}; {detail}"
    recent = tuple(t for t in state.change_times if now - t < 3600.0)
    if len(recent) >= cfg.max_changes_per_hour:
        return keep("rate_limited", PlannerState(streak, direction, recent, state.surge),
                    f"{base} held: {len(recent)} changes in the last hour (limit {cfg.max_changes_per_hour}); {detail}",
                    req, opt)
    return Decision(opt[0], opt[1], base, True, opt, req, PlannerState(0, (0, 0), recent + (now,), surge), detail, best)


def _target(pool: GroupPool, ks: list[int], current_k: int, req: Requirement, cfg: PlannerConfig) -> int:
    """The split nearest ``current_k`` whose headroom is at least 1 + margin (then the most headroom);
    if none is, the split with the most headroom (then the nearest)."""
    enough = [k for k in ks if headroom(pool, k, req) >= 1 + cfg.margin]
    if enough:
        return min(enough, key=lambda k: (abs(k - current_k), -headroom(pool, k, req)))
    return max(ks, key=lambda k: (headroom(pool, k, req), -abs(k - current_k)))


def _release(pool: GroupPool, ks: list[int], current_k: int, steady: Requirement, load: Load, slo: Slo,
             cfg: PlannerConfig, state: PlannerState) -> int | None:
    """Prefill groups to keep once the backlog a surge was for is cleared (None: keep the split).

    Cleared: the measured backlog waits within the TTFT SLO now (floor + backlog / C <= SLO). Then the
    fewest prefill groups, down to the split before that move (``current_k - surge``), whose headroom
    on the steady requirement (no backlog term, today's forecast) is still at least 1 + margin and
    whose TTFT projected one interval ahead is within the SLO; None if even returning one group
    would break either.
    """
    if state.surge <= 0:
        return None
    C = pool.counts(current_k)[0] * steady.prefill_capacity
    if C <= 0 or steady.ttft_floor_s + load.backlog / C > slo.ttft_s:
        return None
    for k in range(current_k - state.surge, current_k):
        if (k in ks and headroom(pool, k, steady) >= 1 + cfg.margin
                and projected_ttft(steady, load, pool.counts(k)[0], cfg.interval_s)[0] <= slo.ttft_s):
            return k
    return None
