"""A corpus of malformed requests, over real HTTP (raw sockets), against the proxy in front of stub engines
that refuse requests as vLLM 0.23.0 does (``ascend_runtime.sim.api``, the simulator's model of vLLM's dialect).

For every case: the status, the ``{"error": {message, type, param, code}}`` shape, which engine saw the
request (none when the proxy must refuse it itself: the fields it reads or rewrites, validate.py; the
prefill when a field goes to it unchanged; the decode for what only the decode can refuse), an engine's
refusal relayed byte for byte, and, at the end, ``requests_total`` equal to the tally of every outcome.
Expected answers are vLLM 0.23.0's (docs/proxy.md, "Input hygiene", cites the code).
"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ascend_runtime.proxy.pd import client_view_of_prefill_refusal
from ascend_runtime.proxy.config import Limits
from ascend_runtime.proxy.validate import MAX_DEPTH
from ascend_runtime.sim import api as vllm_dialect

C, H = "/v1/completions", "/v1/chat/completions"
MAX_MODEL_LEN = 4096
MSG = [{"role": "user", "content": "hello there"}]
WAIT_S = 10  # upper bound of any wait for an answer (never a threshold of the verdict)


@dataclass
class Answer:
    version: bytes
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict[str, Any]:
        obj = json.loads(self.body)
        assert list(obj) == ["error"] and list(obj["error"]) == ["message", "type", "param", "code"], obj
        assert obj["error"]["code"] == self.status and obj["error"]["message"], obj
        return obj["error"]


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[:size]
        data = data[size + 2:]


def parse_answer(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    version, status = lines[0].split(b" ")[:2]
    headers = {k.strip().lower().decode(): v.strip().decode("latin-1")
               for k, _, v in (ln.partition(b":") for ln in lines[1:])}
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    return Answer(version, int(status), headers, body)


def request(path: str, body: bytes, headers: list[tuple[bytes, bytes]] | None = None, *,
            ctype: bytes | None = b"application/json", version: bytes = b"1.1") -> bytes:
    """One request with ``Connection: close`` and a Content-Length (unless ``headers`` frame the body)."""
    lines = [b"POST %b HTTP/%b" % (path.encode(), version), b"Host: proxy", b"Connection: close"]
    if ctype is not None:
        lines.append(b"Content-Type: " + ctype)
    extra = headers or []
    lines += [k + b": " + v for k, v in extra]
    if not any(k.lower() == b"transfer-encoding" for k, _ in extra):
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def exchange(port: int, data: bytes) -> Answer:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return parse_answer(await asyncio.wait_for(reader.read(), WAIT_S))
    finally:
        writer.close()


def speak_vllm(p: Any, d: Any) -> dict[str, list[bytes]]:
    """Make the stubs refuse what vLLM 0.23.0 refuses (the bytes of each refusal are kept per role)."""
    refused: dict[str, list[bytes]] = {"prefill": [], "decode": []}

    def check(req: dict[str, Any], chat: bool, role: str) -> tuple[web.Response | None, Any]:
        try:
            return None, vllm_dialect.parse(req, chat, "deepseek-r1", MAX_MODEL_LEN, 32000)
        except vllm_dialect.ApiError as err:
            raw = json.dumps(err.body()).encode()
            refused[role].append(raw)
            return web.Response(body=raw, status=err.status, content_type="application/json"), None

    prefill_answer, decode_answer = p.engine._prefill_answer, d.engine._decode_answer

    def prefill(req: dict[str, Any], chat: bool) -> web.Response:
        refusal, _ = check(req, chat, "prefill")
        return refusal or prefill_answer(req, chat)

    async def decode(request: web.Request, req: dict[str, Any], chat: bool) -> web.StreamResponse:
        refusal, parsed = check(req, chat, "decode")
        if refusal is not None:
            return refusal
        # the stub reads these raw: give it what the engine read (lax types), and a short answer
        return await decode_answer(request, {**req, "stream": parsed.stream, "max_tokens": 3}, chat)

    p.engine._prefill_answer = prefill  # type: ignore[method-assign]
    d.engine._decode_answer = decode  # type: ignore[method-assign]
    return refused


def body(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode()


def nested(depth: int) -> str:
    return "[" * (depth - 1) + "]" * (depth - 1)  # inside the body object: ``depth`` containers in all


# (name, path, body bytes, expected status, expected type, expected param, who answers)
#   who: "proxy" (no engine saw it), "prefill" / "decode" (that engine's refusal, relayed), "ok" (200)
Case = tuple[str, str, bytes, int, str | None, str | None, str]
BR, BRE = "Bad Request", "BadRequestError"


def corpus() -> list[Case]:
    cases: list[Case] = []

    def comp(name: str, extra: dict[str, Any], status: int, typ: str | None = None, param: str | None = None,
             who: str = "proxy", base: dict[str, Any] | None = None) -> None:
        cases.append((f"completions {name}", C, body({**(base or {"prompt": "a b c", "max_tokens": 4}), **extra}),
                      status, typ, param, who))

    def chat(name: str, extra: dict[str, Any], status: int, typ: str | None = None, param: str | None = None,
             who: str = "proxy", base: dict[str, Any] | None = None) -> None:
        cases.append((f"chat {name}", H, body({**(base or {"messages": MSG, "max_tokens": 4}), **extra}),
                      status, typ, param, who))

    # the body itself: not JSON, not an object, not UTF-8, too deep (the proxy's own answers)
    for name, raw in (("empty", b""), ("spaces", b"  \r\n "), ("not json", b"{not json"), ("truncated", b'{"prompt": "a'),
                      ("trailing junk", b'{"prompt": "a"} x'), ("two objects", b'{"prompt": "a"}{"prompt": "b"}'),
                      ("null", b"null"), ("array", b"[1, 2]"), ("string", b'"prompt"'), ("number", b"5"),
                      ("true", b"true"), ("not utf-8", b'{"prompt": "\xff\xfe"}'), ("latin-1", b'{"prompt": "caf\xe9"}'),
                      ("5000-digit integer", b'{"prompt": "a", "max_tokens": 1' + b"0" * 5000 + b"}"),
                      ("too deep", b'{"prompt": "a", "x": %b}' % nested(MAX_DEPTH + 1).encode()),
                      ("far too deep", b'{"prompt": "a", "x": %b}' % nested(5000).encode()),
                      ("deep chat content", None)):
        if raw is None:
            raw = b'{"messages": [{"role": "user", "content": %b}]}' % nested(MAX_DEPTH).encode()
            cases.append((name, H, raw, 400, BR, None, "proxy"))
            continue
        cases.append((f"body {name}", C, raw, 400, BR, None, "proxy"))
    # what Python's json (starlette's Request.json) reads: BOM, UTF-16, NaN, lone surrogate escapes
    ok = body({"prompt": "a b c", "max_tokens": 4})
    cases += [("body utf-8 bom", C, b"\xef\xbb\xbf" + ok, 200, None, None, "ok"),
              ("body utf-16", C, ok.decode().encode("utf-16"), 200, None, None, "ok"),
              ("body NaN in an unknown field", C, b'{"prompt": "a b", "x": NaN, "y": -Infinity}', 200, None, None, "ok"),
              ("body lone surrogate", C, b'{"prompt": "a \\ud800 b", "max_tokens": 2}', 200, None, None, "ok"),
              ("body deep but within the limit", C, b'{"prompt": "a", "x": %b}' % nested(MAX_DEPTH).encode(),
               200, None, None, "ok"),
              ("body duplicate keys: the last one counts", C, b'{"prompt": "a", "stream": false, "stream": "maybe"}',
               400, BR, None, "proxy")]

    # stream (read and rewritten): vLLM's lax bool
    for v in ("maybe", 2, 1.5, [], {}, ""):
        comp(f"stream={v!r}", {"stream": v}, 400, BR)
        chat(f"stream={v!r}", {"stream": v}, 400, BR)
    for v in (True, False, None, "true", "false", 1, 0, "yes", "off"):
        comp(f"stream={v!r}", {"stream": v}, 200, who="ok")
    # echo (read): completions bool | None, chat bool
    for v in ("x", 2, [True]):
        comp(f"echo={v!r}", {"echo": v}, 400, BR)
        chat(f"echo={v!r}", {"echo": v}, 400, BR)
    comp("echo=None", {"echo": None}, 200, who="ok")
    chat("echo=None", {"echo": None}, 400, BR)
    # max_tokens (read and rewritten)
    for v in ("abc", 1.5, [4], {"n": 4}, "1e2", float("nan"), float("inf"), 1e400, "4.5"):
        comp(f"max_tokens={v!r}", {"max_tokens": v}, 400, BR)
        chat(f"max_tokens={v!r}", {"max_tokens": v}, 400, BR)
    for v in (0, -1, -5, -(2 ** 70)):
        comp(f"max_tokens={v}", {"max_tokens": v}, 400, BRE, "max_tokens")
        chat(f"max_tokens={v}", {"max_tokens": v}, 400, BRE, "max_tokens")
    for v in ("3", 3.0, "3.0", True, None, " 3 "):
        comp(f"max_tokens={v!r}", {"max_tokens": v}, 200, who="ok")
        chat(f"max_tokens={v!r}", {"max_tokens": v}, 200, who="ok")
    comp("max_tokens=0 with echo", {"max_tokens": 0, "echo": True}, 200, who="ok")
    # beyond the context: only the engine knows max_model_len; the prefill copy asks for 1 token
    comp("max_tokens=10**30", {"max_tokens": 10 ** 30}, 400, BRE, "max_tokens", who="decode")
    # max_completion_tokens: chat (read and rewritten); completions have no such field (ignored)
    for v in ("x", 2.5, [1]):
        chat(f"max_completion_tokens={v!r}", {"max_completion_tokens": v}, 400, BR)
        comp(f"max_completion_tokens={v!r}", {"max_completion_tokens": v}, 200, who="ok")
    chat("max_completion_tokens=0", {"max_completion_tokens": 0}, 400, BRE, "max_tokens")
    chat("max_completion_tokens=3 max_tokens=0", {"max_completion_tokens": 3, "max_tokens": 0}, 200, who="ok")
    # min_tokens (rewritten to 1 in the prefill copy): int, >= 0, <= the output limit
    for v in ("x", 1.5, None, [1]):
        comp(f"min_tokens={v!r}", {"min_tokens": v}, 400, BR)
        chat(f"min_tokens={v!r}", {"min_tokens": v}, 400, BR)
    comp("min_tokens=-1", {"min_tokens": -1}, 400, BRE)
    comp("min_tokens above max_tokens", {"min_tokens": 5}, 400, BRE)
    chat("min_tokens above max_completion_tokens", {"min_tokens": 3, "max_completion_tokens": 2}, 400, BRE)
    comp("min_tokens=2", {"min_tokens": "2"}, 200, who="ok")
    chat("min_tokens without a limit", {"min_tokens": 50}, 200, who="ok", base={"messages": MSG})
    # stream_options (dropped from the prefill copy)
    comp("stream_options without stream", {"stream_options": {"include_usage": True}}, 400, BR, "stream_options")
    chat("stream_options with stream=false", {"stream": False, "stream_options": {"include_usage": True}},
         400, BR, "stream_options")
    for v in ("x", 5, {"include_usage": "maybe"}):
        comp(f"stream_options={v!r}", {"stream": True, "stream_options": v}, 400, BR)
        chat(f"stream_options={v!r}", {"stream": True, "stream_options": v}, 400, BR)
    comp("stream_options={} without stream", {"stream_options": {}}, 200, who="ok")
    comp("stream_options with stream", {"stream": True, "stream_options": {"include_usage": True}}, 200, who="ok")
    # prompt_logprobs with stream (the prefill copy does not stream)
    comp("prompt_logprobs with stream", {"stream": True, "prompt_logprobs": 1}, 400, BR, "prompt_logprobs")
    chat("prompt_logprobs with stream", {"stream": True, "prompt_logprobs": -1}, 400, BR, "prompt_logprobs")
    comp("prompt_logprobs=-2", {"prompt_logprobs": -2}, 400, BR, "prompt_logprobs", who="prefill")
    # use_beam_search with stream (completions)
    comp("use_beam_search with stream", {"stream": True, "use_beam_search": True}, 400, BRE)
    comp("use_beam_search='x'", {"use_beam_search": "x"}, 400, BR)
    # kv_transfer_params from the client (replaced in both requests)
    for v in ("x", [1], 5):
        comp(f"kv_transfer_params={v!r}", {"kv_transfer_params": v}, 400, BR)
        chat(f"kv_transfer_params={v!r}", {"kv_transfer_params": v}, 400, BR)
    comp("kv_transfer_params from the client", {"kv_transfer_params": {"do_remote_prefill": True,
                                                                       "remote_host": "10.9.9.9"}}, 200, who="ok")
    # prompt (read): vLLM's union of text, texts, token ids, lists of token ids
    for v in ({"text": "hi"}, [1, -1], [1.5], ["a", 1], [[1, "a"]], 5, True, [[["a"]]], [None]):
        comp(f"prompt={v!r}", {"prompt": v}, 400, BR)
    for v in ("a b", ["a b"], [1, 2, 3], [[1, 2]], "x " * 2000):
        comp(f"prompt={str(v)[:20]!r}", {"prompt": v}, 200, who="ok")
    # a batch of prompts: one PD request per prompt through the proxy itself, joined (batch.py)
    for v in (["a b", "c"], [[1, 2], [3]], ["a", "b", "c"]):
        comp(f"prompt={str(v)[:20]!r}", {"prompt": v}, 200, who=f"ok*{len(v)}")
    comp("prompt=''", {"prompt": ""}, 400, BR, "prompt", who="prefill")
    comp("no prompt", {}, 400, BR, "prompt", who="prefill", base={"max_tokens": 4})
    # messages (read): a list of objects
    for v in ("hi", ["hi"], [1], {"role": "user"}, None, [[MSG[0]]]):
        chat(f"messages={v!r}", {"messages": v}, 400, BR)
    chat("no messages", {}, 400, BR, base={"max_tokens": 4})
    chat("message content=5", {"messages": [{"role": "user", "content": 5}]}, 400, BR, who="prefill")
    chat("message without role", {"messages": [{"content": "hi"}]}, 400, BR, who="prefill")
    # fields the proxy neither reads nor rewrites: the prefill refuses them, the proxy relays its answer
    for name, extra, typ, param in (("n='x'", {"n": "x"}, BR, None), ("n=0", {"n": 0}, BRE, None),
                                    ("n=[1]", {"n": [1]}, BR, None), ("model=5", {"model": 5}, BR, None),
                                    ("temperature='hot'", {"temperature": "hot"}, BR, None),
                                    ("temperature=-1", {"temperature": -1}, BRE, "temperature"),
                                    ("seed=2**70", {"seed": 2 ** 70}, BR, None),
                                    ("stop=[1]", {"stop": [1]}, BR, None)):
        comp(name, extra, 400, typ, param, who="prefill")
        chat(name, extra, 400, typ, param, who="prefill")
    comp("logprobs=-1", {"logprobs": -1}, 400, BR, "logprobs", who="prefill")
    comp("model not served", {"model": "other-model"}, 404, "NotFoundError", "model", who="prefill")
    chat("top_logprobs without logprobs", {"top_logprobs": 2}, 400, BR, "top_logprobs", who="prefill")
    comp("unknown fields", {"x": {"y": [1, {"z": None}]}, "vllm_junk": "?"}, 200, who="ok")
    return cases


def tally_key(path: str, status: int, who: str) -> tuple[str, str, str]:
    return (path, "success" if who.startswith("ok") else "client_error", str(status))


def pairs(who: str) -> int:
    """PD pairs a successful case runs: 1, or one per prompt of a batch (``ok*N``, counted N + 1 times)."""
    return int(who.split("*", 1)[1]) if "*" in who else 1


async def requests_total(port: int) -> Counter[tuple[str, str, str]]:
    answer = await exchange(port, b"GET /metrics HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n")
    out: Counter[tuple[str, str, str]] = Counter()
    for line in answer.body.decode().splitlines():
        if line.startswith("ascend_proxy_requests_total{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
            key = tuple(labels[k].strip('"') for k in ("endpoint", "outcome", "status"))
            out[key] += int(float(line.rsplit(" ", 1)[1]))  # type: ignore[index]
    return out


async def test_malformed_bodies_get_vllm_answers_and_every_outcome_is_counted(stubs, proxy):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    refused = speak_vllm(p, d)
    px = await proxy(p, d)
    cases = corpus()
    assert len(cases) > 150
    expected: Counter[tuple[str, str, str]] = Counter()
    failures = []
    for name, path, raw, status, typ, param, who in cases:
        seen = (len(p.engine.requests), len(d.engine.requests))
        refusals = {role: len(v) for role, v in refused.items()}
        answer = await exchange(px.port, request(path, raw))
        expected[tally_key(path, status, who)] += 1 + (pairs(who) if who.startswith("ok*") else 0)
        got_p, got_d = len(p.engine.requests) - seen[0], len(d.engine.requests) - seen[1]
        problem = None
        if answer.status != status:
            problem = f"status {answer.status}, body {answer.body[:300]!r}"
        elif who.startswith("ok"):
            if (got_p, got_d) != (pairs(who), pairs(who)):
                problem = f"engines saw {got_p} prefill and {got_d} decode requests"
        else:
            err = answer.error()
            if (err["type"], err["param"]) != (typ, param):
                problem = f"type/param {err['type']!r}/{err['param']!r}: {err['message'][:300]}"
            elif who == "proxy" and (got_p, got_d) != (0, 0):
                problem = f"forwarded ({got_p} prefill, {got_d} decode requests)"
            elif who in ("prefill", "decode"):
                new = refused[who][refusals[who]:]
                # the prefill's verdict is relayed as the client's own request reads (pd.py): its echo of the
                # input is the client's body, not the proxy's prefill copy
                want = [client_view_of_prefill_refusal(b, json.loads(raw))
                        for b in new] if who == "prefill" else new
                if (got_p, got_d) != ((1, 0) if who == "prefill" else (1, 1)) or want != [answer.body]:
                    problem = f"not the {who}'s refusal relayed ({got_p}/{got_d} requests, {new!r})"
                elif b"kv_transfer_params" in answer.body and b"kv_transfer_params" not in raw:
                    problem = f"the answer echoes the proxy's prefill copy: {answer.body[:300]!r}"
        if problem:
            failures.append(f"{name}: {problem}")
    assert not failures, "\n".join(failures)
    # a client's kv_transfer_params never reach an engine: the decode got the prefill's
    kv_case = next(r for r in d.engine.requests if r.get("kv_transfer_params", {}).get("remote_engine_id"))
    assert all((r.get("kv_transfer_params") or {}).get("remote_host") != "10.9.9.9" for r in d.engine.requests + p.engine.requests)
    assert kv_case["kv_transfer_params"]["remote_engine_id"] == "engine-p0"
    got = await requests_total(px.port)
    assert got == expected, (sorted(got.items()), sorted(expected.items()))


async def test_headers_and_framing(stubs, proxy):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d, limits=Limits(body_timeout_s=0.3))
    ok = body({"prompt": "a b c", "max_tokens": 2})
    expected: Counter[tuple[str, str, str]] = Counter()

    async def check(name: str, data: bytes, status: int, counted: bool = True) -> Answer:
        answer = await exchange(px.port, data)
        assert answer.status == status, (name, answer)
        if counted:
            expected[(C, "success" if status == 200 else "client_error", str(status))] += 1
            if status != 200:
                answer.error()
        return answer

    # Content-Type: vLLM's validate_json_request wants exactly application/json (any case, any parameters)
    for ctype, status in ((None, 400), (b"text/plain", 400), (b"application/x-www-form-urlencoded", 400),
                          (b"application/json-patch+json", 400), (b"application/json ;charset=utf-8", 400),
                          (b"", 400), (b"application/json; charset=utf-8", 200), (b"APPLICATION/JSON", 200)):
        await check(f"Content-Type {ctype!r}", request(C, ok, ctype=ctype), status)
    # Content-Encoding: vLLM reads the bytes as JSON text
    await check("gzip body", request(C, gzip.compress(ok), [(b"Content-Encoding", b"gzip")]), 400)
    await check("broken gzip body", request(C, b"\x1f\x8bnot gzip", [(b"Content-Encoding", b"gzip")]), 400)
    await check("identity", request(C, ok, [(b"Content-Encoding", b"identity")]), 200)
    # chunked bodies, one byte per chunk, with chunk extensions
    chunks = b"".join(b"1;ext=1\r\n%b\r\n" % bytes([c]) for c in ok) + b"0\r\n\r\n"
    await check("chunked", request(C, chunks, [(b"Transfer-Encoding", b"chunked")]), 200)
    # HTTP/1.0: a JSON answer and a stream without chunked framing, closed at its end
    await check("HTTP/1.0", request(C, ok, version=b"1.0"), 200)
    answer = await check("HTTP/1.0 stream", request(C, body({"prompt": "a b", "max_tokens": 2, "stream": True}),
                                                     version=b"1.0"), 200)
    assert answer.version == b"HTTP/1.0" and "transfer-encoding" not in answer.headers
    assert answer.body.startswith(b"data: ") and answer.body.endswith(b"data: [DONE]\n\n"), answer.body
    # request ids and credentials of any bytes reach the engines as they were sent, never fail an instance
    for value in (b"caf\xc3\xa9-\xe2\x82\xac", b"\xff\xfe-latin", b"r" * 8000, b""):
        answer = await check(f"X-Request-Id {value[:20]!r}", request(C, ok, [(b"X-Request-Id", value),
                                                                           (b"Authorization", b"Bearer " + value)]),
                             200)
        if value:
            assert p.engine.client_request_ids[-1].encode("utf-8", "surrogateescape") == value
    await check("two X-Request-Id", request(C, ok, [(b"X-Request-Id", b"a"), (b"X-Request-Id", b"b")]), 200)
    assert all(s.consecutive_failures == 0 for s in px.pool.all()), [s.name for s in px.pool.all()]
    # Expect: 100-continue: the interim answer comes before the client sends the body
    reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
    head = request(C, ok, [(b"Expect", b"100-continue")])[:-len(ok)]
    writer.write(head)
    await writer.drain()
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(ok)
    await writer.drain()
    assert parse_answer(await asyncio.wait_for(reader.read(), WAIT_S)).status == 200
    writer.close()
    expected[(C, "success", "200")] += 1
    # a malformed chunk once the body is being read: aiohttp stops feeding the body, the body timeout answers
    reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
    writer.write(request(C, b"", [(b"Transfer-Encoding", b"chunked"), (b"Expect", b"100-continue")]))
    await writer.drain()
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)  # the proxy reads the body now
    writer.write(b"3\r\n{\"p\r\nzz\r\n")
    await writer.drain()
    assert parse_answer(await asyncio.wait_for(reader.read(), WAIT_S)).status == 408
    writer.close()
    expected[(C, "client_error", "408")] += 1
    # malformed heads are refused by aiohttp's parser (400, plain text) before any route, counted apart
    # (endpoint "-", outcome bad_request: protolog.py)
    for name, data in (("header line over 8190 bytes", request(C, ok, [(b"X-Junk", b"a" * 9000)])),
                       ("two Content-Length", request(C, ok, [(b"Content-Length", b"5")])),
                       ("Content-Length and chunked", request(C, ok, [(b"Transfer-Encoding", b"chunked"),
                                                                       (b"Content-Length", b"5")])),
                       ("control character", request(C, ok, [(b"X-Junk", b"a\x01b")])),
                       ("two Content-Type", request(C, ok, [(b"Content-Type", b"text/plain")])),
                       ("bare LF", request(C, ok).replace(b"\r\n", b"\n"))):
        await check(name, data, 400, counted=False)
        expected[("-", "bad_request", "400")] += 1
    assert await requests_total(px.port) == expected
