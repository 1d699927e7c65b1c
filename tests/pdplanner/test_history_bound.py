"""The planner's per-cycle records stay bounded over a long run, and bounding them changes no decision."""

from __future__ import annotations

import gc
import tracemalloc
from collections import deque
from pathlib import Path
from typing import Any

from ascend_runtime.pdplanner.daemon import HISTORY_CYCLES, DaemonConfig, PDPlanner
from ascend_runtime.pdplanner.decide import PlannerConfig
from ascend_runtime.pdplanner.observe import Snapshot
from tests.pdplanner.test_decide import POOL, SLO

INTERVAL = 30.0  # modelled seconds between cycles
#: (arrival rate req/s, prompt tokens, output tokens) phases, each PHASE cycles long
PHASES = ((50.0, 8192.0, 128.0), (150.0, 512.0, 1024.0), (20.0, 2048.0, 512.0))
PHASE = 40


def snapshots(n: int) -> list[Snapshot]:
    """``n`` cumulative proxy snapshots of a load switching between PHASES (TTFT 1.5 s, ITL 30 ms)."""
    out: list[Snapshot] = []
    req = prompt = itl = 0.0
    for i in range(n):
        rate, p, o = PHASES[(i // PHASE) % len(PHASES)]
        if i:
            d = rate * INTERVAL
            req, prompt, itl = req + d, prompt + d * p, itl + d * (o - 1)
        out.append(Snapshot(i * INTERVAL, requests=req, ttft_buckets={2.0: req, float("inf"): req},
                            itl_buckets={0.04: itl, float("inf"): itl}, itl_count=itl, inflight={"prefill": 4.0},
                            prompt_tokens_sum=prompt))
    return out


def planner(tmp: Path, name: str) -> PDPlanner:
    cfg = DaemonConfig(metrics_url="http://127.0.0.1:1/metrics", dry_run=False, target_file=str(tmp / name),
                       interval_s=INTERVAL)
    return PDPlanner(cfg, POOL, SLO, PlannerConfig(k_intervals=2), current=(2, 3))


def key(record: dict[str, Any]) -> tuple[Any, ...]:
    d = record["decision"]
    return record["time"], d.reason, d.change, d.prefill, d.decode, d.optimum


def test_history_is_bounded_and_decisions_match_the_unbounded_run(tmp_path: Path) -> None:
    n = 3 * HISTORY_CYCLES + 17
    snaps = snapshots(n)
    bounded, unbounded = planner(tmp_path, "a.json"), planner(tmp_path, "b.json")
    unbounded.history = []  # type: ignore[assignment]  # the reference: every record kept
    got = [key(bounded.step(s)) for s in snaps]
    want = [key(unbounded.step(s)) for s in snaps]
    assert got == want  # bounding the records changed no decision over the whole run
    assert len(unbounded.history) == n and len(bounded.history) == HISTORY_CYCLES
    assert [key(r) for r in bounded.history] == [key(r) for r in unbounded.history[-HISTORY_CYCLES:]]
    changes = sum(1 for r in unbounded.history if r["decision"].change)
    assert changes >= 3  # the phases really move the split, so the comparison covers changes
    assert (bounded.cycles, bounded.changes) == (n, changes)  # run-long counts survive the bound
    assert len(bounded.state.change_times) <= bounded.planner.max_changes_per_hour


def test_memory_stops_growing_once_the_window_is_full(tmp_path: Path) -> None:
    warm, more = HISTORY_CYCLES + 50, 2 * HISTORY_CYCLES
    snaps = snapshots(warm + more)
    growth: dict[str, int] = {}
    for name, history in (("bounded", None), ("unbounded", [])):
        p = planner(tmp_path, name)
        if history is not None:
            p.history = history  # type: ignore[assignment]
        tracemalloc.start()  # before the warm-up: the full window's records are then traced ones
        try:
            for s in snaps[:warm]:
                p.step(s)
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            for s in snaps[warm:]:
                p.step(s)
            gc.collect()
            growth[name] = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert isinstance(p.history, deque if history is None else list)
    # the reference keeps `more` extra records; the bounded one replaces old records by new ones
    assert growth["unbounded"] > 0
    print("memory growth (bytes) over", more, "cycles:", growth)
    assert growth["bounded"] < 0.1 * growth["unbounded"], growth
