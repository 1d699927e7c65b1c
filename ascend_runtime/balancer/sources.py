"""Where expert load comes from: plug-in sources, one per engine instance.

A source's ``collect(session)`` returns the load routed since its previous
call as a :class:`LoadWindow` (``expert_load [L, E]`` token counts), or None
when nothing new arrived.

- :class:`HttpLoadSource`: the simulator's (or an adapter's)
  ``GET {url}/admin/expert_load?since=SEQ`` ->
  ``{"seq", "layers", "experts", "ranks", "expert_load": [[L x E]], "rank_load": [[L x R]]}``.
- :class:`DirLoadSource`: a directory of per-rank dump files (format below).

Dump directory format (one directory per instance)::

    DIR/rank_<r>.json   one file per EP rank r, rewritten atomically (temp + rename) by the dumper:
    {"rank": r, "seq": <int, increases with every dump>, "layers": L, "experts": E,
     "expert_load": [[L x E cumulative tokens this rank routed to each logical expert]]}

Counts are cumulative since the rank started; the source keeps the last dump of
each rank and returns the difference. The first dump seen, a smaller ``seq``, or any
count going down (the rank restarted) counts in full. A file that is
missing, partial, of the wrong shape or with counts that are not finite and
non-negative is skipped for this round (logged, and listed in ``skipped`` of the
source, which offline readers such as ``balance plan --history`` refuse).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import numpy as np

log = logging.getLogger(__name__)


@dataclass
class LoadWindow:
    """Tokens per (layer, logical expert) ``[L, E]`` from one instance since its last window."""

    instance: str
    expert_load: np.ndarray
    ranks: int | None = None


class LoadSource(Protocol):
    name: str

    async def collect(self, session: aiohttp.ClientSession) -> LoadWindow | None: ...


class HttpLoadSource:
    """Polls ``GET {url}/admin/expert_load?since=SEQ``; remembers the returned seq."""

    def __init__(self, name: str, url: str, timeout_s: float = 5.0) -> None:
        self.name, self.url, self.timeout_s = name, url.rstrip("/"), timeout_s
        self.seq = 0

    async def collect(self, session: aiohttp.ClientSession) -> LoadWindow | None:
        async with session.get(
            f"{self.url}/admin/expert_load", params={"since": str(self.seq)},
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        ) as resp:
            resp.raise_for_status()
            body: dict[str, Any] = await resp.json()
        load = np.asarray(body["expert_load"], dtype=np.float64)
        if load.shape != (int(body["layers"]), int(body["experts"])):
            raise ValueError(f"{self.name}: expert_load shape {load.shape} != layers x experts")
        self.seq = int(body["seq"])
        if load.sum() <= 0:
            return None
        return LoadWindow(self.name, load, int(body["ranks"]) if body.get("ranks") else None)


_RANK_FILE = re.compile(r"^rank_(\d+)\.json$")


def count_array(data: Any) -> np.ndarray:
    """``data`` (nested lists of JSON numbers) as a float64 array; ValueError for text, booleans, nulls or ragged lists."""
    try:
        array = np.asarray(data)
    except ValueError:
        raise ValueError("expert_load is not a rectangular array") from None
    if array.dtype.kind not in "iuf":
        raise ValueError(f"expert_load holds {'booleans' if array.dtype.kind == 'b' else 'values other than numbers'}"
                         " (ragged rows, text or nulls)")
    return array.astype(np.float64)


class DirLoadSource:
    """Reads ``DIR/rank_<r>.json`` cumulative dumps and returns their summed deltas."""

    def __init__(self, name: str, directory: str | Path) -> None:
        self.name, self.directory = name, Path(directory)
        self._last: dict[int, tuple[int, np.ndarray]] = {}
        #: (file, reason) of every rank file the last :meth:`read` skipped
        self.skipped: list[tuple[Path, str]] = []

    def read(self) -> LoadWindow | None:
        """Synchronous collect (the files are local)."""
        total: np.ndarray | None = None
        ranks = 0
        self.skipped = []
        for path in sorted(self.directory.glob("rank_*.json")):
            m = _RANK_FILE.match(path.name)
            if not m:
                continue
            try:
                doc = json.loads(path.read_text())
                rank, seq = int(doc["rank"]), int(doc["seq"])
                cum = count_array(doc["expert_load"])
                if cum.shape != (int(doc["layers"]), int(doc["experts"])) or rank != int(m.group(1)):
                    raise ValueError("shape or rank does not match the header")
                if not np.isfinite(cum).all() or (cum < 0).any():
                    raise ValueError("expert_load holds counts that are not finite and non-negative")
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:  # RecursionError: nested too deeply
                log.warning("%s: skipping %s: %s", self.name, path, exc)
                self.skipped.append((path, str(exc)))
                continue
            ranks += 1
            prev = self._last.get(rank)
            if prev is None or seq < prev[0] or (prev[1].shape == cum.shape and (cum < prev[1]).any()):
                delta = cum  # first sight or restart: everything counted so far
            elif seq == prev[0]:
                delta = np.zeros_like(cum)
            else:
                delta = cum - prev[1] if prev[1].shape == cum.shape else cum
            self._last[rank] = (seq, cum)
            total = delta if total is None else (total + delta if total.shape == delta.shape else total)
        if total is None or total.sum() <= 0:
            return None
        return LoadWindow(self.name, total, ranks or None)

    async def collect(self, session: aiohttp.ClientSession) -> LoadWindow | None:
        return self.read()
