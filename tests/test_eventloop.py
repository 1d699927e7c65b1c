"""The daemons' periodic loop: counts, stops, and errors either handled or raised."""

from __future__ import annotations

import asyncio

import pytest

from ascend_runtime.eventloop import run_every


def test_runs_max_cycles_and_hands_errors_to_on_error() -> None:
    seen: list[int] = []
    errors: list[str] = []

    async def cycle() -> None:
        seen.append(len(seen))
        if len(seen) == 2:
            raise RuntimeError("second cycle fails")

    ran = asyncio.run(run_every(0.0, cycle, asyncio.Event(), max_cycles=4, on_error=lambda e: errors.append(str(e))))
    assert (ran, seen, errors) == (4, [0, 1, 2, 3], ["second cycle fails"])


def test_without_on_error_a_failing_cycle_propagates() -> None:
    async def cycle() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(run_every(0.0, cycle, asyncio.Event()))


def test_a_set_stop_ends_the_wait_between_cycles() -> None:
    async def main() -> int:
        stop = asyncio.Event()

        async def cycle() -> None:
            stop.set()

        # an hour between cycles: only the stop event can end the wait
        return await asyncio.wait_for(run_every(3600.0, cycle, stop), timeout=30)

    assert asyncio.run(main()) == 1
