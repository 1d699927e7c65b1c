"""Fetching a ``/metrics`` answer for the planner (the proxy's, each prefill engine's) so that one bad answer
is a failed sample for that cycle, never an exception out of the cycle.

A scrape fails, with :class:`ScrapeFailed` saying why, when the server does not answer within the timeout,
answers a status other than 200, sends more than :data:`MAX_SCRAPE_BYTES`, or sends text that is not UTF-8
(the Prometheus text format is UTF-8). What the text means is checked by the parsers in observe.py, which
raise ``ValueError`` for an exposition they cannot read.
"""

from __future__ import annotations

import asyncio

import aiohttp

from ascend_runtime.httpread import read_text

#: Bytes read of one ``/metrics`` answer. The proxy's exposition grows with its instances (about 40 series per
#: instance, under 100 bytes each) and a vLLM 0.23.0 engine's stays well under 1 MiB; a longer answer is no
#: exposition the planner needs, and reading it whole could exhaust the planner's memory.
MAX_SCRAPE_BYTES = 16 << 20


class ScrapeFailed(Exception):
    """A ``/metrics`` answer that is no sample (``str()``: the URL and why)."""


async def fetch_metrics(session: aiohttp.ClientSession, url: str, timeout_s: float,
                        max_bytes: int = MAX_SCRAPE_BYTES) -> str:
    """The text of ``GET url`` (a ``/metrics`` URL) within ``timeout_s`` seconds for the whole answer and
    ``max_bytes`` bytes; :class:`ScrapeFailed` otherwise."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                raise ScrapeFailed(f"{url}: answered {resp.status}, not 200")
            return await read_text(resp, max_bytes)
    except asyncio.TimeoutError:
        raise ScrapeFailed(f"{url}: no whole answer within {timeout_s:g}s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise ScrapeFailed(f"{url}: {exc.__class__.__name__}: {exc}") from None
    except ValueError as exc:  # AnswerTooLarge, UnicodeDecodeError
        raise ScrapeFailed(f"{url}: {exc}") from None
