"""Drain with ``migrate``: in-flight decode streams move to another decode instance, end to end.

Real HTTP; engines are the simulator (ascend_runtime.sim). The simulated model's text is
deterministic for a seeded request: token i is WORDS[(offset + i) % 10] with the offset drawn from
the seed. A migrated stream is the first k tokens of that sequence (relayed from the evacuated
instance) followed by the continuation's own tokens, again from the seeded offset; the
continuation's usage tells k (its prompt is the original prompt plus the k relayed tokens).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import specs_from_data
from ascend_runtime.proxy.server import start_proxy
from tests.proxy.conftest import free_port

sim_server = pytest.importorskip("ascend_runtime.sim.server")
sim_config = pytest.importorskip("ascend_runtime.perf.sim_config")

MODEL = "deepseek-ai/DeepSeek-R1"
TOKEN = "m1grate"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
N = 300  # tokens per answer: long enough to be evacuated mid-stream
CHAT_TOKENS_PER_MESSAGE = 4  # the simulator's per-message prompt overhead (sim/api.py)


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, Any]]:
    """One prefill and two decode simulators (modelled time / 2: an answer of N tokens lasts ~1.5 s)."""
    handles = {}
    for role, name in (("prefill", "p0"), ("decode", "d0"), ("decode", "d1")):
        handles[name] = await sim_server.start_simulator(sim_config.SimConfig(
            role=role, instance=name, port=0, kv_port=0, speedup=2.0, exit_on_fault=False))
    yield handles
    for h in handles.values():
        await h.stop()


def _body(chat: bool, seed: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": N, "stream": True, "ignore_eos": True, "seed": seed,
                            "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": "tell me about ascend"}]
    else:
        body["prompt"] = "tell me about ascend"
    return body


async def _stream(s: aiohttp.ClientSession, url: str, body: dict[str, Any], after: int = 0,
                  action: Callable[[str], Awaitable[None]] | None = None) -> tuple[str, list[str]]:
    """POST a streamed request; once ``after`` events arrived, run ``action(decode instance)`` once.
    Returns (decode instance, the SSE event payloads)."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    buf = b""
    async with s.post(url + path, json=body) as r:
        assert r.status == 200, await r.text()
        decode = r.headers["x-decode-instance"]
        async for chunk in r.content.iter_any():
            buf += chunk
            if action is not None and buf.count(b"\n\n") >= after:
                await action(decode)
                action = None
    assert action is None, "the stream ended before the action ran"
    return decode, [e[len("data: "):] for e in buf.decode().split("\n\n") if e.startswith("data: ")]


def _pieces(events: list[str], chat: bool) -> tuple[list[str], list[dict[str, Any]], int]:
    """(token texts, usage chunks, role-only chunks) of a stream; checks it ends with [DONE] once."""
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    pieces, usage, roles = [], [], 0
    for raw in events[:-1]:
        obj = json.loads(raw)
        assert "error" not in obj, obj
        if not obj["choices"]:
            usage.append(obj["usage"])
            continue
        choice = obj["choices"][0]
        if chat and "role" in choice["delta"]:
            roles += 1
        text = choice["delta"].get("content") if chat else choice.get("text")
        if text:
            pieces.append(text)
    return pieces, usage, roles


async def _metric(s: aiohttp.ClientSession, url: str, name: str) -> float:
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def _drain(s: aiohttp.ClientSession, url: str, body: dict[str, Any], status: int = 200) -> dict[str, Any]:
    async with s.post(url + "/admin/instances/drain", json=body, headers=AUTH) as r:
        assert r.status == status, await r.text()
        return await r.json()


async def _running(engine: Any) -> float:
    """vllm:num_requests_running of a simulator, summed over its engines."""
    async with aiohttp.ClientSession() as s, s.get(engine.url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:num_requests_running"))


def _check_migrated(pieces: list[str], reference: list[str], usage: dict[str, Any], prompt_tokens: int,
                    chat: bool) -> int:
    """The migrated stream is reference[:k] + reference[:N - k]; returns k (tokens before the move).

    Its usage is the client's answer as a whole: the original prompt, every token it got (N)."""
    assert usage == {"prompt_tokens": prompt_tokens, "completion_tokens": N, "total_tokens": prompt_tokens + N}, usage
    assert len(pieces) == N  # nothing lost, nothing repeated
    splits = [k for k in range(1, N) if pieces[:k] == reference[:k] and pieces[k:] == reference[:N - k]]
    assert splits, "not the evacuated instance's text followed by the continuation's own from its first token"
    return splits[0]


async def test_drain_with_migrate_moves_streams(engines):
    specs = specs_from_data([{"name": n, "role": "prefill" if n == "p0" else "decode", "url": h.url}
                             for n, h in engines.items()])
    px = await start_proxy(ProxyConfig(port=0, instances=specs, health_interval_s=0, admin_token=TOKEN))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            # bad calls: exit with a message, nothing applied
            assert "migrate needs drain" in (await _drain(s, px.url, {"name": "d0", "drain": False, "migrate": True},
                                                          400))["error"]["message"]
            await _drain(s, px.url, {"name": "d0", "migrate": "yes"}, 400)
            await _drain(s, px.url, {"name": "nope", "migrate": True}, 404)

            for chat, seed in ((False, 11), (True, 12)):
                _, ref_events = await _stream(s, px.url, _body(chat, seed))
                reference, ref_usage, _ = _pieces(ref_events, chat)
                assert len(reference) == N
                prompt_tokens = ref_usage[0]["prompt_tokens"]
                before = await _metric(s, px.url, "ascend_proxy_migrations_total")
                answers: list[dict[str, Any]] = []

                async def evacuate(decode: str, answers: list[dict[str, Any]] = answers) -> None:
                    answers.append(await _drain(s, px.url, {"name": decode, "migrate": True}))

                drained, events = await _stream(s, px.url, _body(chat, seed), after=20, action=evacuate)
                other = "d1" if drained == "d0" else "d0"
                assert answers[0]["migrating"] == 1
                assert {i["name"]: i["evacuating"] for i in answers[0]["instances"]}[drained] is True
                pieces, usage, roles = _pieces(events, chat)
                assert len(usage) == 1
                _check_migrated(pieces, reference, usage[0], prompt_tokens, chat)
                # one answer to the client: one id and one created time from its first chunk to its last
                objects = [json.loads(e) for e in events[:-1]]
                assert len({o["id"] for o in objects}) == 1 and len({o["created"] for o in objects}) == 1, \
                    sorted({o["id"] for o in objects})
                if chat:
                    assert roles == 1  # the continuation's role chunk is not relayed again
                assert await _metric(s, px.url, "ascend_proxy_migrations_total") == before + 1

                # the evacuated engine no longer runs the request (its connection was closed: abort)
                for _ in range(200):
                    if await _running(engines[drained]) == 0:
                        break
                    await asyncio.sleep(0.05)
                assert await _running(engines[drained]) == 0

                # no new request goes to it while drained
                picks = f'ascend_proxy_routing_decisions_total{{role="decode",instance="{drained}"}}'
                routed = await _metric(s, px.url, picks)
                for _ in range(3):
                    body = {**_body(chat, seed), "max_tokens": 4}
                    decode, _ = await _stream(s, px.url, body)
                    assert decode == other
                assert await _metric(s, px.url, picks) == routed
                assert (await _drain(s, px.url, {"name": drained, "drain": False}))["undrained"] == drained

            # nothing to move to (the other decode is drained): the stream finishes in place, whole
            before = await _metric(s, px.url, "ascend_proxy_migrations_total")
            answers = []

            async def evacuate_alone(decode: str) -> None:
                await _drain(s, px.url, {"name": "d1" if decode == "d0" else "d0"})
                answers.append(await _drain(s, px.url, {"name": decode, "migrate": True}))

            _, events = await _stream(s, px.url, _body(False, 13), after=20, action=evacuate_alone)
            pieces, usage, _ = _pieces(events, False)
            assert answers[0]["migrating"] == 0
            assert len(pieces) == N and usage[0]["completion_tokens"] == N
            assert await _metric(s, px.url, "ascend_proxy_migrations_total") == before
    finally:
        await px.stop()


async def test_migrate_with_two_workers(engines):
    port = free_port()
    args = [sys.executable, "-m", "ascend_runtime", "proxy", "--port", str(port), "--workers", "2",
            "--health-interval-s", "0", "--admin-token-env", "MIGRATE_TEST_TOKEN", "--log-level", "WARNING",
            "--prefill", f"{engines['p0'].url},name=p0", "--decode", f"{engines['d0'].url},name=d0",
            "--decode", f"{engines['d1'].url},name=d1"]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env={**os.environ, "MIGRATE_TEST_TOKEN": TOKEN})
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await asyncio.wait_for(loop.run_in_executor(None, proc.stderr.readline), 60)  # type: ignore[union-attr]
            assert line, "the supervisor exited before listening"
            if re.search(r"\(2 workers; worker sockets in \S+\)", line):
                break
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60),
                                         connector=aiohttp.TCPConnector(force_close=True)) as s:
            _, ref_events = await _stream(s, url, _body(False, 21))
            reference, ref_usage, _ = _pieces(ref_events, False)
            answers: list[dict[str, Any]] = []

            async def evacuate(decode: str) -> None:
                answers.append(await _drain(s, url, {"name": decode, "migrate": True}))

            drained, events = await _stream(s, url, _body(False, 21), after=20, action=evacuate)
            assert answers[0]["workers"] == {"0": "ok", "1": "ok"}  # applied by both workers
            pieces, usage, _ = _pieces(events, False)
            _check_migrated(pieces, reference, usage[0], ref_usage[0]["prompt_tokens"], False)
            assert await _metric(s, url, "ascend_proxy_migrations_total") == 1  # merged over the workers
            async with s.get(url + "/admin/instances", headers=AUTH) as r:
                listing = {i["name"]: i for i in (await r.json())["instances"]}
            assert listing[drained]["evacuating"] is True and listing[drained]["active_seqs"] == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await loop.run_in_executor(None, proc.wait, 30) == 0
