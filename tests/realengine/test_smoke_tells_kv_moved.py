"""The smoke check against real vLLM pairs that do not move KV: one plain server serving both roles (no
connector), and an ExampleConnector pair (whole blocks only) with prompts shorter than a block."""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ascend_runtime.checks import run_smoke
from ascend_runtime.checks.items import CheckFailed, Instance
from ascend_runtime.checks.kv_handover import read_counters, verdict
from ascend_runtime.local.processes import start_process, stop_process_group
from ascend_runtime.local.vllm_engine.server import kv_transfer_config
from ascend_runtime.proxy.pd import build_prefill_request
from tests.realengine.conftest import MODEL_NAME, free_port, http_json, require_engine, start_servers, wait_healthy
from tests.realengine.test_pd_real_engine import prompt

pytestmark = pytest.mark.slow
KV_ITEM = "KV handed over prefill -> decode (decode's connector counters)"


def start_proxy(tmp: Path, prefill_url: str, decode_url: str) -> tuple[str, int]:
    """The kit's proxy in front of one prefill and one decode; (URL, pid)."""
    instances = tmp / "instances.json"
    instances.write_text(json.dumps({"instances": [{"name": "p0", "role": "prefill", "url": prefill_url},
                                                   {"name": "d0", "role": "decode", "url": decode_url}]}))
    port = free_port()
    pid = start_process([sys.executable, "-m", "ascend_runtime", "proxy", "--host", "127.0.0.1", "--port", str(port),
                         "--instances-file", str(instances)], tmp / "proxy.log")
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, pid, tmp / "proxy.log", timeout_s=120)
    return url, pid


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """A server with no connector, and an ExampleConnector prefill/decode pair sharing a directory."""
    require_engine()
    tmp = tmp_path_factory.mktemp("pairs")
    storage = tmp / "kv-files"
    storage.mkdir()
    plain = start_servers(tmp, ["plain"], None)
    example = start_servers(tmp, ["ex-prefill", "ex-decode"],
                            kv_transfer_config("ExampleConnector", shared_storage_path=str(storage)))
    pids = [s.pid for s in plain + example]
    try:
        yield {"plain": plain[0], "ex_prefill": example[0], "ex_decode": example[1], "tmp": tmp, "pids": pids}
    finally:
        for pid in pids:
            stop_process_group(pid)


def test_one_plain_server_in_both_roles_fails_the_smoke_check(pairs) -> None:
    url = pairs["plain"].url
    proxy, pid = start_proxy(_dir(pairs, "plain"), url, url)
    pairs["pids"].append(pid)
    report = asyncio.run(run_smoke(proxy, [Instance("p0", url, "prefill"), Instance("d0", url, "decode")], timeout_s=120))
    failed = {i.name: i.detail for i in report.failures}
    assert KV_ITEM in failed and not report.passed, [i.line() for i in report.items]
    # the proxy refused to let decode recompute: every PD request names the missing handover
    assert "kv_transfer_params" in failed[KV_ITEM], failed[KV_ITEM]


def test_an_example_connector_pair_with_short_prompts_fails_the_smoke_check(pairs) -> None:
    p, d = pairs["ex_prefill"].url, pairs["ex_decode"].url
    proxy, pid = start_proxy(_dir(pairs, "example"), p, d)
    pairs["pids"].append(pid)
    report = asyncio.run(run_smoke(proxy, [Instance("p0", p, "prefill"), Instance("d0", d, "decode")], timeout_s=120,
                                   kv_prompt_blocks=0.25))
    assert not report.passed and KV_ITEM in {i.name for i in report.failures}, [i.line() for i in report.items]


@pytest.mark.parametrize("words, moved", [(20, False), (400, True)], ids=["shorter-than-a-block", "three-blocks"])
def test_example_connector_counters_judged_on_the_real_engine(pairs, words, moved) -> None:
    """The verdict on decode's real counters: ExampleConnector moves whole blocks, so a prompt shorter than a
    block moves nothing (fails, naming the numbers) and a long one moves all but its tail (passes)."""
    p, d = pairs["ex_prefill"].url, pairs["ex_decode"].url
    text = f"{secrets.token_hex(4)} {prompt(11, words)}"
    before = read_counters(urllib.request.urlopen(d + "/metrics", timeout=30).read().decode())
    status, _, _ = http_json("POST", p + "/v1/completions", build_prefill_request(
        {"model": MODEL_NAME, "prompt": text, "max_tokens": 4, "temperature": 0}))
    assert status == 200
    status, answer, _ = http_json("POST", d + "/v1/completions",
                                  {"model": MODEL_NAME, "prompt": text, "max_tokens": 4, "temperature": 0})
    assert status == 200, answer
    after = read_counters(urllib.request.urlopen(d + "/metrics", timeout=30).read().decode())
    tokens = answer["usage"]["prompt_tokens"]
    if moved:
        line = verdict("p0", "d0", tokens, before, after)
        assert "loaded through the KV connector" in line
        assert after.external_hits - before.external_hits >= tokens - after.block_size, line
    else:
        with pytest.raises(CheckFailed, match="no KV moved"):
            verdict("p0", "d0", tokens, before, after)


def _dir(pairs, name: str) -> Path:
    path = pairs["tmp"] / name
    path.mkdir(exist_ok=True)
    return path
