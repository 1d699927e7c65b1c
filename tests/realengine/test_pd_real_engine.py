"""PD through the kit's proxy against vLLM 0.23.0's own server: KV really moves, answers equal a single
instance's, the smoke check tells a pair that moves KV from one that does not."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import urllib.request

import aiohttp
import pytest

from ascend_runtime.checks import run_smoke
from ascend_runtime.checks.kv_handover import read_counters
from ascend_runtime.checks.prompts import VOCAB
from ascend_runtime.proxy.pd import build_prefill_request
from tests.realengine.conftest import MODEL_NAME, RealStack, http_json

pytestmark = pytest.mark.slow

#: Words per prompt: longer than the engine's block (128 tokens on the CPU build), so whole blocks move.
LONG_WORDS = 300


def prompt(seed: int, words: int = LONG_WORDS) -> str:
    import random

    rng = random.Random(seed)
    return f"p{seed} " + " ".join(rng.choices(VOCAB, k=words))


def greedy(url: str, text: str, max_tokens: int = 12, **extra) -> dict:
    status, body, _ = http_json("POST", url + "/v1/completions", {
        "model": MODEL_NAME, "prompt": text, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **extra})
    assert status == 200, body
    return body


def test_smoke_passes_on_nixl_pairs_and_names_the_tokens_loaded(real_stack: RealStack) -> None:
    report = asyncio.run(run_smoke(real_stack.proxy, stack="local-vllm", stacks_dir=str(real_stack.stacks), timeout_s=120))
    assert report.passed, [i.line() for i in report.failures]
    kv = next(i for i in report.items if i.name.startswith("KV handed over"))
    assert "loaded through the KV connector" in kv.detail and "0 computed by decode" in kv.detail, kv.detail


def test_each_prompt_gets_its_own_greedy_text_through_pd(real_stack: RealStack) -> None:
    """Each prompt through the proxy equals a single instance's greedy answer; a batch is refused naming the
    field; and decode given another prompt's KV does not reproduce the answer (the equality can fail)."""
    single = real_stack.url("decode-1")
    prompts = [prompt(i) for i in range(3)]
    for text in prompts:
        direct = greedy(single, text)["choices"][0]["text"]
        through = greedy(real_stack.proxy, text)["choices"][0]["text"]
        assert through == direct, (text[:40], through, direct)
    status, body, _ = http_json("POST", real_stack.proxy + "/v1/completions",
                                {"model": MODEL_NAME, "prompt": prompts, "max_tokens": 4})
    assert status == 400 and body["error"]["param"] == "prompt" and "one prompt per request" in body["error"]["message"]
    # control: prefill computes prompt 0, decode is asked for prompt 1 with prompt 0's KV
    prefill_url, decode_url = real_stack.url("prefill-0"), real_stack.url("decode-0")
    status, prefilled, _ = http_json("POST", prefill_url + "/v1/completions", build_prefill_request(
        {"model": MODEL_NAME, "prompt": prompts[0], "max_tokens": 12, "temperature": 0, "ignore_eos": True}))
    assert status == 200 and prefilled["kv_transfer_params"]["do_remote_prefill"] is True, prefilled
    own = greedy(single, prompts[1])["choices"][0]["text"]
    crossed = greedy(decode_url, prompts[1], kv_transfer_params=prefilled["kv_transfer_params"])["choices"][0]["text"]
    assert crossed != own, "decode given another prompt's KV answered as if it had its own: the test cannot tell"


def _metric_sum(url: str, sample: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(sample + "{") or line.startswith(sample + " "))


def test_a_client_disconnect_aborts_the_request_on_decode(real_stack: RealStack) -> None:
    decodes = [real_stack.url(n) for n in ("decode-0", "decode-1")]

    async def go() -> None:
        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL_NAME, "prompt": prompt(99, 50), "max_tokens": 1500, "ignore_eos": True,
                    "stream": True}
            async with session.post(real_stack.proxy + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                await resp.content.readuntil(b"\n\n")  # the first event: decode is generating
                running = sum(_metric_sum(u, "vllm:num_requests_running") for u in decodes)
                assert running >= 1, running
            # leaving the block closes the connection mid-stream

    asyncio.run(go())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if sum(_metric_sum(u, "vllm:num_requests_running") for u in decodes) == 0:
            return
        time.sleep(0.5)
    pytest.fail("decode kept generating for a client that left (vllm:num_requests_running stayed above 0)")


def test_decode_counters_show_the_prompt_loaded(real_stack: RealStack) -> None:
    """The counters the smoke check reads move as it expects: every prompt token of a PD request is
    loaded through the connector, none computed by decode."""
    decode_url = real_stack.url("decode-0")
    before = read_counters(urllib.request.urlopen(decode_url + "/metrics", timeout=30).read().decode())
    text = f"{secrets.token_hex(4)} {prompt(7)}"
    status, prefilled, _ = http_json("POST", real_stack.url("prefill-0") + "/v1/completions", build_prefill_request(
        {"model": MODEL_NAME, "prompt": text, "max_tokens": 4, "temperature": 0}))
    assert status == 200
    answer = greedy(decode_url, text, 4, kv_transfer_params=prefilled["kv_transfer_params"])
    after = read_counters(urllib.request.urlopen(decode_url + "/metrics", timeout=30).read().decode())
    loaded = after.external_hits - before.external_hits
    assert loaded == answer["usage"]["prompt_tokens"], (loaded, answer["usage"], json.dumps(prefilled)[:300])
    assert after.block_size == 128
