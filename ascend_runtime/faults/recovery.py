"""Before an instance goes back into rotation: its leader's ``/health`` and one direct PD round trip.

The instance is still drained in the proxies, so a request through the proxy
would not reach it; the round trip talks to the engines directly, with the
proxy's own protocol (``ascend_runtime.proxy.pd``): a prefill copy of the
smoke check's request (``ascend_runtime.checks.smoke``) to a prefill instance,
its ``kv_transfer_params`` into the request to a decode instance. A recovering
prefill instance pairs with a routable decode instance and the other way round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import aiohttp

from ascend_runtime.checks.prompts import request_body
from ascend_runtime.checks.smoke import SMOKE_MAX_TOKENS, SMOKE_PROMPT
from ascend_runtime.proxy.pd import (
    REQUEST_ID_HEADER,
    build_decode_request,
    build_prefill_request,
    new_request_id,
)


class RecoveryCheckFailed(Exception):
    """The instance is not ready to serve again; the message says why."""


@dataclass(frozen=True)
class Endpoint:
    """An instance's name and leader API base URL."""

    name: str
    url: str


async def _get(session: aiohttp.ClientSession, url: str, timeout: aiohttp.ClientTimeout) -> tuple[int, str]:
    async with session.get(url, timeout=timeout) as resp:
        return resp.status, await resp.text()


async def _post(session: aiohttp.ClientSession, url: str, body: dict, timeout: aiohttp.ClientTimeout) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: new_request_id()}
    async with session.post(url, data=json.dumps(body), headers=headers, timeout=timeout) as resp:
        return resp.status, await resp.text()


async def check_health(session: aiohttp.ClientSession, inst: Endpoint, timeout_s: float) -> None:
    """``GET /health`` of the leader answers 200."""
    try:
        status, text = await _get(session, inst.url + "/health", aiohttp.ClientTimeout(total=timeout_s))
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise RecoveryCheckFailed(f"{inst.name} /health unreachable: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise RecoveryCheckFailed(f"{inst.name} /health answered HTTP {status}: {text[:120]}")


async def pd_round_trip(session: aiohttp.ClientSession, prefill: Endpoint, decode: Endpoint, timeout_s: float) -> str:
    """One non-streaming completion prefilled on ``prefill`` and decoded on ``decode``; returns a summary."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        status, text = await _get(session, prefill.url + "/v1/models", timeout)
        if status != 200:
            raise RecoveryCheckFailed(f"{prefill.name} /v1/models answered HTTP {status}")
        model = json.loads(text)["data"][0]["id"]
        req = request_body("completions", model, SMOKE_PROMPT, SMOKE_MAX_TOKENS, stream=False)
        status, text = await _post(session, prefill.url + "/v1/completions", build_prefill_request(req), timeout)
        if status != 200:
            raise RecoveryCheckFailed(f"prefill on {prefill.name} answered HTTP {status}: {text[:120]}")
        prefilled = json.loads(text)
        status, text = await _post(session, decode.url + "/v1/completions", build_decode_request(req, prefilled), timeout)
        if status != 200:
            raise RecoveryCheckFailed(f"decode on {decode.name} answered HTTP {status}: {text[:120]}")
        answer = json.loads(text)
        out = answer["choices"][0].get("text") or ""
        tokens = int((answer.get("usage") or {}).get("completion_tokens") or 0)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise RecoveryCheckFailed(f"PD round trip {prefill.name} -> {decode.name}: {type(exc).__name__}: {exc}") from None
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise RecoveryCheckFailed(f"PD round trip {prefill.name} -> {decode.name}: malformed answer ({exc})") from None
    if not out or tokens < 1:
        raise RecoveryCheckFailed(f"PD round trip {prefill.name} -> {decode.name} returned no tokens")
    return f"{tokens} tokens via {prefill.name} -> {decode.name}"
