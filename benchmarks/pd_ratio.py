"""Adaptive P:D ratio in simulation: the stack's fixed split, the per-phase oracle and the planner.

A discrete-time queueing simulation (1 s steps of modelled time) driven by the performance model
(ascend_runtime/perf/model.py), not the process simulator: a pool of 12 flexible groups of 4 Atlas
800I A2 nodes (each group one decode instance DP32/EP32 or two prefill instances DP2/TP8/EP16;
384 NPUs) serves a workload in phases: chat 2K in / 2K out, summarisation 8K / 256, a burst of chat
at 3x rate, chat again.

* Prefill: one FIFO queue over the routable prefill instances; each serves ``dp * n / T`` requests/s
  (T = prefill_step_s at the batch the planner's requirement picks); a request's TTFT is its wait
  plus T plus the KV transfer, plus any wait for a decode slot.
* Decode: every instance holds its own sequences (up to dp x max_num_seqs, least-loaded admission);
  each step its TPOT is decode_tpot_s at its batch per DP rank and mean context.
* Goodput: requests that finish with TTFT <= slo.ttft and mean TPOT <= slo.tpot, per second per
  NPU of the pool (all 384 NPUs count whatever the split).
* A stage change costs what it costs the real actuator (pdplanner/actuate.py): the group is drained
  (no new requests), then stopped and restarted in the other shape (``--restart-s``, engine load +
  graph capture; an assumption, 300 s by default). A prefill group's requests end within the step.
  A decode group is drained with migration (proxy/migrate.py): its streams are cut at once and
  each joins the prefill queue as a request of prompt + generated tokens (its re-prefill costs
  prefill capacity at that length, from the performance model), then resumes decode on another
  decode instance with its tokens so far (the pause counts in its mean TPOT). The group is idle,
  so it stops, once the streams are cut, as the proxy's listing shows it. ``--no-migrate``: the
  drain waits for the group's longest sequence instead (the planner without migration is run
  beside the one with it either way). A request still on an instance when it stops is a failure;
  the drain makes that zero, and the simulation counts it.
* The planner is the real decision code (forecast.HoltForecaster + decide.decide_split) every
  ``--interval`` seconds on what the proxy would observe (arrival rate, mean prompt and output).
* The oracle: every fixed split (1..11 prefill groups) run over the whole workload; per phase the
  best one's goodput.

    python -m benchmarks.pd_ratio [--write] [--plot docs/img/pd-ratio.png]
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ascend_runtime.pdplanner.decide import GroupPool, Load, PlannerConfig, PlannerState, Slo, StagePool, decide_split, requirement
from ascend_runtime.pdplanner.forecast import HoltForecaster
from ascend_runtime.perf import model as pm
from benchmarks import report

ROOT = Path(__file__).resolve().parents[1]
SP = pm.StageShape("atlas-800i-a2", "prefill", 2, 8, 16, max_num_seqs=16, max_num_batched_tokens=16384, nodes=2)
SD = pm.StageShape("atlas-800i-a2", "decode", 32, 1, 32, max_num_seqs=72, max_num_batched_tokens=72, nodes=4)
GROUPS = 12
POOL = GroupPool(StagePool(SP, 2), StagePool(SD, 4), 0, 0, GROUPS, 2, 1, 1, 1)
NPUS = GROUPS * SD.npus
SLO = Slo(ttft_s=5.0, tpot_s=0.15)
FIXED_K = 4  # the stack's split: the best fixed split for chat


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: int
    rate: float  # requests/s
    prompt: int
    output: int


def phases(scale: float) -> list[Phase]:
    """The workload; ``scale`` stretches every phase's duration."""
    return [Phase("chat", int(3600 * scale), 20.0, 2048, 2048),
            Phase("summarise", int(3600 * scale), 30.0, 8192, 256),
            Phase("burst", int(1800 * scale), 60.0, 2048, 2048),
            Phase("chat again", int(3600 * scale), 20.0, 2048, 2048)]


@dataclass
class Instance:
    """One instance of a group's current shape (or moving)."""

    group: int
    role: str
    state: str = "up"  # up | draining | restarting
    ready_at: float = 0.0
    target: str = ""


@dataclass
class Result:
    good: np.ndarray  # good requests finished per second
    failed: int = 0
    migrated: float = 0.0  # streams moved off draining decode groups
    moves: list[tuple[float, int, str, float]] = field(default_factory=list)  # time, group, to role, drain s
    split: list[tuple[float, int]] = field(default_factory=list)
    backlog: list[tuple[float, float]] = field(default_factory=list)  # time, requests waiting for prefill
    reasons: list[tuple[float, str, bool]] = field(default_factory=list)  # time, decision reason, changed


_TPOT: dict[tuple[int, int], float] = {}


def tpot(b: int, ctx: float) -> float:
    key = (b, int(ctx // 256))
    if key not in _TPOT:
        _TPOT[key] = pm.decode_tpot_s(SD, max(1, b), key[1] * 256 + 128, 0.0)
    return _TPOT[key]


@functools.lru_cache(maxsize=None)
def prefill_rate(P: int, O: int) -> tuple[float, float]:
    """(requests/s per prefill instance, T + KV seconds) at the batch the planner's requirement picks."""
    r = requirement(Load(1.0, P, O), POOL.as_pool(), SLO, PlannerConfig())
    return SP.dp * r.prefill_batch / r.prefill_step_s, r.prefill_step_s + pm.kv_transfer_s(SP, P)


def reprefill_weight(P: int, O: int, phase_p: int, phase_o: int) -> float:
    """Prefill capacity one migrated request of prompt ``P`` (prompt + tokens so far, rounded up to 256)
    uses, in requests of the current phase's prompt ``phase_p``."""
    return prefill_rate(phase_p, phase_o)[0] / prefill_rate(-(-P // 256) * 256, O)[0]


def simulate(work: list[Phase], fixed_k: int | None, restart_s: float, interval_s: float, seed: int = 0,
             k_intervals: int = 2, migrate: bool = True, planner: dict | None = None) -> Result:
    """One run: a fixed split (``fixed_k`` prefill groups) or the planner (``fixed_k`` None, starts at FIXED_K);
    ``migrate``: decode groups are drained with stream migration."""
    rng = np.random.default_rng(seed)
    total = sum(p.seconds for p in work)
    k0 = FIXED_K if fixed_k is None else fixed_k
    groups = [Instance(g, "prefill" if g < k0 else "decode") for g in range(GROUPS)]
    res = Result(np.zeros(total))
    # prefill FIFO: [count, arrival, P, O, prompt to prefill, tokens done, decode start, ttft]; tokens done 0: a new
    # request, else a migrated one (its prompt is P + tokens done; start and ttft are its first decode's)
    pq: list[list[float]] = []
    # prefilled, waiting for a decode slot: [count, arrival, P, O, ttft_base, tokens done, decode start, ttft]
    dq: list[list[float]] = []
    # decode sequences: columns group, count, arrival, P, O, done_tokens, start, ttft
    seqs = np.zeros((0, 8))
    slots = SD.dp * SD.max_num_seqs
    cfg = PlannerConfig(k_intervals=k_intervals, max_changes_per_hour=6, move_s=restart_s, interval_s=interval_s,
                        **(planner or {}))
    backlog_prev = 0.0
    state, rate_f, p_f, o_f = PlannerState(), HoltForecaster(0.5, 0.3), HoltForecaster(0.5, 0.0), HoltForecaster(0.5, 0.0)
    win_n = win_p = win_o = 0.0
    t = 0
    bounds = np.cumsum([p.seconds for p in work])
    for t in range(total):
        ph = work[int(np.searchsorted(bounds, t, side="right"))]
        cap_p, floor = prefill_rate(ph.prompt, ph.output)
        n = rng.poisson(ph.rate)
        if n:
            pq.append([float(n), float(t), ph.prompt, ph.output, ph.prompt, 0.0, 0.0, 0.0])
            win_n, win_p, win_o = win_n + n, win_p + n * ph.prompt, win_o + n * ph.output
        # restarts finishing
        for g in groups:
            if g.state == "restarting" and t >= g.ready_at:
                g.state, g.role = "up", g.target
        # prefill
        active_p = sum(2 for g in groups if g.role == "prefill" and g.state == "up")
        budget = active_p * cap_p
        while pq and budget > 1e-9:
            c = pq[0]
            w = reprefill_weight(int(c[4]), ph.output, ph.prompt, ph.output) if c[5] else 1.0
            take = min(c[0], budget / w)
            budget -= take * w
            dq.append([take, c[1], c[2], c[3], t - c[1] + floor, c[5], c[6], c[7]])
            c[0] -= take
            if c[0] <= 1e-9:
                pq.pop(0)
        # decode admission, least loaded routable instance
        up_d = [g.group for g in groups if g.role == "decode" and g.state == "up"]
        load = np.bincount(seqs[:, 0].astype(int), weights=seqs[:, 1], minlength=GROUPS) if len(seqs) else np.zeros(GROUPS)
        new_rows = []
        while dq and up_d:
            free = {g: slots - load[g] for g in up_d}
            g = max(free, key=free.get)
            if free[g] < 1:
                break
            c = dq[0]
            take = min(c[0], free[g])
            load[g] += take
            if c[5]:  # a migrated request resumes with its tokens, first decode start and TTFT
                new_rows.append([g, take, c[1], c[2], c[3], c[5], c[6], c[7]])
            else:  # TTFT: prefill wait + T + KV (c[4]), or later if the decode slot came later
                new_rows.append([g, take, c[1], c[2], c[3], 1.0, t, max(c[4], float(t - c[1]))])
            c[0] -= take
            if c[0] <= 1e-9:
                dq.pop(0)
        if new_rows:
            seqs = np.vstack([seqs, np.array(new_rows)])
        # decode step: per instance batch per DP rank and mean context
        if len(seqs):
            gi = seqs[:, 0].astype(int)
            cnt = np.bincount(gi, weights=seqs[:, 1], minlength=GROUPS)
            ctx = np.bincount(gi, weights=seqs[:, 1] * (seqs[:, 3] + seqs[:, 5]), minlength=GROUPS) / np.maximum(cnt, 1)
            step = np.array([tpot(math.ceil(cnt[g] / SD.dp), ctx[g]) if cnt[g] else 1.0 for g in range(GROUPS)])
            seqs[:, 5] += 1.0 / step[gi]
            done = seqs[:, 5] >= seqs[:, 4]
            if done.any():
                d = seqs[done]
                mean_tpot = (t + 1 - d[:, 6]) / np.maximum(d[:, 4] - 1, 1)
                ok = (d[:, 7] <= SLO.ttft_s) & (mean_tpot <= SLO.tpot_s)
                res.good[t] += d[ok, 1].sum()
                seqs = seqs[~done]
        # drains completing -> stop and restart
        for g in groups:
            if g.state == "draining":
                if g.role == "decode" and migrate and len(seqs):  # cut every stream; each is prefilled again
                    mine = seqs[:, 0] == g.group
                    for row in seqs[mine]:
                        pq.append([row[1], row[2], row[3], row[4], row[3] + row[5], row[5], row[6], row[7]])
                        res.migrated += row[1]
                    seqs = seqs[~mine]
                if g.role == "decode":
                    busy = len(seqs) and (seqs[:, 0] == g.group).any()
                else:
                    busy = False  # the prefill in flight (one batch, T) ends within the step
                if not busy:
                    res.failed += int(seqs[seqs[:, 0] == g.group, 1].sum()) if len(seqs) else 0
                    res.moves.append((float(t), g.group, g.target, t - g.ready_at))
                    g.state, g.ready_at = "restarting", t + restart_s
        # the planner
        if fixed_k is None and t % int(interval_s) == int(interval_s) - 1:
            rate_f.update(win_n / interval_s)
            if win_n:
                p_f.update(win_p / win_n)
                o_f.update(win_o / win_n)
            win_n = win_p = win_o = 0.0
            backlog = sum(c[0] for c in pq)  # what the proxy's inflight{role="prefill"} shows
            growth, backlog_prev = (backlog - backlog_prev) / interval_s, backlog
            moving = any(g.state != "up" for g in groups)
            cur_k = sum(1 for g in groups if g.role == "prefill" and g.state == "up")
            if not moving:
                ld = Load(rate_f.forecast() or 0.0, p_f.forecast() or 2048, o_f.forecast() or 2048, backlog, growth)
                dec = decide_split(ld, cur_k, POOL, SLO, cfg, state, float(t))
                state = dec.state
                res.reasons.append((float(t), dec.reason + (" overwhelming" if dec.detail.startswith("overwhelming")
                                                            else ""), dec.change))
                if dec.change:
                    want = dec.prefill_groups
                    # the groups with the least in-flight work move (as actuate.GroupMover orders them): a decode
                    # group's streams (each re-prefilled elsewhere when migrated), a prefill group's last batch
                    busy = np.bincount(seqs[:, 0].astype(int), weights=seqs[:, 1], minlength=GROUPS) if len(seqs) \
                        else np.zeros(GROUPS)
                    src = "decode" if want > cur_k else "prefill"
                    movers = sorted((g for g in groups if g.role == src), key=lambda g: (busy[g.group], -g.group))
                    movers = movers[: abs(want - cur_k)]
                    tgt = "prefill" if want > cur_k else "decode"
                    for g in movers:
                        g.state, g.target, g.ready_at = "draining", tgt, float(t)  # ready_at: drain start
            res.split.append((float(t), cur_k))
            res.backlog.append((float(t), backlog))
    return res


def per_phase(good: np.ndarray, work: list[Phase]) -> list[float]:
    """Goodput per phase: good requests/s per 1000 NPUs."""
    out, start = [], 0
    for p in work:
        out.append(float(good[start:start + p.seconds].sum()) / p.seconds / NPUS * 1000)
        start += p.seconds
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="stretch every phase (1.0: 60/60/30/60 minutes)")
    ap.add_argument("--restart-s", type=float, default=300.0, help="engine restart + load time of a group (s)")
    ap.add_argument("--interval", type=float, default=30.0, help="planner interval (modelled s)")
    ap.add_argument("--plot", type=Path, help="write the goodput-over-time PNG here (matplotlib, a dependency of the kit)")
    ap.add_argument("--write", action="store_true", help="update the section in docs/benchmarks.md")
    ap.add_argument("--no-migrate", action="store_true",
                    help="the planner's decode drains wait for their streams (no migration) in the main run")
    args = ap.parse_args(argv)
    work = phases(args.scale)
    t0 = time.perf_counter()
    runs: dict[str, Result] = {}
    for k in range(1, GROUPS):
        runs[f"fixed {k}"] = simulate(work, k, args.restart_s, args.interval)
        print(f"fixed split {k:2d} prefill groups: {per_phase(runs[f'fixed {k}'].good, work)}", file=sys.stderr)
    runs["planner"] = simulate(work, None, args.restart_s, args.interval, migrate=not args.no_migrate)
    runs["planner, other drain"] = simulate(work, None, args.restart_s, args.interval, migrate=args.no_migrate)
    wall = time.perf_counter() - t0
    fixed = per_phase(runs[f"fixed {FIXED_K}"].good, work)
    planner = per_phase(runs["planner"].good, work)
    other = per_phase(runs["planner, other drain"].good, work)
    oracle, best = [], []
    for i in range(len(work)):
        k = max(range(1, GROUPS), key=lambda k: per_phase(runs[f"fixed {k}"].good, work)[i])
        best.append(k)
        oracle.append(per_phase(runs[f"fixed {k}"].good, work)[i])
    weights = [p.seconds for p in work]
    whole = lambda xs: sum(x * w for x, w in zip(xs, weights)) / sum(weights)  # noqa: E731
    failed = sum(r.failed for r in runs.values())
    worst = min(range(len(work)), key=lambda i: fixed[i] / oracle[i] if oracle[i] else 1)
    lines = ["| phase | minutes | rate (req/s) | in/out tokens | fixed (4P groups) | oracle (best fixed) | planner |",
             "|---|---|---|---|---|---|---|"]
    for i, p in enumerate(work):
        lines.append(f"| {p.name} | {p.seconds / 60:.0f} | {p.rate:g} | {p.prompt}/{p.output} | {fixed[i]:.2f} | "
                     f"{oracle[i]:.2f} ({best[i]} groups) | {planner[i]:.2f} |")
    lines.append(f"| **whole run** | {sum(weights) / 60:.0f} | | | {whole(fixed):.2f} | {whole(oracle):.2f} | "
                 f"{whole(planner):.2f} |")
    decode_drains = [m[3] for m in runs["planner"].moves if m[2] == "prefill"]
    other_drains = [m[3] for m in runs["planner, other drain"].moves if m[2] == "prefill"]
    mode, other_mode = ("without", "with") if args.no_migrate else ("with", "without")
    summary = (f"planner ({mode} stream migration) / oracle over the whole run: {whole(planner) / whole(oracle):.3f} "
               f"(goal >= 0.95); planner / fixed in the {work[worst].name} phase: "
               f"{planner[worst] / max(fixed[worst], 1e-9):.2f} (goal >= 1.3); failed requests across "
               f"{len(runs['planner'].moves)} group moves: {runs['planner'].failed} (all runs: {failed}); "
               f"streams migrated: {runs['planner'].migrated:.0f}; longest decode-group drain "
               f"{max(decode_drains, default=0):.0f} s. The same planner {other_mode} migration: "
               f"{whole(other) / whole(oracle):.3f} of the oracle, longest decode-group drain "
               f"{max(other_drains, default=0):.0f} s, {runs['planner, other drain'].failed} failed; wall time {wall:.0f} s")
    pr = runs["planner"]
    start_w = sum(p.seconds for p in work[:worst])
    end_w = start_w + work[worst].seconds
    ups = [m for m in pr.moves if start_w <= m[0] < end_w and m[2] == "prefill"]
    backs = [m for m in pr.moves if start_w <= m[0] < end_w and m[2] == "decode"]
    first = min((m[0] for m in ups), default=float("nan"))
    why = next((r for r in pr.reasons if r[0] >= start_w and r[2]), (0.0, "none", False))[1]
    ready = first + args.restart_s
    cleared = next((t for t, q in pr.backlog if t > ready and q < 1), float("nan"))
    summary += (f". Where the gap is: in the {work[worst].name} phase the planner moves {len(ups)} groups to prefill "
                f"{first - start_w:.0f} s after the switch (reason {why}"
                + (": the forecast re-based on the new mix, and the TTFT projected one interval ahead is over "
                   f"{PlannerConfig().evidence_factor:g} x the SLO on both the forecast and the measured queue growth"
                   if why.endswith("overwhelming") else f"; K = {2} intervals of {args.interval:g} s")
                + f"; sized to clear the queue), they serve {args.restart_s:g} s of restart later, "
                f"and the prompts that queued meanwhile miss the TTFT SLO; the queue is empty {cleared - ready:.0f} s "
                f"after they serve, and {len(backs)} of them return to decode "
                f"{(min((m[0] for m in backs), default=float('nan')) - start_w):.0f} s after the switch. The decode drains "
                "are not the cost in this model")
    # burst + chat again together: the per-phase oracle takes each phase's best fixed split, and the best one for
    # chat again was short of decode in the burst, so burst requests finish in its first minutes (counted there)
    if len(work) >= 4:
        a, b_ = 2, 3
        span = lambda xs: (xs[a] * weights[a] + xs[b_] * weights[b_]) / (weights[a] + weights[b_])  # noqa: E731
        best_pair = max(range(1, GROUPS), key=lambda k: span(per_phase(runs[f"fixed {k}"].good, work)))
        pair = span(per_phase(runs[f"fixed {best_pair}"].good, work))
        summary += (f". In {work[b_].name} the oracle's split ({best[b_]} groups) was short of decode in the "
                    f"{work[a].name}, whose requests then finish in the first minutes of {work[b_].name}: the per-phase "
                    f"oracle counts those in {work[a].name} (with {best[a]} groups) and again in {work[b_].name}. Over "
                    f"{work[a].name} + {work[b_].name} together the best fixed split ({best_pair} groups) has "
                    f"{pair:.2f}, the per-phase oracle {span(oracle):.2f}, the planner {span(planner):.2f}")
    table = "\n".join(lines)
    print(table)
    print(summary)
    if args.plot:
        plot(args.plot, work, runs, best)
    if args.write:
        write_section(table, summary, args)
    return 0


def plot(path: Path, work: list[Phase], runs: dict[str, Result], best: list[int]) -> None:
    """Goodput per NPU over time (5-minute windows) of the fixed split, the oracle and the planner."""
    import matplotlib  # noqa: PLC0415 - imported only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    win = 300
    total = sum(p.seconds for p in work)
    x = np.arange(0, total, win) / 60

    def smooth(good: np.ndarray) -> np.ndarray:
        return good[: len(x) * win].reshape(-1, win).sum(axis=1) / win / NPUS * 1000

    oracle = np.zeros(total)
    start = 0
    for p, k in zip(work, best):
        oracle[start:start + p.seconds] = runs[f"fixed {k}"].good[start:start + p.seconds]
        start += p.seconds
    fig, ax = plt.subplots(figsize=(9, 4.2), dpi=110)
    ax.plot(x, smooth(runs[f"fixed {FIXED_K}"].good), label=f"fixed split ({FIXED_K} of {GROUPS} groups prefill)")
    ax.plot(x, smooth(oracle), label="oracle (best fixed split per phase)", linestyle="--")
    ax.plot(x, smooth(runs["planner"].good), label="P:D planner")
    start = 0
    for p in work:
        ax.axvline(start / 60, color="grey", linewidth=0.5)
        ax.text(start / 60 + 1, 0.2, p.name, fontsize=8)
        start += p.seconds
    ax2 = ax.twinx()
    split = np.array(runs["planner"].split)
    ax2.step(split[:, 0] / 60, split[:, 1], where="post", color="black", alpha=0.3, linewidth=1)
    ax2.set_ylabel("planner: groups serving prefill")
    ax2.set_ylim(0, GROUPS)
    ax.set_xlabel("minutes (modelled)")
    ax.set_ylabel("SLO goodput, requests/s per 1000 NPUs")
    ax.set_title(f"Adaptive P:D on {GROUPS} A2 groups ({NPUS} NPUs), simulated")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(f"wrote {path}", file=sys.stderr)


SECTION = "## Adaptive P:D ratio (simulation)"


def write_section(table: str, summary: str, args: argparse.Namespace) -> None:
    """Replace (or append) this benchmark's own section of docs/benchmarks.md (between its markers)."""
    body = (f"{SECTION}\n\n    python -m benchmarks.pd_ratio --write --plot docs/img/pd-ratio.png"
            f"{' --scale ' + str(args.scale) if args.scale != 1.0 else ''}{' --no-migrate' if args.no_migrate else ''}\n\n"
            "A discrete-time queueing simulation driven by the performance model (benchmarks/pd_ratio.py has the "
            f"model): {GROUPS} flexible groups of 4 Atlas 800I A2 nodes ({NPUS} NPUs; a group is one decode "
            "instance DP32/EP32 or two prefill instances DP2/TP8/EP16), SLO TTFT 5 s, TPOT 150 ms. Goodput: "
            "requests finishing within both SLOs per second per 1000 NPUs of the pool. A stage change costs a "
            f"drain plus {args.restart_s:g} s restart and weight load (assumed). A decode group is drained with "
            "stream migration (docs/proxy.md): its streams are cut at once and each is prefilled again elsewhere "
            "(prompt + tokens so far, at the performance model's prefill rate for that length, queued behind "
            "the prefill stage's other work) before it resumes decode on another instance; the pause counts in its "
            "mean TPOT. The planner without migration (the drain waits for the group's longest stream) runs beside it. "
            f"The planner is the real decision code every {args.interval:g} s (K = 2, margin 0.15; change-point "
            "forecast, backlog sizing, one-interval action on overwhelming evidence, surge return: docs/pd-planner.md) "
            "on what the proxy shows: arrival rate, mean prompt and output, and the prefill queue.\n\n"
            f"{table}\n\n{summary}.\n\n![goodput over time](img/pd-ratio.png)\n")
    report.write_section("pd_ratio", body)


if __name__ == "__main__":
    raise SystemExit(main())
