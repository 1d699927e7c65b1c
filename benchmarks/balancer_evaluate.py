"""Benchmark: the `balance evaluate` replay for the a2-staging and cm384-prod stage shapes.

Run: ``python -m benchmarks.balancer_evaluate`` (several minutes on 2 cores: FlashLB dominates).
Writes the ``balancer_evaluate`` section of docs/benchmarks.md (``--no-write`` prints only).

The recorded load is a simulator dump (``sim.experts.record_dumps``: 58 layers x 256 experts,
skewed routing with an Ornstein-Uhlenbeck drift), read back as ``balance evaluate --load-dir``
reads it; each stack's stages are replayed with ``evaluate.evaluate`` (modelled MoE time per
step from the stack's model shape and hardware, moving weights charged, moves per hour for
60 s windows, balancedness on every next window).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from ascend_runtime.balancer import evaluate as ev
from ascend_runtime.cli.commands.balance import _read_history
from ascend_runtime.config.loader import load_stack
from ascend_runtime.sim.experts import ExpertRouter, record_dumps

STACKS = ("a2-staging", "cm384-prod")
WINDOWS = 9
INTERVALS = [1, 4]
WINDOW_STEPS, WINDOW_SECONDS = 600, 60.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        router = ExpertRouter(58, 256, 8, seed=args.seed, skew=1.0, drift_sigma=0.5, drift_rate=0.02)
        record_dumps(router, tmp, windows=WINDOWS, steps_per_window=4, tokens_per_step=4096, ranks=2)
        hist, rc = _read_history(tmp)
    if rc:
        return rc
    lines = ["## Expert balancing replay (`balance evaluate`) for the shipped stacks", "",
             f"Command: `python -m benchmarks.balancer_evaluate --seed {args.seed}` (TIME s). {machine_line()}.", "",
             f"Load: a simulator dump, {WINDOWS} windows x 58 layers x 256 experts (drifting skewed routing), replayed per "
             f"stage from the initial map; rebalance every {INTERVALS} windows of {WINDOW_STEPS} steps; moves per hour for "
             f"{WINDOW_SECONDS:.0f} s windows. MoE ms/step is modelled (expert weight reads + expert FLOPs on the most "
             "loaded rank per layer, MTP layer as a mean layer, moving weights charged unoverlapped).", ""]
    for name in STACKS:
        models = ev.stage_models(load_stack(name).config)
        recs = []
        for role, model in models.items():
            replays = ev.evaluate(hist, model, list(ev.POLICIES), INTERVALS, window_steps=WINDOW_STEPS,
                                  progress=lambda m, n=name: print(f"{n} {m}", file=sys.stderr, flush=True))
            rec = ev.recommend(model, replays, WINDOW_STEPS)
            recs.append(rec)
            lines += [f"### {name} {role} (EP {model.ranks}, stack redundant_experts {model.redundant})", "",
                      "| policy | redundant | interval | balancedness | MoE ms/step | moves/hour |", "|---|---|---|---|---|---|"]
            for r in replays:
                lines.append(f"| {r.policy} | {r.redundant} | {r.interval} | {r.mean_balancedness:.4f} | {r.mean_moe_ms:.3f} | "
                             f"{ev.moves_per_hour(r, WINDOWS - 1, WINDOW_SECONDS):.0f} |")
            best = rec["replay"]
            o = rec["ours"]
            lines += ["", f"Recommended (engine policies): {best.policy} redundant {rec['redundant_experts']} interval "
                      f"{best.interval} -> {rec['moe_ms']:.3f} ms/step" + (f" ({rec['note']})" if rec["note"] else "")
                      + (f"; ours (static maps) {o.redundant}/{o.interval} -> {o.mean_moe_ms:.3f} ms/step" if o else ""), ""]
        lines += ["```yaml", ev.recommendation_yaml(recs).rstrip(), "```", ""]
    text = "\n".join(lines).replace("TIME", f"{time.perf_counter() - start:.0f}")
    print(text)
    if not args.no_write:
        write_section("balancer_evaluate", text)
    return 0


from benchmarks.report import machine_line, write_section  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
