"""The smoke item that proves a PD pair moved KV: decode loaded the prompt prefill computed.

A PD deployment whose roles never exchange a block still answers every request: a prefill without a KV
connector returns no ``kv_transfer_params`` and decode computes the prompt again, or a connector moves
only whole blocks and a short prompt moves nothing. The answers are right; the deployment is not PD. So
this item reads decode's own counters around requests whose prompts are longer than the engine's block
and unique (no prefix cache can answer them):

- ``vllm:external_prefix_cache_hits_total``: prompt tokens decode loaded through its KV connector;
- ``vllm:prefix_cache_hits_total``: prompt tokens decode found in its own prefix cache;
- ``vllm:cache_config_info{block_size=...}``: the engine's block, in tokens.

All three are vLLM 0.23.0's (``vllm/v1/metrics/loggers.py``; listed in the release surface,
``ascend_runtime/engine/surfaces/``). Decode computed ``prompt - external hits - local hits`` prompt
tokens itself; a pair fails when its connector loaded nothing, or when decode computed a whole block or
more of the prompt itself, naming the pair and the numbers. Requests go through the proxy, which names
the pair it chose in ``x-prefill-instance`` / ``x-decode-instance``; the pairs are tried one request at
a time, so the counters move only for the probe on an otherwise idle deployment (traffic from other
clients can only add hits, never hide a pair that moved nothing from one that did, except by chance
of a concurrent request of the very same prompt, which unique prompts rule out).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ascend_runtime.checks.http import JSON_HEADERS, base_url
from ascend_runtime.checks.items import DECODE_HEADER, PREFILL_HEADER, CheckFailed, CheckItem, Instance, SmokeContext
from ascend_runtime.checks.prompts import random_prompt, request_body

#: The samples the item reads, as /metrics exposes them (counters with their ``_total``).
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
LOCAL_HITS = "vllm:prefix_cache_hits_total"
CACHE_CONFIG = "vllm:cache_config_info"
METRICS_READ = (EXTERNAL_HITS, LOCAL_HITS, CACHE_CONFIG)
#: Prompt length in blocks of the engine (the prompt is longer than the block: whole blocks must move).
PROMPT_BLOCKS = 2


@dataclass(frozen=True)
class DecodeCounters:
    """Decode's counters at one moment: tokens loaded through the connector, tokens found in its own cache,
    and its block size in tokens (None when the engine does not say)."""

    external_hits: float
    local_hits: float
    block_size: int | None


def read_counters(text: str) -> DecodeCounters:
    """Sum each counter over its series (one per engine core / DP rank) in Prometheus text ``text``;
    CheckFailed naming the metric when the engine does not export one."""
    sums: dict[str, float] = {}
    block = None
    # by sample name: the parser files a ``_total`` sample under a family of its own when the exposition
    # gives no HELP line, and under the counter's family when it does
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (EXTERNAL_HITS, LOCAL_HITS):
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            elif sample.name == CACHE_CONFIG and sample.labels.get("block_size", "").isdigit():
                block = int(sample.labels["block_size"])
    for name in (EXTERNAL_HITS, LOCAL_HITS):
        if name not in sums:
            raise CheckFailed(f"the engine exports no {name}, so whether KV moved cannot be read; "
                              "it is a metric of vLLM 0.23 (log_stats must be on: do not pass --disable-log-stats)")
    return DecodeCounters(sums[EXTERNAL_HITS], sums[LOCAL_HITS], block)


def verdict(prefill: str, decode: str, prompt_tokens: int, before: DecodeCounters, after: DecodeCounters) -> str:
    """The pair's line when decode loaded the prompt; CheckFailed with the numbers when it recomputed it."""
    loaded = after.external_hits - before.external_hits
    cached = after.local_hits - before.local_hits
    computed = max(0.0, prompt_tokens - loaded - cached)
    block = after.block_size or before.block_size
    numbers = (f"{prompt_tokens} prompt tokens: {loaded:g} loaded through the KV connector, {cached:g} from decode's "
               f"own prefix cache, {computed:g} computed by decode" + (f"; block {block} tokens" if block else ""))
    if loaded <= 0:
        raise CheckFailed(f"{prefill} -> {decode}: decode recomputed the prompt prefill computed, no KV moved ({numbers})")
    if block and computed >= block:
        raise CheckFailed(f"{prefill} -> {decode}: decode recomputed {computed:g} prompt tokens, a whole block or more, "
                          f"that prefill computed ({numbers})")
    return f"{prefill} -> {decode}: {numbers}"


async def _metrics(ctx: SmokeContext, inst: Instance) -> DecodeCounters:
    async with ctx.session.get(base_url(inst.url) + "/metrics") as resp:
        if resp.status != 200:
            raise CheckFailed(f"decode {inst.name} GET /metrics returned HTTP {resp.status}")
        return read_counters(await resp.text())


async def _metrics_or_none(ctx: SmokeContext, inst: Instance) -> DecodeCounters | None:
    try:
        return await _metrics(ctx, inst)
    except (CheckFailed, aiohttp.ClientError, asyncio.TimeoutError):
        return None


def kv_handover_item(prompt_blocks: float = PROMPT_BLOCKS, tries: int | None = None) -> CheckItem:
    """The item: one unique prompt of ``prompt_blocks`` engine blocks per try through the proxy (``tries``:
    default, one per decode instance, at least two), each pair the proxy chose judged by :func:`verdict`.
    With rank serving the proxy names a DP rank's server, whose /metrics has that rank's counters only.

    Needs the instances (``--stack`` or an explicit list with roles): their ``/metrics`` are read."""

    async def fn(ctx: SmokeContext) -> str:
        decodes = {i.name: i for i in ctx.instances if i.role == "decode"}
        if not decodes:
            raise CheckFailed("no decode instances known (give --stack): decode's counters cannot be read")
        if ctx.model is None:
            raise CheckFailed("no model name: GET /v1/models failed and no --model given")
        rng = random.Random(secrets.randbits(64))
        results: dict[tuple[str, str], str] = {}
        for _ in range(tries or max(2, len({i.group for i in decodes.values()}))):
            # every decode's counters before: the proxy names the one it chose only in its answer (a decode
            # that cannot be read is left out here: the proxy routes around a dead one, its own items say so)
            before = {name: await _metrics_or_none(ctx, inst) for name, inst in decodes.items()}
            block = next((c.block_size for c in before.values() if c and c.block_size), None) or 16
            # a nonce first, so no cached prefix of an earlier probe (or request) can answer it
            prompt = f"{secrets.token_hex(8)} {random_prompt(rng, max(1, int(block * prompt_blocks)))}"
            body = request_body("completions", ctx.model, prompt, 2, stream=False)
            async with ctx.session.post(ctx.base + "/v1/completions", data=json.dumps(body), headers=JSON_HEADERS) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise CheckFailed(f"POST /v1/completions returned HTTP {resp.status}: {text[:200]}")
                prefill, decode = resp.headers.get(PREFILL_HEADER, "?"), resp.headers.get(DECODE_HEADER, "?")
            if decode not in decodes:
                raise CheckFailed(f"the proxy named decode {decode!r}, not a decode instance of the plan")
            prompt_tokens = int(json.loads(text)["usage"]["prompt_tokens"])
            if before[decode] is None:  # read again: the error names why
                before[decode] = await _metrics(ctx, decodes[decode])
                raise CheckFailed(f"decode {decode}'s counters could not be read before the probe; try again")
            after = await _metrics(ctx, decodes[decode])
            results[(prefill, decode)] = verdict(prefill, decode, prompt_tokens, before[decode], after)
        return "; ".join(results.values())

    return CheckItem("KV handed over prefill -> decode (decode's connector counters)", fn)
