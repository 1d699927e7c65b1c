"""Runtime fault injection, switched through POST /admin/faults (bearer token, like every /admin route).

Fields: ``error_rate`` (0..1, fraction of completion requests answered 500),
``added_latency_ms`` (wall-clock ms added before a completion request is
handled; not scaled by speedup, so tests can rely on it), ``hang`` (completion
requests, /health and the step loop stall until cleared), ``exit`` (the process
exits shortly after answering; in-process servers stop instead).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any


#: Longest ``added_latency_ms``: a day, as every duration the kit takes (a longer sleep overflows the timer).
MAX_ADDED_LATENCY_MS = 86_400_000.0


def _number(doc: dict[str, Any], key: str, maximum: float) -> float | None:
    """``doc[key]`` as a finite number within 0..``maximum``, None if absent; ValueError naming ``key``."""
    if key not in doc:
        return None
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= maximum:
        raise ValueError(f"{key} must be a number within 0..{maximum:g}, got {value!r}")
    return float(value)


class Faults:
    """Current fault settings plus the event the hang waits on."""

    def __init__(self, seed: int = 0) -> None:
        self.error_rate = 0.0
        self.added_latency_ms = 0.0
        self._running = asyncio.Event()
        self._running.set()
        self._rng = random.Random(seed)

    @property
    def hang(self) -> bool:
        """True while requests should stall."""
        return not self._running.is_set()

    def update(self, doc: Any) -> bool:
        """Apply a faults JSON object; returns whether ``exit`` was requested. Raises ValueError naming the field.

        Every field is checked before any is applied, so a refused update changes nothing."""
        if not isinstance(doc, dict):
            raise ValueError("faults must be a JSON object")
        unknown = set(doc) - {"error_rate", "added_latency_ms", "hang", "exit"}
        if unknown:
            raise ValueError(f"unknown fault fields: {sorted(unknown)}")
        rate = _number(doc, "error_rate", 1.0)
        latency = _number(doc, "added_latency_ms", MAX_ADDED_LATENCY_MS)
        for flag in ("hang", "exit"):
            if flag in doc and not isinstance(doc[flag], bool):
                raise ValueError(f"{flag} must be true or false, got {doc[flag]!r}")
        if rate is not None:
            self.error_rate = rate
        if latency is not None:
            self.added_latency_ms = latency
        if "hang" in doc:
            if doc["hang"]:
                self._running.clear()
            else:
                self._running.set()
        return bool(doc.get("exit", False))

    def as_dict(self) -> dict[str, Any]:
        """Current settings as JSON."""
        return {"error_rate": self.error_rate, "added_latency_ms": self.added_latency_ms, "hang": self.hang}

    def should_fail(self) -> bool:
        """Draw whether this request fails."""
        return self.error_rate > 0 and self._rng.random() < self.error_rate

    async def wait_not_hung(self) -> None:
        """Return once no hang is in force."""
        await self._running.wait()

    async def before_request(self) -> None:
        """Apply hang and added latency to a request."""
        await self._running.wait()
        if self.added_latency_ms > 0:
            await asyncio.sleep(self.added_latency_ms / 1000.0)
