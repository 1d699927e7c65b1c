"""Benchmark: our expert placement against vLLM-Ascend's and DeepSeek's policies, per load family.

Run: ``python -m benchmarks.balancer_families --seeds 1 2 3`` (a few minutes on 2 cores;
``--jobs`` worker processes, default 2). Writes the ``balancer_families`` section of
docs/benchmarks.md (``--no-write`` prints only).

Every case: a trace of one family (``trace.family_trace``; 58 layers x 256 experts),
``HISTORY`` observed windows, scored on the next, unseen window (vLLM's balancedness).
Shapes (ranks x slots) 32x8, 32x9, 64x5, 144x2; global and hierarchical (8 groups; nodes of 8
ranks, 144 ranks: 8 nodes of 18). Every policy sees only the observed windows:

- ``greedy``: DeepSeek's EPLB greedy on the last window (what the CLI's ``--load`` gives it);
- ``greedy_decay``: EPLB greedy on the decayed history (newest window weight ``DECAY``);
- ``swift``: SwiftBalancer (vLLM-Ascend policy 2) from the engine's initial map, on the
  summed history (with ``ranks_per_node`` in hierarchical cases);
- ``flashlb``: FlashLB (policy 3, v0.23.0 tree search) on the history. It has no
  hierarchical mode: its plans ignore the group -> node constraint, so hierarchical cases are
  compared with the other three only (FlashLB's global number is still listed);
- ``ours``: the daemon's planner (history candidates chosen on held-out windows: similar
  windows and shrinkage toward the mean, each unhedged and hedged by the spread inside the
  current regime, the last window, decay 0.5; then the robust swap search over the chosen
  forecast's windows); ``ours_before`` the same planner without the history candidates
  (forecaster and hedges only);
- ``informed``: a planner given the trace process itself (:func:`informed_plan`): what the past
  determines exactly, only the next window's innovations and sampling noise unknown. No planner
  that sees only past windows can expect more, so ``informed / best`` bounds the reachable ratio;
- ``oracle``: the better of our planner and EPLB greedy given the scored window itself,
  the ceiling for any plan of this shape (it knows the scored window's noise too).

"best" is the best baseline *of that case* (chosen after seeing the scored window, so a
strict reference); "gap captured" is ``(ours - best) / (oracle - best)``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

import numpy as np

from ascend_runtime.allocator import keep_freed_memory
from ascend_runtime.balancer.baselines import flashlb, swift_balancer
from ascend_runtime.balancer.eplb_greedy import eplb_greedy
from ascend_runtime.balancer.forecast import LoadForecaster
from ascend_runtime.balancer.measure import balancedness
from ascend_runtime.balancer.placement import PlacementConfig, _robust_refine, place_from_scratch
from ascend_runtime.balancer.trace import FAMILIES, FamilyProcess, family_trace

SHAPES = [(32, 8), (32, 9), (64, 5), (144, 2)]
GROUPS = 8
HISTORY = 8
DECAY = 0.5
BASELINES = ("greedy", "greedy_decay", "swift", "flashlb")
#: printed with the table: what changed and where it was developed (seeds 1-3 are the recorded run)
NOTE = (
    "Plans as in the previous recorded run except where equal per-replica loads are now packed in another order "
    "(9 of the 30 144x2 cases moved, each by at most 0.0006 in its ratio; the regime family's mean went from 0.9950 "
    "to 0.9949 and two gap-captured entries by 0.1 point, every other number of the families table is "
    "unchanged). Planning is faster (2-slot packing "
    "sorts the experts instead of the items; hierarchical sub-problems are gathered once per distinct load; the "
    "trials skip the swap search's set-up; the balancer's processes keep freed heap memory instead of faulting "
    "it in again, `ascend_runtime/allocator.py`, which this benchmark's processes do too): on this machine, CPU "
    "time at 144x2 before the allocator setting (25th percentile of 15, three "
    "alternating runs of the two trees) went from 120-137 to 92-97 ms global and from 136-154 to 87-111 ms "
    "hierarchical, and the allocator setting alone took 89-114 ms to 51-64 ms (both modes); the previous recorded "
    "run's 68/70 ms were measured on a faster machine, where EPLB greedy took "
    "8 ms against 11-21 ms here. New: the `informed` "
    "column, the reachable ceiling of any planner that sees only the past. It is given the trace process "
    "itself (`trace.FamilyProcess`: the popularity behind the last window, the family's fixed parts, the "
    "regimes and their switch odds, the hot expert) and plans on 16 draws of the next window from it "
    "(`next_scenarios`: the innovation and the sampling noise drawn anew), choosing among its plans and the "
    "case's own policies (ours and the baselines) by mean balancedness on 32 other draws. It knows more than the "
    "history can tell and can pick any past-only plan, so its ratio to the best baseline bounds what a forecaster "
    "can be expected to reach on these families, up to the search's own optimality (the oracle column "
    "shows the search reaches 0.998 where the window allows a perfect balance). `oracle/best`: the oracle's ratio, "
    "what knowing the scored window itself is worth. Each family's 8 cases of a seed share one trace: 3 independent "
    "traces per family."
)
#: the planner's candidate set before the baselines joined it (for "gap captured: before")
BEFORE = PlacementConfig(select_on_history=False)
#: draws of the next window the informed planner plans on, and the independent ones it chooses on
INFORMED_SCENARIOS = 16
INFORMED_CHOICE_DRAWS = 32
INFORMED_HEDGES = (0.0, 0.5, 1.0)


def informed_plan(plan_scen: np.ndarray, choose_scen: np.ndarray, ranks: int, slots: int,
                  groups: int | None, nodes: int | None, also: list[np.ndarray] = ()) -> np.ndarray:
    """The plan of a planner that knows everything the past determines: the trace process's state
    (popularity, regimes and their switch odds, the hot expert) but not the next window's innovations or
    its sampling noise. ``plan_scen [K, L, E]``: draws of the next window it plans on (their mean, hedged by
    their std, each plan refined by the robust swap search over the draws); ``choose_scen [K, L, E]``:
    independent draws it picks among its plans, EPLB greedy on the mean and the past-only plans ``also``
    (``[L, R*S]`` each: the case's policies) by (mean balancedness). It knows more than any past-only planner
    and chooses among their plans too, so it expects at least what they do, up to the noise of choosing on
    a finite number of draws and the search's own optimality: the reachable ceiling the goals are measured
    against."""
    mean, std = plan_scen.mean(axis=0), plan_scen.std(axis=0)
    layers = mean.shape[0]
    weights = np.full((layers, plan_scen.shape[0]), 1.0 / plan_scen.shape[0])
    robust = PlacementConfig(robust_min_slots=2)
    plans = [eplb_greedy(mean, ranks, slots, groups, nodes), *also]
    for h in INFORMED_HEDGES:
        plan = place_from_scratch(mean + h * std, ranks, slots, groups, nodes)
        plans += [plan, _robust_refine(plan, plan_scen, weights, mean, ranks, slots, groups, nodes, robust)]
    return max(plans, key=lambda p: float(np.mean([balancedness(p, w, ranks) for w in choose_scen])))


def nodes_for(ranks: int) -> int:
    """Nodes of 8 ranks when the 8 groups divide evenly, else 8 nodes (144 ranks: 18 per node)."""
    n = ranks // 8
    return n if GROUPS % n == 0 else 8


def decayed(hist: np.ndarray, decay: float = DECAY) -> np.ndarray:
    """Exponentially decayed average ``[L, E]`` of ``hist [W, L, E]`` (newest window weight ``decay``)."""
    acc = hist[0].copy()
    for w in hist[1:]:
        acc = (1 - decay) * acc + decay * w
    return acc


def run_case(case: tuple[str, int, int, bool, int]) -> dict:
    keep_freed_memory()  # as the balancer's commands do (ascend_runtime/allocator.py)
    family, ranks, slots, hier, seed = case
    process = FamilyProcess(family, seed=seed * 1000 + FAMILIES.index(family))  # = family_trace's windows
    hist = np.stack([process.step() for _ in range(HISTORY)])
    scen = process.next_scenarios(INFORMED_SCENARIOS + INFORMED_CHOICE_DRAWS, seed=seed)
    nxt = process.step()
    g, n = (GROUPS, nodes_for(ranks)) if hier else (None, None)
    fc = LoadForecaster()
    for w in hist:
        fc.update(w)
    f = fc.forecast()
    plans = {
        "greedy": eplb_greedy(hist[-1], ranks, slots, g, n),
        "greedy_decay": eplb_greedy(decayed(hist), ranks, slots, g, n),
        "swift": swift_balancer.place(hist, ranks, slots, ranks_per_node=ranks // n if hier else None),
        "flashlb": flashlb.place(hist, ranks, slots),
    }
    t0 = time.perf_counter()
    plans["ours"] = place_from_scratch(f.mean, ranks, slots, g, n, f.std, holdout=f.holdout, last=f.last, history=hist)
    t_ours = time.perf_counter() - t0
    plans["ours_before"] = place_from_scratch(f.mean, ranks, slots, g, n, f.std, BEFORE, holdout=f.holdout, last=f.last)
    past_only = [p for k, p in plans.items() if not (hier and k == "flashlb")]  # FlashLB ignores the node constraint
    plans["informed"] = informed_plan(scen[:INFORMED_SCENARIOS], scen[INFORMED_SCENARIOS:], ranks, slots, g, n, past_only)
    b = {k: balancedness(p, nxt, ranks) for k, p in plans.items()}
    b["oracle"] = max(balancedness(place_from_scratch(nxt, ranks, slots, g, n), nxt, ranks),
                      balancedness(eplb_greedy(nxt, ranks, slots, g, n), nxt, ranks), b["ours"])
    return dict(family=family, shape=f"{ranks}x{slots}", mode="hier" if hier else "global", seed=seed, t_ours=t_ours, **b)


def baselines_of(mode: str) -> tuple[str, ...]:
    """The baselines a case is compared with: FlashLB has no hierarchical mode (its plans ignore the
    group -> node constraint), so hierarchical cases compare with the hierarchy-respecting ones."""
    return BASELINES if mode == "global" else ("greedy", "greedy_decay", "swift")


def derived(r: dict) -> dict:
    best_name = max(baselines_of(r["mode"]), key=lambda k: r[k])
    best = r[best_name]
    gap = r["oracle"] - best
    return dict(best=best, best_name=best_name, ratio=r["ours"] / best, ratio_before=r["ours_before"] / best,
                informed_ratio=r["informed"] / best, ours_of_informed=r["ours"] / r["informed"], oracle_best=r["oracle"] / best,
                oracle_ratio=r["ours"] / r["oracle"],
                captured=(r["ours"] - best) / gap if gap > 1e-9 else float("nan"),
                captured_before=(r["ours_before"] - best) / gap if gap > 1e-9 else float("nan"))


def timing(seed: int) -> dict:
    """144x2 planning time, median of 9, ours against EPLB greedy on the same history (both modes),
    measured alternately so both see the same machine load; CPU time of this process (other processes on
    the shared machine do not count, their cache and memory traffic still does); ``"load"``: 1-minute
    load average."""
    keep_freed_memory()  # as the balancer's commands do (ascend_runtime/allocator.py)
    out = {"load": os.getloadavg()[0]}
    for hier in (False, True):
        trace = family_trace("random_walk", HISTORY, seed=seed)
        fc = LoadForecaster()
        for w in trace:
            fc.update(w)
        f = fc.forecast()
        g, n = (GROUPS, nodes_for(144)) if hier else (None, None)
        fns = {
            "ours": lambda: place_from_scratch(f.mean, 144, 2, g, n, f.std, holdout=f.holdout, last=f.last, history=trace),
            "greedy": lambda: eplb_greedy(trace[-1], 144, 2, g, n),
        }
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(9):
            for name, fn in fns.items():
                t0 = time.process_time()
                fn()
                times[name].append(time.process_time() - t0)
        for name, ts in times.items():
            out[(name, "hier" if hier else "global")] = statistics.median(ts)
    return out


def pooled(rows: list[dict], key: str) -> float:
    """Gap captured pooled over ``rows``: sum of (``key`` - best) / sum of (oracle - best)."""
    gap = sum(r["oracle"] - r["best"] for r in rows)
    return sum(r[key] - r["best"] for r in rows) / gap if gap > 1e-12 else float("nan")


def mode_means(rows: list[dict], mode: str) -> str:
    """Mean balancedness of each policy over the ``mode`` cases of ``rows`` (the baselines that mode
    compares with, then ours and the oracle), comma-separated; "-" without such cases."""
    rs = [r for r in rows if r["mode"] == mode]
    if not rs:
        return "-"
    return ", ".join(f"{_mean([r[k] for r in rs]):.4f}" for k in (*baselines_of(mode), "ours", "informed", "oracle"))


def ceiling(rows: list[dict]) -> float:
    """Mean over families of ``informed / best`` (``oracle / best`` for ``regime``, where the informed planner plans
    for the expected next window and a switch-free window favours the last regime), each family weighted by its
    cases: a bound on the mean ratio any past-only planner reaches on ``rows``."""
    return _mean([r["oracle_best"] if r["family"] == "regime" else r["informed_ratio"] for r in rows])


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.mean(xs) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--no-write", action="store_true", help="print only; do not touch docs/benchmarks.md")
    args = ap.parse_args(argv)
    cases = [(fam, r, s, hier, seed) for seed in args.seeds for fam in args.families for r, s in SHAPES for hier in (False, True)]
    start = time.perf_counter()
    rows = []
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        for i, r in enumerate(pool.imap_unordered(run_case, cases), 1):
            r.update(derived(r))
            rows.append(r)
            print(f"[{i}/{len(cases)}] {r['family']:>14} {r['shape']:>6} {r['mode']:>6} seed {r['seed']}: ours {r['ours']:.4f} "
                  f"best {r['best_name']} {r['best']:.4f} ratio {r['ratio']:.4f} (before {r['ratio_before']:.4f}) "
                  f"informed {r['informed']:.4f} oracle {r['oracle']:.4f}", file=sys.stderr, flush=True)
    t = timing(args.seeds[0])
    elapsed = time.perf_counter() - start
    ratios = [r["ratio"] for r in rows]
    lines = [
        "## Expert placement against the strongest baseline, per load family",
        "",
        f"Command: `python -m benchmarks.balancer_families --seeds {' '.join(map(str, args.seeds))}` "
        f"({elapsed:.0f} s, {args.jobs} processes). {machine_line()}.",
        "",
        f"58 layers x 256 experts; {HISTORY} observed windows, scored on the next one (vLLM balancedness). Shapes "
        "32x8, 32x9, 64x5, 144x2, global and hierarchical; seeds as in the command. `best` = the best of "
        "{greedy on the last window, greedy on the decayed history, SwiftBalancer, FlashLB} *in each case*, picked "
        "after seeing the scored window. `oracle` = a plan made on the scored window itself. `gap captured` = "
        "(ours - best) / (oracle - best), as the mean over cases and pooled (sum over cases of ours - best over the sum "
        "of oracle - best; the mean over cases is dominated by cases where the oracle is barely above the best); "
        "`before` = the planner without the history candidates (forecaster and hedges only). Mean balancedness is "
        "given over the global cases and over the hierarchical ones: FlashLB has no node constraint, so its "
        "plan is scored in hierarchical cases too but not compared there (averaging it over both modes, as the "
        "previous table did, put its mean above ours where ours beat it in every global case).",
        "",
        "Goals: ours / best mean >= 1.02x, no case below 0.99x, gap captured rising; 144x2 planning <= 0.1 s.",
        "",
        NOTE,
        "",
        "| family | cases | ours/best mean | min | cases < 0.99x | informed/best mean | min | cases < 0.99x | ours/informed | oracle/best mean | before: mean | min | ours/oracle | gap captured: mean | pooled | before: pooled | best baseline (cases) | mean balancedness, global: greedy, decay, swift, flashlb, ours, informed, oracle | hier: greedy, decay, swift, ours, informed, oracle |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for fam in [*args.families, "all"]:
        rs = rows if fam == "all" else [r for r in rows if r["family"] == fam]
        wins = {k: sum(r["best_name"] == k for r in rs) for k in BASELINES}
        lines.append(
            f"| {'**all**' if fam == 'all' else fam} | {len(rs)} | **{_mean([r['ratio'] for r in rs]):.4f}** | "
            f"{min(r['ratio'] for r in rs):.4f} | {sum(r['ratio'] < 0.99 for r in rs)} | "
            f"{_mean([r['informed_ratio'] for r in rs]):.4f} | {min(r['informed_ratio'] for r in rs):.4f} | "
            f"{sum(r['informed_ratio'] < 0.99 for r in rs)} | {_mean([r['ours_of_informed'] for r in rs]):.4f} | "
            f"{_mean([r['oracle_best'] for r in rs]):.4f} | "
            f"{_mean([r['ratio_before'] for r in rs]):.4f} | {min(r['ratio_before'] for r in rs):.4f} | "
            f"{_mean([r['oracle_ratio'] for r in rs]):.4f} | {_mean([r['captured'] for r in rs]):.1%} | "
            f"{pooled(rs, 'ours'):.1%} | {pooled(rs, 'ours_before'):.1%} | "
            + ", ".join(f"{k} {v}" for k, v in wins.items() if v) + " | "
            + mode_means(rs, "global") + " | " + mode_means(rs, "hier") + " |"
        )
    lines += ["", "Per shape and mode (all families and seeds):", "",
              "| shape | mode | ours/best mean | min | gap captured: mean | pooled | ours/oracle |", "|---|---|---|---|---|---|---|"]
    for ranks, slots in SHAPES:
        for mode in ("global", "hier"):
            rs = [r for r in rows if r["shape"] == f"{ranks}x{slots}" and r["mode"] == mode]
            lines.append(f"| {ranks}x{slots} | {mode} | {_mean([r['ratio'] for r in rs]):.4f} | {min(r['ratio'] for r in rs):.4f} | "
                         f"{_mean([r['captured'] for r in rs]):.1%} | {pooled(rs, 'ours'):.1%} | {_mean([r['oracle_ratio'] for r in rs]):.4f} |")
    lines += [
        "",
        f"- all cases: ours / best baseline mean **{statistics.mean(ratios):.4f}x**, min {min(ratios):.4f}x, "
        f"{sum(x < 0.99 for x in ratios)} of {len(ratios)} below 0.99x; gap captured {pooled(rows, 'ours'):.1%} pooled "
        f"({_mean([r['captured'] for r in rows]):.1%} mean over cases)",
        f"- the informed planner (knows the trace process, not the next window's draws) / best baseline: mean "
        f"**{_mean([r['informed_ratio'] for r in rows]):.4f}x**, min {min(r['informed_ratio'] for r in rows):.4f}x, "
        f"{sum(r['informed_ratio'] < 0.99 for r in rows)} of {len(rows)} below 0.99x; ours / informed mean "
        f"{_mean([r['ours_of_informed'] for r in rows]):.4f}x",
        "- what a past-only planner could be expected to average at most over these families (the informed planner's "
        "ratio on every family but regime switches, the oracle's there, where planning for the expected next window "
        "loses to the last regime whenever the regime stays): "
        f"**{ceiling(rows):.4f}x** the best baseline",
        "- 144x2 planning time (CPU time, median of 9, after the cases, while the machine's 1-minute load average was "
        f"{t['load']:.1f} on 2 cores): " + ", ".join(f"{k[0]} {k[1]} {v * 1e3:.0f} ms" for k, v in t.items() if k != "load")
        + f"; ours / greedy {t[('ours', 'global')] / t[('greedy', 'global')]:.1f}x (global), "
        f"{t[('ours', 'hier')] / t[('greedy', 'hier')]:.1f}x (hier) (goal: ours <= 100 ms)",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section("balancer_families", text)
    return 0


from benchmarks.report import machine_line, write_section  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
