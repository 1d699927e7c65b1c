"""Run a coroutine on uvloop when installed (a dependency on Linux), else on asyncio's default loop.

uvloop roughly halves the per-chunk cost of relaying and parsing SSE streams,
which is what the proxy, the simulator and the load generator spend their
time on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the fastest available loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
