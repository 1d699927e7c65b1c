"""Engine answers of the wrong shape: a bad prefill answer is that prefill's failure (retried elsewhere,
counted, or 502 with none left), never a 500 and never passed to decode; decode events and the health
loop's reads of the wrong shape never raise."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ascend_runtime.proxy.answers import HANDOVER_MEMBERS, prefill_answer, BadAnswer

REQ = {"prompt": "hello world", "max_tokens": 4, "stream": False}
DEEP = b"[" * 5000 + b"]" * 5000


def _kv(change: dict[str, Any]) -> Any:
    def rewrite(answer: dict[str, Any]) -> dict[str, Any]:
        kv = dict(answer["kv_transfer_params"])
        for key, value in change.items():
            if value is _DROP:
                kv.pop(key, None)
            else:
                kv[key] = value
        return {**answer, "kv_transfer_params": kv}
    return rewrite


_DROP = object()

#: name -> (rewrite of the stub's prefill answer, retries label)
BAD_ANSWERS: dict[str, tuple[Any, str]] = {
    "a JSON array": (lambda a: [a], "bad_answer"),
    "not JSON": (lambda a: b"<html>502 Bad Gateway</html>", "bad_answer"),
    "not UTF-8": (lambda a: b'{"kv_transfer_params": "\xff\xfe"}', "bad_answer"),
    "nested past the recursion limit": (lambda a: DEEP, "bad_answer"),
    "a JSON string": (lambda a: "ok", "bad_answer"),
    "kv_transfer_params missing": (lambda a: {k: v for k, v in a.items() if k != "kv_transfer_params"},
                                   "no_kv_handover"),
    "kv_transfer_params null": (lambda a: {**a, "kv_transfer_params": None}, "no_kv_handover"),
    "kv_transfer_params a string": (lambda a: {**a, "kv_transfer_params": "garbage"}, "bad_answer"),
    "kv_transfer_params a list": (lambda a: {**a, "kv_transfer_params": [a["kv_transfer_params"]]}, "bad_answer"),
    "do_remote_prefill false": (_kv({"do_remote_prefill": False}), "bad_answer"),
    **{f"without {m}": (_kv({m: _DROP}), "bad_answer") for m in HANDOVER_MEMBERS},
    "remote_port a string": (_kv({"remote_port": "30000"}), "bad_answer"),
    "remote_port out of range": (_kv({"remote_port": 70000}), "bad_answer"),
    "remote_host empty": (_kv({"remote_host": ""}), "bad_answer"),
    "remote_block_ids a string": (_kv({"remote_block_ids": "1,2,3"}), "bad_answer"),
    "remote_block_ids of strings": (_kv({"remote_block_ids": ["1", "2"]}), "bad_answer"),
    "remote_engine_id an object": (_kv({"remote_engine_id": {"id": 1}}), "bad_answer"),
}


async def _metrics(http, px) -> str:  # type: ignore[no-untyped-def]
    async with http.get(px.url + "/metrics") as resp:
        return await resp.text()


async def _served_by_the_good_one(stubs, proxy, http, role: str, **bad_knobs: Any):  # type: ignore[no-untyped-def]
    """A proxy in front of a bad and a good instance of ``role`` (the bad one picked first) and one of the other
    role; one request, answered 200 by the good one. Returns (proxy, bad, good, other)."""
    bad = await stubs(role, f"{role[0]}-bad", **bad_knobs)
    good = await stubs(role, f"{role[0]}-good")
    other = await stubs("decode" if role == "prefill" else "prefill", "other")
    px = await proxy(bad, good, other)
    px.pool.get(good.engine.name).kv_usage = 1.0  # the bad one is picked first
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers[f"x-{role}-instance"] == good.engine.name
        answer = await resp.json()
    assert answer["choices"][0]["text"] == " w0 w1 w2 w3"
    return px, bad, good, other


@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
async def test_a_bad_prefill_answer_is_retried_on_another_prefill(stubs, proxy, http, case) -> None:
    rewrite, label = BAD_ANSWERS[case]
    px, bad, good, d = await _served_by_the_good_one(stubs, proxy, http, "prefill", prefill_rewrite=rewrite)
    assert len(bad.engine.requests) == 1 and len(good.engine.requests) == 1
    assert [r["kv_transfer_params"]["remote_engine_id"] for r in d.engine.requests] == ["engine-p-good"]
    text = await _metrics(http, px)
    assert f'ascend_proxy_retries_total{{reason="{label}",role="prefill"}} 1.0' in text, \
        [line for line in text.splitlines() if "retries" in line]
    assert px.pool.get("p-bad").consecutive_failures == 1  # evidence against the instance, as a 5xx is


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", ["a JSON array", "without remote_request_id", "nested past the recursion limit",
                                  "kv_transfer_params null"])
async def test_with_no_prefill_left_a_bad_answer_is_a_502_naming_it(stubs, proxy, http, case, stream) -> None:
    bad = await stubs("prefill", "p-bad", prefill_rewrite=BAD_ANSWERS[case][0])
    d = await stubs("decode", "d0")
    px = await proxy(bad, d)
    async with http.post(px.url + "/v1/completions", json={**REQ, "stream": stream}) as resp:
        assert resp.status == 502, await resp.text()
        assert resp.content_type == "application/json"
        body = await resp.json()
    err = body["error"]
    assert err["type"] == "Bad Gateway" and err["code"] == 502 and err["param"] is None, body
    assert "p-bad" in err["message"] and "prefill" in err["message"], err
    assert "Traceback" not in err["message"]
    assert d.engine.requests == [], "a prefill fault was passed to decode"
    text = await _metrics(http, px)
    assert 'ascend_proxy_requests_total{endpoint="/v1/completions",outcome="upstream_error",status="502"} 1.0' in text


async def test_every_prefill_tried_and_failed_is_a_502_listing_them(stubs, proxy, http) -> None:
    p0 = await stubs("prefill", "p0", prefill_rewrite=BAD_ANSWERS["kv_transfer_params a string"][0])
    p1 = await stubs("prefill", "p1")
    p1.engine.faults.error_rate = 1.0
    d = await stubs("decode", "d0")
    px = await proxy(p0, p1, d)
    async with http.post(px.url + "/v1/completions", json=REQ) as resp:
        assert resp.status == 502
        message = (await resp.json())["error"]["message"]
    assert "p0" in message and "p1" in message and "returned 500" in message, message
    assert d.engine.requests == []


def test_the_prefill_answers_of_both_connectors_pass() -> None:
    """The members each connector answers (answers.py names the sources) pass the check unchanged."""
    nixl = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2, 3]],
            "remote_engine_id": "3f1c", "remote_request_id": "cmpl-a-0-1234abcd", "remote_host": "10.0.0.1",
            "remote_port": 5600, "tp_size": 1, "remote_num_tokens": 40}
    mooncake = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[4, 5]],
                "remote_engine_id": "prefill-0-dp0", "remote_request_id": "cmpl-b-0-1234abcd",
                "remote_host": "10.0.0.2", "remote_port": 30000, "remote_pcp_size": 1, "remote_dcp_size": 1,
                "remote_ptp_size": 8, "last_token_id": 17, "remote_multi_nodes_meta_mapping": {},
                "num_prompt_blocks": 1, "remote_block_size": 128}
    for kv in (nixl, mooncake, {**nixl, "remote_block_ids": [7, 8]}):
        answer = {"id": "cmpl-1", "choices": [{"text": "x"}], "kv_transfer_params": kv}
        assert prefill_answer(json.dumps(answer).encode()) == answer
    with pytest.raises(BadAnswer, match="remote_request_id"):
        prefill_answer(json.dumps({"kv_transfer_params": {**nixl, "remote_request_id": None}}).encode())


RECOMPUTED_ARRAY = json.dumps([{"choices": [{"text": " a", "stop_reason": "recomputed"}]}]).encode()
RECOMPUTED_DEEP = b'{"stop_reason": "recomputed", "x": ' + DEEP + b"}"


@pytest.mark.parametrize("raw", [RECOMPUTED_ARRAY, RECOMPUTED_DEEP], ids=["array", "deep"])
async def test_a_decode_answer_the_proxy_cannot_read_is_a_failed_decode(stubs, proxy, http, raw) -> None:
    """A non-streamed decode answer that may ask for a recompute is read; one that is no completion is that
    decode's failure, retried on another decode with a fresh prefill."""
    _, bad, _, p = await _served_by_the_good_one(stubs, proxy, http, "decode", decode_raw=raw)
    assert len(p.engine.requests) == 2 and len(bad.engine.requests) == 1


@pytest.mark.parametrize("event", [b'data: {"choices": "recomputed"}\n\n',
                                   b'data: {"choices": [{"text": ["recomputed"]}]}\n\n',
                                   b"data: " + RECOMPUTED_DEEP + b"\n\n"], ids=["choices a string", "text a list", "deep"])
async def test_stream_events_of_the_wrong_shape_are_relayed_not_read(stubs, proxy, http, event) -> None:
    """Events the proxy cannot read are relayed as they came (the stream is the engine's), never read for a
    recompute: the stream ends as the engine ended it, no 500, no broken stream."""
    p = await stubs("prefill", "p0")
    done = b'data: {"choices": [{"text": " z", "finish_reason": "length"}]}\n\ndata: [DONE]\n\n'
    d = await stubs("decode", "d0", decode_raw=event + done)
    px = await proxy(p, d)
    async with http.post(px.url + "/v1/completions", json={**REQ, "stream": True}) as resp:
        assert resp.status == 200
        body = await resp.read()
    assert body == event + done
    assert len(p.engine.requests) == 1  # no recompute was run


async def _checked(px, name: str):  # type: ignore[no-untyped-def]
    state = px.pool.get(name)
    assert await px.proxy.health.check(state) is True  # the instance is healthy; its answer is not used
    return state


@pytest.mark.parametrize("raw", [
    b"vllm:kv_cache_usage_perc NaN\nvllm:num_requests_waiting NaN\n",
    b"vllm:kv_cache_usage_perc -1\nvllm:num_requests_waiting -inf\n",
    b"vllm:kv_cache_usage_perc 1e308\nvllm:num_requests_waiting inf\n",
    b"vllm:kv_cache_usage_perc 0.5\xff\xfe\n",
    b"#" * (17 << 20) + b"\nvllm:kv_cache_usage_perc 0.5\nvllm:num_requests_waiting 3\n",
], ids=["nan", "negative", "infinite", "not utf-8", "larger than the bound"])
async def test_a_bad_metrics_answer_leaves_the_routing_signals_alone(stubs, proxy, raw) -> None:
    p = await stubs("prefill", "p0", metrics_raw=raw)
    d = await stubs("decode", "d0")
    px = await proxy(p, d, health_timeout_s=30)  # a loaded machine answers late; not a failed check
    state = await _checked(px, "p0")
    assert (state.kv_usage, state.waiting) == (None, None)  # never scraped a usable value


@pytest.mark.parametrize("raw", [DEEP, b"\xff", b"[]", b'{"data": "x"}', b'{"data": [{"max_model_len": "4096"}]}'],
                         ids=["deep", "not utf-8", "array", "data a string", "limit a string"])
async def test_a_bad_models_answer_leaves_the_limit_unknown(stubs, proxy, raw) -> None:
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", models_raw=raw)
    px = await proxy(p, d, health_timeout_s=30)  # a loaded machine answers late; not a failed check
    state = await _checked(px, "d0")
    assert state.max_model_len is None and px.pool.max_model_len("decode") is None
