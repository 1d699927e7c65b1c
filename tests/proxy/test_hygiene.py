"""Client input and connection hygiene: vLLM 0.23.0's 400s for malformed fields, limits and timeouts.

Connection tests talk raw HTTP over a socket. A stalled or slow client is
stalled for good (it never completes), so the verdict does not depend on the
machine's speed; the only waits are generous upper bounds.
"""

from __future__ import annotations

import asyncio
import json

from ascend_runtime.proxy.config import Limits

REQ = {"prompt": "hello world", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


async def _post(http, url, body):
    async with http.post(url, data=json.dumps(body), headers={"Content-Type": "application/json"}) as resp:
        return resp.status, await resp.json(content_type=None)


async def test_malformed_fields_get_vllm_400s_and_are_not_forwarded(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    comp, chat = px.url + "/v1/completions", px.url + "/v1/chat/completions"
    cases = [
        (comp, {**REQ, "max_tokens": "abc"}, "Bad Request", None),
        (comp, {**REQ, "max_tokens": 1.5}, "Bad Request", None),
        (comp, {**REQ, "max_tokens": [4]}, "Bad Request", None),
        (comp, {**REQ, "stream": "maybe"}, "Bad Request", None),
        (comp, {**REQ, "prompt": {"text": "hi"}}, "Bad Request", None),
        (comp, {**REQ, "max_tokens": -5}, "BadRequestError", "max_tokens"),
        (comp, {**REQ, "max_tokens": 0}, "BadRequestError", "max_tokens"),
        (chat, {**CHAT, "messages": "hi"}, "Bad Request", None),
        (chat, {**CHAT, "messages": ["hi"]}, "Bad Request", None),
        (chat, {"max_tokens": 4}, "Bad Request", None),  # messages is required
        (chat, {**CHAT, "max_tokens": "abc"}, "Bad Request", None),
        (chat, {**CHAT, "max_completion_tokens": -1}, "BadRequestError", "max_tokens"),
    ]
    for url, body, err_type, param in cases:
        status, answer = await _post(http, url, body)
        assert status == 400, (body, answer)
        err = answer["error"]
        assert set(err) == {"message", "type", "param", "code"}, answer
        assert (err["type"], err["param"], err["code"]) == (err_type, param, 400), (body, answer)
    _, answer = await _post(http, comp, {**REQ, "max_tokens": -5})
    assert answer["error"]["message"] == "max_tokens must be at least 1, got -5. (parameter=max_tokens, value=-5)"
    assert p.engine.requests == [] and d.engine.requests == []
    # what vLLM accepts passes: lax integers, and no model (vLLM uses the served model)
    for url, body in ((comp, {**REQ, "max_tokens": "3"}), (comp, {"prompt": "hi"}), (chat, CHAT),
                      (comp, {**REQ, "max_tokens": 0, "echo": True}),
                      # chat with max_completion_tokens ignores max_tokens (vLLM 0.23.0 get_max_tokens);
                      # completions have no max_completion_tokens field: ignored, whatever its value
                      (chat, {**CHAT, "max_completion_tokens": 3, "max_tokens": 0}),
                      (comp, {**REQ, "max_completion_tokens": 0}), (comp, {**REQ, "max_completion_tokens": "x"})):
        status, answer = await _post(http, url, body)
        assert status == 200, (body, answer)
    assert "model" not in p.engine.requests[1]
    async with http.get(px.url + "/metrics") as resp:
        text = await resp.text()
    assert 'ascend_proxy_requests_total{endpoint="/v1/completions",outcome="client_error",status="400"} 8.0' in text
    assert 'ascend_proxy_requests_total{endpoint="/v1/chat/completions",outcome="client_error",status="400"} 5.0' \
        in text
    assert 'ascend_proxy_requests_total{endpoint="/v1/completions",outcome="success",status="200"} 5.0' in text


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status = int(head.split(b" ", 2)[1])
    length = int([ln.split(b":", 1)[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
    body = await asyncio.wait_for(reader.readexactly(length), 10)
    return status, json.loads(body)


async def test_slow_headers_are_disconnected_at_the_header_timeout(stubs, proxy):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d, limits=Limits(header_timeout_s=0.3))
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"X-Padding: " + b"a" * 400 + b"\r\nContent-Length: 2\r\n\r\n")
    reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
    sent = 0
    closed = False
    try:
        for byte in head:  # one byte every 50 ms: the whole head would take ~23 s
            writer.write(bytes([byte]))
            await writer.drain()
            sent += 1
            try:
                data = await asyncio.wait_for(reader.read(1), 0.05)
            except asyncio.TimeoutError:
                continue
            assert data == b"", data  # the server answers nothing: it closes
            closed = True
            break
    except ConnectionError:
        closed = True
    finally:
        writer.close()
    assert closed and sent < len(head), f"connection still open after {sent} of {len(head)} bytes"


async def test_stalled_body_gets_408_and_is_counted(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d, limits=Limits(body_timeout_s=0.2))
    reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"prompt\": ")  # and then nothing more
    await writer.drain()
    status, answer = await _read_answer(reader)
    writer.close()
    assert status == 408 and answer["error"]["code"] == 408 and answer["error"]["type"] == "Request Timeout"
    assert p.engine.requests == []
    async with http.get(px.url + "/metrics") as resp:
        assert 'outcome="client_error",status="408"} 1.0' in await resp.text()


async def test_body_over_the_limit_is_refused_on_content_length_without_reading_it(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d, limits=Limits(max_body_bytes=1000, body_timeout_s=30))
    reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
    # 70 MB announced, not one byte of it sent: the answer must come at once, from the header alone
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 70000000\r\n\r\n")
    await writer.drain()
    status, answer = await _read_answer(reader)
    assert status == 413 and answer["error"]["type"] == "Request Entity Too Large"
    assert "70000000" in answer["error"]["message"]
    assert await asyncio.wait_for(reader.read(), 10) == b""  # and the connection is closed
    writer.close()
    # a chunked body is cut off once it passes the limit
    reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    for _ in range(3):
        writer.write(b"258\r\n" + b" " * 600 + b"\r\n")  # 600-byte chunks, no final chunk
    await writer.drain()
    status, answer = await _read_answer(reader)
    writer.close()
    assert status == 413 and answer["error"]["code"] == 413
    # within the limit is fine
    status, _ = await _post(http, px.url + "/v1/completions", REQ)
    assert status == 200
    async with http.get(px.url + "/metrics") as resp:
        assert 'outcome="client_error",status="413"} 2.0' in await resp.text()
