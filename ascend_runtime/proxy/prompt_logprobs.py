"""Requests for the prompt's log-probabilities: served whole by one prefill instance.

vLLM 0.23.0 computes a prompt's log-probabilities while it runs the prompt through the model: asked by
``prompt_logprobs``, or on completions by ``echo`` with ``logprobs``, on chat by ``echo`` with
``top_logprobs`` (``to_sampling_params`` in vllm/entrypoints/openai/completion/protocol.py and
chat_completion/protocol.py). A decode instance given a remote prefill's KV never runs the prompt; asked
for them anyway, vLLM 0.23.0's API server failed in its output processor (``OverflowError`` in
``_update_prompt_logprobs``, vllm/v1/engine/logprobs.py, on the CPU build with NixlConnector) and the
whole server exited, and a retry on the next decode instance took that one down too.

So such a request never reaches a decode instance: the proxy sends the client's request unchanged to one
prefill instance (every instance's engine serves a plain request: the KV connector's role is ``kv_both``
or ``kv_producer``, neither refuses one) and relays its answer as it comes, streamed or not. A refused or
unreachable instance, or a 5xx before the answer starts, is tried on another prefill instance, up to the
proxy's ``max_attempts``; an engine's 4xx is the client's answer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http import HttpVersion11

from ascend_runtime.proxy.errors import error_response
from ascend_runtime.proxy.pd import REQUEST_ID_HEADER
from ascend_runtime.proxy.pool import InstancePool, NoInstanceError

log = logging.getLogger(__name__)


def needs_prompt_logprobs(req: dict[str, Any], chat: bool) -> bool:
    """Whether the engine would compute the prompt's log-probabilities for ``req`` (as vLLM 0.23.0's
    ``to_sampling_params`` decides: ``prompt_logprobs``, else ``echo`` with the sampled log-probabilities)."""
    if req.get("prompt_logprobs") is not None:
        return True
    if not req.get("echo"):
        return False
    return req.get("top_logprobs" if chat else "logprobs") is not None


async def serve_on_prefill(request: web.Request, path: str, body: bytes, headers: dict[str, str],
                           pool: InstancePool, session: aiohttp.ClientSession, max_attempts: int,
                           client_id: str) -> tuple[web.StreamResponse, str]:
    """The answer to the client's request (``body`` as it came) from one prefill instance, and the outcome
    label of ``requests_total``."""
    tried: list[str] = []
    last = ""
    while len(tried) < max_attempts:
        try:
            state = pool.pick("prefill", set(tried))
        except NoInstanceError as exc:
            if tried:
                break
            return error_response(503, str(exc)), "no_instance"
        tried.append(state.name)
        pool.begin(state)
        client: web.StreamResponse | None = None
        try:
            async with session.post(state.spec.url + path, data=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)) as resp:
                if resp.status >= 500:
                    last = f"{state.name}: HTTP {resp.status}"
                    pool.record_failure(state, f"prefill returned {resp.status}")
                    continue
                kind = resp.headers.get("Content-Type", "application/json")
                if resp.status != 200 or not kind.startswith("text/event-stream"):
                    answer = await resp.read()
                    if resp.status == 200:
                        pool.record_success(state)
                    return web.Response(status=resp.status, body=answer, headers={
                        "Content-Type": kind, REQUEST_ID_HEADER: client_id}), \
                        "success" if resp.status == 200 else "client_error"
                client = web.StreamResponse(status=200, headers={"Content-Type": kind, REQUEST_ID_HEADER: client_id})
                if request.version >= HttpVersion11:
                    client.enable_chunked_encoding()
                await client.prepare(request)
                async for chunk in resp.content.iter_any():
                    await client.write(chunk)
                await client.write_eof()
                pool.record_success(state)
                return client, "success"
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            last = f"{state.name}: {type(exc).__name__}"
            pool.record_failure(state, last, hard=isinstance(exc, aiohttp.ClientConnectorError))
            if client is not None:  # the answer had started: it cannot be tried elsewhere
                return client, "stream_error"
        finally:
            pool.end(state)
        log.warning("request %s: prompt log-probabilities on %s failed: %s", client_id, state.name, last)
    return error_response(502, f"no prefill instance answered a request for the prompt's log-probabilities "
                               f"(tried {', '.join(tried)}; last: {last})"), "upstream_error"
