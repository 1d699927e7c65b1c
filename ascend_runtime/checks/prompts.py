"""Prompts sized by the server's own token counts (no tokenizer download).

The server reports ``usage.prompt_tokens`` for every request.  We probe it
with word prompts of two lengths, fit ``tokens = a + b * words`` (``a`` is
the chat template's overhead, ``b`` tokens per word), then refine the word
count on a real prompt until the reported count matches the target (or the
refinement stops improving).  Prompts are random words from a small
vocabulary of common English words, distinct per request (no shared prefix
for prefix caching to exploit), reproducible by seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import aiohttp

from ascend_runtime.checks.http import JSON_HEADERS

VOCAB: tuple[str, ...] = tuple(
    """the of and to in is you that it he was for on are as with his they at be this have from or one had
    by word but not what all were we when your can said there use an each which she do how their if will up
    other about out many then them these so some her would make like him into time has look two more write go
    see number no way could people my than first water been call who oil its now find long down day did get
    come made may part over new sound take only little work know place year live me back give most very after
    thing our just name good sentence man think say great where help through much before line right too mean
    old any same tell boy follow came want show also around form three small set put end does another well
    large must big even such because turn here why ask went men read need land different home us move try kind
    hand picture again change off play spell air away animal house point page letter mother answer found study
    still learn should world high every near add food between own below country plant last school father keep
    tree never start city earth eye light thought head under story saw left few while along might close
    something seem next hard open example begin life always those both paper together got group often run""".split()
)


class ProbeError(RuntimeError):
    """The server did not report usage.prompt_tokens for a probe request."""


@dataclass(frozen=True)
class SizedPrompts:
    """Prompts of ``words`` words each; ``probe_tokens`` = server count for the first one."""

    prompts: list[str]
    words: int
    probe_tokens: int


def random_prompt(rng: random.Random, words: int) -> str:
    """``words`` random vocabulary words joined by spaces."""
    return " ".join(rng.choices(VOCAB, k=words))


def request_body(api: str, model: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    """An OpenAI completions/chat request body with ``ignore_eos`` (vLLM extension)."""
    body: dict = {"model": model, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": stream}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def probe_prompt_tokens(session: aiohttp.ClientSession, url: str, api: str, model: str, prompt: str) -> int:
    """Send ``prompt`` (non-streaming, 1 output token) and return the server's usage.prompt_tokens."""
    body = request_body(api, model, prompt, 1, stream=False)
    async with session.post(url, data=json.dumps(body), headers=JSON_HEADERS) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise ProbeError(f"probe request to {url} returned HTTP {resp.status}: {text[:200]}")
    try:
        return int(json.loads(text)["usage"]["prompt_tokens"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"probe response from {url} has no usage.prompt_tokens: {text[:200]}") from exc


async def size_prompts(
    session: aiohttp.ClientSession,
    url: str,
    api: str,
    model: str,
    input_len: int,
    count: int,
    seed: int = 0,
    max_refinements: int = 4,
) -> SizedPrompts:
    """Return ``count`` prompts whose server-reported length is ``input_len`` tokens (as near as words allow)."""
    rng = random.Random(seed)
    k1 = max(8, min(input_len, 512))
    k2 = max(4, k1 // 2)
    t1 = await probe_prompt_tokens(session, url, api, model, random_prompt(rng, k1))
    t2 = await probe_prompt_tokens(session, url, api, model, random_prompt(rng, k2))
    per_word = (t1 - t2) / (k1 - k2) if t1 != t2 else max(t1, 1) / k1
    per_word = max(per_word, 1e-3)
    overhead = t1 - per_word * k1
    words = max(1, round((input_len - overhead) / per_word))
    first = random_prompt(rng, words)
    tokens = await probe_prompt_tokens(session, url, api, model, first)
    for _ in range(max_refinements):
        if tokens == input_len:
            break
        step = round((input_len - tokens) / per_word) or (1 if tokens < input_len else -1)
        cand_words = max(1, words + step)
        if cand_words == words:
            break
        cand = random_prompt(rng, cand_words)
        cand_tokens = await probe_prompt_tokens(session, url, api, model, cand)
        if abs(cand_tokens - input_len) >= abs(tokens - input_len):
            break
        words, first, tokens = cand_words, cand, cand_tokens
    prompts = [first] + [random_prompt(rng, words) for _ in range(count - 1)]
    return SizedPrompts(prompts=prompts, words=words, probe_tokens=tokens)
