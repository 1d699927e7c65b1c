"""One error shape: the proxy's own errors are vLLM 0.23.0's ErrorResponse; engine errors pass unchanged."""

from __future__ import annotations

import json

from aiohttp import web

from ascend_runtime.proxy.instances import InstanceSpec
from tests.proxy.conftest import free_port

REQ = {"model": "deepseek-r1", "prompt": "a b c", "max_tokens": 4, "stream": True}
ENGINE_ERROR = {"error": {"message": "`x` is bad (parameter=x)", "type": "BadRequestError", "param": "x",
                          "code": 400}}


def assert_error_shape(body: dict, status: int, err_type: str) -> None:
    """vLLM 0.23.0 ``ErrorResponse`` (vllm/entrypoints/openai/engine/protocol.py): exactly these keys."""
    assert list(body) == ["error"], body
    assert list(body["error"]) == ["message", "type", "param", "code"], body
    assert body["error"]["code"] == status and body["error"]["type"] == err_type, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]


async def test_own_errors_use_the_engine_error_shape(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    for raw in (b"{not json", b"[1, 2]"):
        async with http.post(px.url + "/v1/completions", data=raw, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            assert r.content_type == "application/json"
            assert_error_shape(await r.json(), 400, "Bad Request")
    lonely = await proxy(p, extra=[InstanceSpec("d-dead", "decode", f"http://127.0.0.1:{free_port()}")])
    async with http.post(lonely.url + "/v1/completions", json=REQ) as r:
        assert r.status == 503
        assert_error_shape(await r.json(), 503, "Service Unavailable")
    empty = await proxy()
    async with http.get(empty.url + "/v1/models") as r:
        assert r.status == 503
        assert_error_shape(await r.json(), 503, "Service Unavailable")


async def test_engine_errors_are_relayed_byte_for_byte(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    raw = json.dumps(ENGINE_ERROR).encode()
    p.engine._prefill_answer = lambda req, chat: web.Response(  # type: ignore[method-assign]
        body=raw, status=400, content_type="application/json")
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json=REQ) as r:
        assert r.status == 400
        assert await r.read() == raw


async def test_an_engine_error_during_a_recomputed_continuation_is_its_own_final_event(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", recompute_after=2)
    normal = p.engine._prefill_answer
    calls = []

    def prefill(req, chat):  # type: ignore[no-untyped-def]
        calls.append(req)
        if len(calls) == 1:
            return normal(req, chat)
        return web.json_response(ENGINE_ERROR, status=400)

    p.engine._prefill_answer = prefill  # type: ignore[method-assign]
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json={**REQ, "max_tokens": 6}) as r:
        assert r.status == 200
        events = [e[len("data: "):] for e in (await r.text()).split("\n\n") if e.startswith("data: ")]
    assert len(calls) == 2 and events[-1] == "[DONE]"
    assert json.loads(events[-2]) == ENGINE_ERROR  # not re-wrapped in a proxy error
    assert all("error" not in json.loads(e) for e in events[:-2])


async def test_mid_stream_failure_event_has_the_engine_error_shape(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", token_interval_s=0.01)
    px = await proxy(p, d)

    async def broken(request, req, chat):  # type: ignore[no-untyped-def]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices": [{"index": 0, "text": " w0"}]}\n\n')
        request.transport.close()  # the decode dies after one event
        return resp

    d.engine._decode_answer = broken  # type: ignore[method-assign]
    async with http.post(px.url + "/v1/completions", json=REQ) as r:
        events = [e[len("data: "):] for e in (await r.text()).split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])
    assert_error_shape(err, 502, "Bad Gateway")
    assert "mid-stream" in err["error"]["message"]


async def test_unknown_routes_answer_json_as_fastapi_does(stubs, proxy, http):
    px = await proxy()
    async with http.get(px.url + "/v1/nothing-here") as r:
        assert r.status == 404 and r.content_type == "application/json"
        assert await r.json() == {"detail": "Not Found"}
    async with http.get(px.url + "/v1/completions") as r:
        assert r.status == 405
        assert await r.json() == {"detail": "Method Not Allowed"}
        assert r.headers["Allow"] == "POST"
    async with http.post(px.url + "/health") as r:  # a GET route answers GET and HEAD only
        assert r.status == 405 and r.headers["Allow"] == "GET, HEAD"
    async with http.get(px.url + "/health") as r:
        get_status = r.status
    async with http.head(px.url + "/health") as r:  # served by the GET handler, not 405
        assert r.status == get_status and r.status != 405
    async with http.get(px.url + "/health/") as r:  # exact paths, as before
        assert r.status == 404
