"""The fake OpenAI server of conftest.py in a process of its own, with fixed timing.

Run: python -m tests.checks.fixed_timing_server TTFT_S ITL_S; prints its URL
on stdout, serves until killed. A separate process keeps the load generator's
event loop from delaying the fake's writes.

``GET /stream-log`` returns the schedule the server actually kept: per
streaming request, ``time.perf_counter()`` when its handler started and before
each content write. On Linux perf_counter is CLOCK_MONOTONIC, one clock for
every process of the machine, so the test compares these instants with the
load generator's own. A loaded host may make the server late against its
nominal schedule (TTFT_S, ITL_S); the truth is what it really did.
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

from tests.checks.conftest import FakeBehaviour, FakeOpenAI


class LoggedFake(FakeOpenAI):
    """The fake plus ``GET /stream-log``."""

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/stream-log", self.stream_log_json)
        return app

    async def stream_log_json(self, request: web.Request) -> web.Response:
        return web.json_response([{"arrival": arrival, "writes": writes} for arrival, writes in self.stream_log])


async def serve(ttft_s: float, itl_s: float) -> None:
    fake = LoggedFake(FakeBehaviour(ttft_s=ttft_s, itl_s=itl_s))
    print(await fake.start(), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve(float(sys.argv[1]), float(sys.argv[2])))
