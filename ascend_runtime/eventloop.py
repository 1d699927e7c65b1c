"""Run a coroutine on uvloop when installed (a dependency on Linux), else on asyncio's default loop;
and the periodic loop of the kit's daemons (balancer, P:D planner, fault watcher).

uvloop roughly halves the per-chunk cost of relaying and parsing SSE streams,
which is what the proxy, the simulator and the load generator spend their
time on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest available loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


async def run_every(interval_s: float, cycle: Callable[[], Awaitable[object]], stop: asyncio.Event,
                    max_cycles: int | None = None,
                    on_error: Callable[[Exception], None] | None = None) -> int:
    """Await ``cycle()`` every ``interval_s`` seconds (from cycle start to cycle start) until ``stop`` is set
    or ``max_cycles`` cycles ran; returns the number of cycles run.

    A cycle that raises goes to ``on_error`` and the loop goes on; without ``on_error`` it propagates.
    """
    cycles = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            await cycle()
        except Exception as exc:
            if on_error is None:
                raise
            on_error(exc)
        cycles += 1
        if max_cycles is not None and cycles >= max_cycles:
            break
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(0.0, interval_s - (time.monotonic() - started)))
        except TimeoutError:
            pass
    return cycles
