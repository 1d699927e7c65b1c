"""PD protocol over real HTTP and a real KV TCP connection."""

from __future__ import annotations

import asyncio
import json

from ascend_runtime.config.model import ModelShape

KV_BYTES = ModelShape().kv_bytes_per_token()
PROXY_PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                        "remote_block_ids": None, "remote_host": None, "remote_port": None}


async def prefill(http, p, prompt: str) -> dict:
    body = {"prompt": prompt, "max_tokens": 1, "min_tokens": 1, "stream": False,
            "kv_transfer_params": PROXY_PREFILL_PARAMS}
    async with http.post(f"{p.url}/v1/completions", json=body) as r:
        assert r.status == 200
        return await r.json()


async def test_pd_round_trip_moves_modelled_kv_bytes(sim, http):
    p = await sim(role="prefill", instance="p0", link_gbps=400)
    d = await sim(role="decode", instance="d0")
    prompt = " ".join(["tok"] * 2048)
    out = await prefill(http, p, prompt)
    kv = out["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_engine_id"] == p.engine_id
    assert kv["remote_host"] == "127.0.0.1" and kv["remote_port"] == p.kv_port and kv["tp_size"] == 8
    assert len(kv["remote_block_ids"]) == 2048 // 128
    body = {"prompt": prompt, "max_tokens": 4, "stream": True, "kv_transfer_params": kv}
    async with http.post(f"{d.url}/v1/completions", json=body) as r:
        assert r.status == 200
        assert r.headers["x-instance"] == "d0"
        assert int(r.headers["x-kv-modelled-bytes"]) == 2048 * KV_BYTES
        text = await r.text()
    assert text.rstrip().endswith("data: [DONE]")
    async with http.get(f"{p.url}/admin/stats") as r:
        ps = await r.json()
    async with http.get(f"{d.url}/admin/stats") as r:
        ds = await r.json()
    assert ps["kv_bytes_sent"] == ds["kv_bytes_received"] == 2048 * KV_BYTES
    assert ds["kv_wire_bytes"] == -(-2048 * KV_BYTES // 1024)
    assert ds["generation_tokens"] == 4 and ds["prompt_tokens"] == 0  # no local prefill
    # blocks are freed once pulled: a second pull fails the request as vLLM 0.23.0 fails a KV load
    # (streamed: no output, no error event, see test_kv_load_failure_answers_as_vllm)
    async with http.post(f"{d.url}/v1/completions", json=body) as r:
        assert r.status == 200
        assert await r.read() == b"data: [DONE]\n\n"
    async with http.get(f"{d.url}/admin/stats") as r:
        assert (await r.json())["kv_load_failures"] == 1


async def test_kv_transfer_is_throttled_to_link_rate(sim, http):
    # 4096 tokens x 70,272 B = 288 MB at 8 Gbit/s = 288 ms modelled, /speedup 2 -> ~144 ms wall
    p = await sim(role="prefill", link_gbps=8, speedup=2.0)
    d = await sim(role="decode", speedup=100.0)
    prompt = " ".join(["w"] * 4096)
    kv = (await prefill(http, p, prompt))["kv_transfer_params"]
    async with http.post(f"{d.url}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "kv_transfer_params": kv}) as r:
        assert r.status == 200
        wall_ms = float(r.headers["x-kv-transfer-ms"])
        modelled_ms = float(r.headers["x-kv-modelled-ms"])
    assert abs(modelled_ms - 4096 * KV_BYTES * 8 / 8e9 * 1000) < 0.01
    assert modelled_ms / 2 * 0.9 <= wall_ms <= modelled_ms / 2 + 200


INTERNAL = {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}}


async def test_expired_block_ids_fail_cleanly(sim, http, caplog):
    p = await sim(role="prefill", kv_timeout_s=5.0, speedup=100.0)  # 50 ms wall
    d = await sim(role="decode")
    kv = (await prefill(http, p, "a b c d"))["kv_transfer_params"]
    await asyncio.sleep(0.15)
    with caplog.at_level("WARNING", logger="ascend_runtime.sim"):
        async with http.post(f"{d.url}/v1/completions", json={"prompt": "a b c d", "kv_transfer_params": kv}) as r:
            assert r.status == 500
            assert await r.json() == INTERNAL  # GenerationError, as vLLM 0.23.0 answers a failed KV load
    assert "unknown or expired block ids" in caplog.text  # the reason is in the log, as vLLM logs it
    async with http.get(f"{p.url}/admin/stats") as r:
        assert (await r.json())["kv_blocks_expired"] == 1
    # the decode still serves other requests
    async with http.post(f"{d.url}/v1/completions", json={"prompt": "a b", "max_tokens": 2}) as r:
        assert r.status == 200


async def test_unknown_engine_and_unreachable_kv_port(sim, http, caplog):
    p = await sim(role="prefill")
    d = await sim(role="decode")
    kv = dict((await prefill(http, p, "x y"))["kv_transfer_params"], remote_engine_id="someone-else")
    with caplog.at_level("WARNING", logger="ascend_runtime.sim"):
        async with http.post(f"{d.url}/v1/completions", json={"prompt": "x y", "kv_transfer_params": kv}) as r:
            assert r.status == 500 and await r.json() == INTERNAL
        assert "someone-else" in caplog.text
        kv["remote_port"] = 1  # nothing listens there
        async with http.post(f"{d.url}/v1/completions", json={"prompt": "x y", "kv_transfer_params": kv}) as r:
            assert r.status == 500 and await r.json() == INTERNAL
        assert "cannot connect to KV port" in caplog.text


async def test_kv_load_failure_answers_as_vllm(sim, http):
    """Streamed, vLLM 0.23.0 skips the failed output (no text, no token) before checking its finish reason:
    chat gets its role chunk, the usage chunk if asked, ``[DONE]``; completions with echo get the 500 event."""
    d = await sim(role="decode")
    bad = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "gone",
           "remote_block_ids": [1], "remote_host": "127.0.0.1", "remote_port": 1}
    chat = {"messages": [{"role": "user", "content": "hi there"}], "stream": True, "kv_transfer_params": bad,
            "stream_options": {"include_usage": True}}
    async with http.post(f"{d.url}/v1/chat/completions", json=chat, headers={"X-Request-Id": "r1"}) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        events = (await r.text()).split("\n\n")
    role, usage = json.loads(events[0][6:]), json.loads(events[1][6:])
    assert role["id"] == "chatcmpl-r1" and role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 0
    assert events[2:] == ["data: [DONE]", ""]
    echo = {"prompt": "a b", "echo": True, "stream": True, "kv_transfer_params": bad}
    async with http.post(f"{d.url}/v1/completions", json=echo) as r:
        assert r.status == 200
        assert await r.read() == (b'data: {"error": {"message": "Internal server error", "type": '
                                  b'"InternalServerError", "param": null, "code": 500}}\n\ndata: [DONE]\n\n')
    async with http.get(f"{d.url}/admin/stats") as r:
        assert (await r.json())["kv_load_failures"] == 2
