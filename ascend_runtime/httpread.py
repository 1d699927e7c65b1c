"""Reading an HTTP answer body (aiohttp client) with a size bound, for answers a process reads from other
services (engine and proxy ``/metrics``, ``/v1/models``): a server that answers without end, or with more
than the reader will ever need, is a failed read, not memory used up."""

from __future__ import annotations

import aiohttp


class AnswerTooLarge(ValueError):
    """An answer body longer than the reader's bound (``str()`` names both)."""


async def read_capped(resp: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body of ``resp``, at most ``max_bytes`` bytes; :class:`AnswerTooLarge` past that (a
    ``Content-Length`` above it is refused before any of the body is read)."""
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise AnswerTooLarge(f"answer of {resp.content_length} bytes is larger than the limit of {max_bytes} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > max_bytes:
            raise AnswerTooLarge(f"answer is larger than the limit of {max_bytes} bytes")
        parts.append(chunk)
    return b"".join(parts)


async def read_text(resp: aiohttp.ClientResponse, max_bytes: int) -> str:
    """The body of ``resp`` as UTF-8 text (as the Prometheus text format is), at most ``max_bytes`` bytes;
    ``ValueError`` (:class:`AnswerTooLarge`, ``UnicodeDecodeError``) otherwise."""
    return (await read_capped(resp, max_bytes)).decode("utf-8")
