"""The fake OpenAI server of conftest.py in a process of its own, with fixed timing.

Run: python -m tests.checks.fixed_timing_server TTFT_S ITL_S; prints its URL
on stdout, serves until killed. A separate process keeps the load generator's
event loop from delaying the fake's writes, so the schedule itself is the truth.
"""

from __future__ import annotations

import asyncio
import sys

from tests.checks.conftest import FakeBehaviour, FakeOpenAI


async def serve(ttft_s: float, itl_s: float) -> None:
    fake = FakeOpenAI(FakeBehaviour(ttft_s=ttft_s, itl_s=itl_s))
    print(await fake.start(), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(float(sys.argv[1]), float(sys.argv[2])))
