"""PD protocol over real HTTP and a real KV TCP connection."""

from __future__ import annotations

import asyncio

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
    # blocks are freed once pulled: a second pull is refused cleanly
    async with http.post(f"{d.url}/v1/completions", json=body) as r:
        assert r.status == 400
        assert "unknown or expired block ids" in (await r.json())["error"]["message"]


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


async def test_expired_block_ids_fail_cleanly(sim, http):
    p = await sim(role="prefill", kv_timeout_s=5.0, speedup=100.0)  # 50 ms wall
    d = await sim(role="decode")
    kv = (await prefill(http, p, "a b c d"))["kv_transfer_params"]
    await asyncio.sleep(0.15)
    async with http.post(f"{d.url}/v1/completions", json={"prompt": "a b c d", "kv_transfer_params": kv}) as r:
        assert r.status == 400
        err = await r.json()
    assert "unknown or expired block ids" in err["error"]["message"]
    async with http.get(f"{p.url}/admin/stats") as r:
        assert (await r.json())["kv_blocks_expired"] == 1
    # the decode still serves other requests
    async with http.post(f"{d.url}/v1/completions", json={"prompt": "a b", "max_tokens": 2}) as r:
        assert r.status == 200


async def test_unknown_engine_and_unreachable_kv_port(sim, http):
    p = await sim(role="prefill")
    d = await sim(role="decode")
    kv = dict((await prefill(http, p, "x y"))["kv_transfer_params"], remote_engine_id="someone-else")
    async with http.post(f"{d.url}/v1/completions", json={"prompt": "x y", "kv_transfer_params": kv}) as r:
        assert r.status == 400
        assert "someone-else" in (await r.json())["error"]["message"]
    kv["remote_port"] = 1  # nothing listens there
    async with http.post(f"{d.url}/v1/completions", json={"prompt": "x y", "kv_transfer_params": kv}) as r:
        assert r.status == 502
