"""Malformed request heads: counted in requests_total, logged one line at a time without a traceback."""

from __future__ import annotations

import asyncio
import logging

from ascend_runtime.proxy.protolog import ProtocolErrorLog
from aiohttp.http_exceptions import BadHttpMessage

BAD_HEADS = [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nBad Header Line\r\n\r\n",
    b"POST /v1/completions HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -4\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS ClientHello on the plain port
]


async def _send_raw(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


async def test_malformed_heads_are_counted_and_logged_without_tracebacks(stubs, proxy, http, caplog) -> None:
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    caplog.set_level(logging.DEBUG, logger="ascend_runtime.proxy.http")
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    for raw in BAD_HEADS * 3:
        answer = await _send_raw(px.port, raw)
        assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n", 1)[0], (raw[:40], answer[:80])
    async with http.get(px.url + "/metrics") as resp:
        text = await resp.text()
    line = next(x for x in text.splitlines() if x.startswith("ascend_proxy_requests_total{") and 'outcome="bad_request"' in x)
    assert 'endpoint="-"' in line and 'status="400"' in line
    assert float(line.split()[-1]) == len(BAD_HEADS) * 3
    records = [r for r in caplog.records if r.name in ("ascend_runtime.proxy.http", "aiohttp.server")]
    assert not [r for r in records if r.exc_info], "a malformed head logged a traceback"
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    # rate-limited: far fewer lines than refused heads (the exact one-per-interval rule is tested on a fake clock
    # below, so this verdict does not depend on how long the 18 connections took)
    assert 1 <= len(warnings) < len(BAD_HEADS) * 3 // 2, [r.getMessage() for r in warnings]
    assert "refused a malformed HTTP request" in warnings[0].getMessage()
    assert p.engine.requests == [] and d.engine.requests == []


def test_the_log_line_is_rate_limited_and_says_how_many_it_left_out(caplog) -> None:
    now = [100.0]
    counted: list[int] = []
    plog = ProtocolErrorLog(logging.getLogger("t.protolog"), lambda: counted.append(1), interval_s=10, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="t.protolog")
    for _ in range(5):
        plog.exception("Error handling request from %s", "127.0.0.1", exc_info=BadHttpMessage("bad line"))
    now[0] += 11
    plog.exception("Error handling request from %s", "127.0.0.1", exc_info=BadHttpMessage("bad line"))
    assert len(counted) == 6
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2 and "4 more" in msgs[1] and "127.0.0.1" in msgs[0]
    # anything that is not a parser error keeps its traceback
    try:
        raise KeyError("handler bug")
    except KeyError as exc:
        plog.exception("Error handling request", exc_info=exc)
    assert caplog.records[-1].exc_info is not None and len(counted) == 6
