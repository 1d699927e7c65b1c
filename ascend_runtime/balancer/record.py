"""Record expert load from running instances as the dump snapshots `balance evaluate` and `balance plan` read.

``ascend-deploy balance record`` polls each instance's ``GET /admin/expert_load?since=SEQ`` (the
simulator's; :class:`~ascend_runtime.balancer.sources.HttpLoadSource`) every ``every_s`` seconds and
writes one snapshot per window and stage::

    OUT/<stage>/w<NNNN>/rank_<r>.json    (with a stack: stage = prefill, decode)
    OUT/w<NNNN>/rank_<r>.json            (instances given one by one: one stage)

in the dump format of :mod:`ascend_runtime.balancer.sources` (cumulative per rank, ``seq`` = window
number). A window's load is the sum over the stage's instances, split over the instance's EP ranks by
whole tokens (every rank's count only grows, so readers see non-negative deltas). A window in which a
stage routed no token is not written: ``balance evaluate`` refuses empty windows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ascend_runtime.files.write import OutputDir


def split_over_ranks(load: np.ndarray, ranks: int) -> np.ndarray:
    """Whole tokens ``load [L, E]`` -> ``[ranks, L, E]`` that sums to it, rank ``r`` taking its share
    ``floor(load (r + 1) / ranks) - floor(load r / ranks)`` (non-negative, sums exactly)."""
    whole = np.rint(np.maximum(load, 0.0)).astype(np.int64)
    edges = np.stack([whole * r // ranks for r in range(ranks + 1)])
    return np.diff(edges, axis=0)


@dataclass
class StageDumps:
    """Cumulative per-rank dumps of one stage under ``directory``: ``add`` writes the next snapshot."""

    directory: Path
    ranks: int = 1
    windows: int = 0
    totals: np.ndarray | None = field(default=None, repr=False)

    def add(self, load: np.ndarray) -> Path | None:
        """Add one window's ``load [L, E]``; write ``w<NNNN>/rank_<r>.json``; None (nothing written) if empty."""
        shares = split_over_ranks(load, self.ranks)
        if shares.sum() <= 0:
            return None
        self.totals = shares if self.totals is None else self.totals + shares
        snap = f"w{self.windows:04d}"
        layers, experts = load.shape
        with OutputDir(self.directory) as out:  # never through a link planted in the dump directory
            for r, counts in enumerate(self.totals):
                doc = {"rank": r, "seq": self.windows + 1, "layers": layers, "experts": experts,
                       "expert_load": counts.tolist()}
                out.write(f"{snap}/rank_{r}.json", json.dumps(doc))  # atomically (temp + rename), as a dumper must
        self.windows += 1
        return self.directory / snap


async def record(stages: dict[str, list[Any]], out: Path, windows: int, every_s: float, session: Any,
                 say: Callable[[str], None] = print) -> dict[str, int]:
    """Poll every source of every stage ``windows`` times, ``every_s`` apart; returns windows written per stage.

    ``stages``: stage name ("" for the one undivided stage) -> load sources (``collect(session)``). The
    first poll only sets each source's starting point (load before recording began is not counted)."""
    dumps = {stage: StageDumps(out / stage if stage else out) for stage in stages}
    for sources in stages.values():
        for source in sources:
            await source.collect(session)
    for w in range(windows):
        await asyncio.sleep(every_s)
        for stage, sources in stages.items():
            loads = [window for source in sources if (window := await source.collect(session)) is not None]
            if not loads:
                say(f"window {w + 1}/{windows} {stage or 'load'}: no tokens routed; not written")
                continue
            if dumps[stage].totals is None:  # every snapshot of a stage has the same rank files
                dumps[stage].ranks = loads[0].ranks or dumps[stage].ranks
            snap = dumps[stage].add(sum(window.expert_load for window in loads))
            say(f"window {w + 1}/{windows} {stage or 'load'}: "
                f"{'wrote ' + str(snap) if snap else 'no whole token routed; not written'}")
    return {stage: d.windows for stage, d in dumps.items()}
