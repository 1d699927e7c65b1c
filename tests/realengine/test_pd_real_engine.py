"""PD through the kit's proxy against vLLM 0.23.0's own server: KV really moves, answers equal a single
instance's, the smoke check tells a pair that moves KV from one that does not."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import secrets
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

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


def greedy(url: str, text: str | list[str], max_tokens: int = 12, **extra) -> dict:
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
    """Each prompt through the proxy equals a single instance's greedy answer, alone and in a batch of
    prompts (streamed or not: one PD pair per prompt, joined); and decode given another prompt's KV does
    not reproduce the answer (the equality can fail)."""
    single = real_stack.url("decode-1")
    prompts = [prompt(i) for i in range(3)]
    directs = []
    for text in prompts:
        direct = greedy(single, text)["choices"][0]["text"]
        through = greedy(real_stack.proxy, text)["choices"][0]["text"]
        assert through == direct, (text[:40], through, direct)
        directs.append(direct)
    batch = greedy(real_stack.proxy, prompts)
    assert [c["text"] for c in sorted(batch["choices"], key=lambda c: c["index"])] == directs, batch
    assert batch["usage"]["completion_tokens"] == 12 * len(prompts), batch["usage"]
    case = SimpleNamespace(path="/v1/completions", chat=False, body={
        "model": MODEL_NAME, "prompt": prompts, "max_tokens": 12, "temperature": 0, "ignore_eos": True,
        "stream": True})
    status, streamed = _texts(real_stack.proxy, case)
    assert status == 200 and streamed == directs, streamed
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
                first = await resp.content.readuntil(b"\n\n")  # the first event: decode is generating
                assert first.startswith(b"data: {") and b'"error"' not in first, first
                # the gauge is set from the scheduler's stats of the engine's next output batch: poll for it
                running, deadline = 0.0, time.monotonic() + 20
                while running < 1 and time.monotonic() < deadline:
                    await resp.content.readuntil(b"\n\n")
                    running = sum(_metric_sum(u, "vllm:num_requests_running") for u in decodes)
                assert running >= 1, (running, first)
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


def _admin(real_stack: RealStack) -> dict[str, str]:
    from ascend_runtime.local.lifecycle import read_tokens
    from ascend_runtime.local.topology import PROXY_TOKEN_ENV

    return {"Authorization": f"Bearer {read_tokens(real_stack.state_dir)[PROXY_TOKEN_ENV]}"}


def _sse_text(raw: bytes, chat: bool) -> list[str]:
    """Each choice's generated text, events joined in order (``index`` picks the choice)."""
    texts: dict[int, str] = {}
    for line in raw.decode().splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            texts[choice["index"]] = texts.get(choice["index"], "") + (piece or "")
    return [texts[i] for i in sorted(texts)]


def _texts(url: str, case) -> tuple[int, list[str]]:  # noqa: ANN001 - a conformance Case
    req = urllib.request.Request(url + case.path, data=json.dumps(case.body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as err:
        return err.code, []
    if case.body.get("stream"):
        return status, _sse_text(raw, case.chat)
    doc = json.loads(raw)
    return status, [(c["message"]["content"] if case.chat else c["text"]) or "" for c in doc["choices"]]


def _coalesced(diff, direct: dict, through: dict) -> bool:  # noqa: ANN001 - a conformance Difference
    """A stream whose text events differ only in how many there are: vLLM merges the deltas of a request
    that its output handler had not sent yet into one event (``RequestOutputKind.DELTA``), so on a busy
    machine a choice's text may come in fewer events, or in its finish event, whichever server it is. A
    finish event that took in a text event carries that event's fields (the echo's ``prompt_token_ids``,
    vllm/entrypoints/openai/completion/serving.py at v0.23.0): a finish-event path whose types on one
    (merged) side are all found on the other side's text events or finish event is that merge."""
    if diff.where.startswith("sse finish path "):
        path = diff.where[len("sse finish path "):]

        def types(answers: dict, kind: str) -> set[str]:
            return set(answers[diff.case]["body"]["by_kind"].get(kind, {}).get("paths", {}).get(path, []))
        return any(types(merged, "finish") and types(plain, "content")
                   and types(merged, "finish") <= types(plain, "content") | types(plain, "finish")
                   for merged, plain in ((through, direct), (direct, through)))
    if diff.where != "sse per_choice":
        return False
    def bare(kinds: list[str]) -> set[tuple[str, ...]]:  # the distinct per-choice sequences, text events out
        return {tuple(k for k in seq.split() if k != "content") for seq in kinds}
    return bare(diff.recorded) == bare(diff.found)


def test_the_sdk_corpus_through_pd_answers_as_one_instance_does(real_stack: RealStack) -> None:
    """The conformance corpus (completions and chat, stream or not, n>1, logprobs, echo, stop strings,
    max_tokens edges, a bad model, a prompt over max-model-len, bad JSON, wrong types, unknown fields)
    through the proxy to real PD pairs, against the same requests to one plain vLLM instance: every answer
    has the instance's shape (status, headers, JSON key paths and types, SSE framing, error type and param)
    but where docs/simulator.md lists the proxy's intentional differences, and every greedy request
    generates the instance's text."""
    from ascend_runtime.conformance import compare
    from ascend_runtime.conformance.corpus import corpus
    from ascend_runtime.conformance.drive import drive
    from ascend_runtime.conformance.fixtures import load_intentional

    cases = [c for c in corpus() if "metrics" not in c.tags]
    single = real_stack.url("decode-1")
    direct = asyncio.run(drive(single, cases))
    through = asyncio.run(drive(real_stack.proxy, cases))
    table = load_intentional()
    diffs = [d for d in compare.compare(direct, through) if not compare.is_intentional(d, "proxy", table)
             and not _coalesced(d, direct, through)]
    assert not diffs, "\n".join(str(d) for d in diffs)
    assert direct["cmpl.max_tokens_over_len"]["status"] == through["cmpl.max_tokens_over_len"]["status"] == 400
    assert direct["cmpl.prompt_too_long"]["status"] == through["cmpl.prompt_too_long"]["status"] == 400

    # a case the proxy answers differently on purpose, as a whole (docs/simulator.md), has no text to compare
    whole = [e["case"] for e in table if e["target"] in ("proxy", "both") and e["where"] == "*"]
    greedy_cases = [c for c in cases if isinstance(c.body, dict) and c.body.get("temperature") == 0
                    and c.raw is None and not c.stop_from_output and "batch" not in c.name
                    and not any(fnmatch.fnmatchcase(c.name, pattern) for pattern in whole)]
    compared = 0
    for case in greedy_cases:
        want, got = _texts(single, case), _texts(real_stack.proxy, case)
        if want[0] != 200:
            continue
        assert got == want, (case.name, got, want)
        compared += 1
    assert compared >= 10, compared  # the comparison covered the corpus's successful greedy requests


def test_a_drain_with_migrate_moves_a_stream_to_the_other_decode(real_stack: RealStack) -> None:
    """A stream on a decode drained with ``migrate`` continues on the other decode: the client gets every
    token it asked for, one id, usage of its own prompt and all tokens, and no error. The stream is long
    (1,500 tokens) so that on a quiet machine, where the tiny model writes hundreds of tokens a second, it is
    still running when the drain arrives."""
    n = 1500
    body = {"model": MODEL_NAME, "prompt": prompt(21, 40), "max_tokens": n, "ignore_eos": True, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}

    async def go() -> tuple[str, list[dict]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
            async with s.post(real_stack.proxy + "/v1/completions", json=body) as resp:
                assert resp.status == 200
                drained = resp.headers["x-decode-instance"]
                buf = b""
                moved = False
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    if not moved and buf.count(b"\n\n") >= 20:
                        async with s.post(real_stack.proxy + "/admin/instances/drain", headers=_admin(real_stack),
                                          json={"name": drained, "migrate": True}) as r:
                            assert r.status == 200, await r.text()
                        moved = True
            async with s.post(real_stack.proxy + "/admin/instances/drain", headers=_admin(real_stack),
                              json={"name": drained, "drain": False}) as r:
                assert r.status == 200, await r.text()
        events = [e[len("data: "):] for e in buf.decode().split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return drained, [json.loads(e) for e in events[:-1]]

    drained, objects = asyncio.run(go())
    assert not [o for o in objects if "error" in o], [o for o in objects if "error" in o]
    usage = [o["usage"] for o in objects if o.get("usage")]
    tokens = sum(1 for o in objects if o.get("choices") and o["choices"][0].get("text"))
    assert len({o["id"] for o in objects}) == 1
    # usage counts every token. An event with text carries one token or more (the detokenizer holds back a
    # token that ends inside a UTF-8 character, frequent with a random model's byte-level output, and a busy
    # output handler merges deltas), and vLLM also sends events with no text: so events are not tokens, but
    # more text events than tokens would be tokens sent twice
    assert usage[-1]["completion_tokens"] == n and 0 < tokens <= n, (usage[-1], tokens)
    assert usage[-1]["prompt_tokens"] == greedy(real_stack.url("decode-0"), body["prompt"], 1)["usage"]["prompt_tokens"]
    moved = _metric_sum(real_stack.proxy, "ascend_proxy_migrations_total")
    assert moved >= 1, f"no stream left {drained}"


def test_a_rollout_under_load_fails_no_request_and_the_planner_observes_it(real_stack: RealStack) -> None:
    """A decode instance restarted (drained first, streams migrated) while clients send requests: not one
    fails. (One instance, under light load: a vLLM server restarting on a 2-core machine beside three busy
    ones takes minutes; the rollout's one-at-a-time order over several instances is the simulator
    tests'. The stack's single prefill cannot be rolled without downtime: `rollout` refuses a role with
    one instance unless --allow-downtime.) The P:D planner, reading the proxy during
    the run, logs each decision with the latencies it measured."""
    import subprocess
    import sys
    import threading

    from ascend_runtime.checks import ThroughputConfig, run_throughput_sync

    batches = []
    done = threading.Event()

    def load() -> None:  # batches of requests until the rollout is over: load for its whole length
        seed = 0
        while not done.is_set():
            cfg = ThroughputConfig(endpoint=real_stack.proxy, input_len=64, output_len=32, num_prompts=8,
                                   concurrency=2, progress=False, seed=seed)
            batches.append(run_throughput_sync(cfg))
            seed += 1

    loader = threading.Thread(target=load)
    loader.start()
    time.sleep(5)
    base = ["--stack", "local-vllm", "--stacks-dir", str(real_stack.stacks), "--state-dir", str(real_stack.state_dir)]
    planner = subprocess.Popen([sys.executable, "-m", "ascend_runtime", "pd-planner", *base, "--dry-run",
                                "--interval", "5", "--max-cycles", "6"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    rollout = subprocess.run([sys.executable, "-m", "ascend_runtime", "rollout", *base, "--migrate",
                              "--instance", "decode-0"],
                             capture_output=True, text=True, timeout=3600)
    planned = planner.communicate(timeout=600)[0]
    done.set()
    loader.join(timeout=3600)
    assert rollout.returncode == 0, rollout.stdout + rollout.stderr
    assert rollout.stdout.count("replaced: pid ") == 1, rollout.stdout  # decode-0: "pid A -> B, serving in ..."
    failed = [e for r in batches for e in r.to_dict()["errors"]]
    completed = sum(r.completed for r in batches)
    assert completed >= 16 and not failed, (completed, failed)
    assert planner.returncode == 0, planned
    measured = [line for line in planned.splitlines() if "[measured median TTFT" in line and "TPOT" in line]
    assert measured, planned[-2000:]
