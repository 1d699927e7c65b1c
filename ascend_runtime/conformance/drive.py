"""Send the corpus to one server and keep each answer's shape (one process, one client session)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from ascend_runtime.conformance.corpus import Case, corpus
from ascend_runtime.conformance.shapes import answer_shape

#: Seconds one request may take (the real engine on a loaded 2-core machine is slow).
REQUEST_TIMEOUT_S = 300.0


async def _send(session: aiohttp.ClientSession, url: str, case: Case, body: Any) -> tuple[int, dict[str, str], bytes]:
    data = case.raw if case.raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": case.content_type} if data is not None else {}
    async with session.request(case.method, url + case.path, data=data, headers=headers) as resp:
        raw = await resp.read()
        return resp.status, dict(resp.headers), raw


def _generated_text(raw: bytes, chat: bool) -> str:
    doc = json.loads(raw)
    choice = doc["choices"][0]
    return (choice["message"]["content"] if chat else choice["text"]) or ""


def stop_string(text: str) -> str:
    """A stop string the target will meet after some text: the first two characters from the middle of the
    text it generated whose first occurrence is in the second half (else the last two)."""
    if len(text) < 3:
        return text or " "
    half = len(text) // 2
    for i in range(half, len(text) - 1):
        candidate = text[i:i + 2]
        if text.find(candidate) >= half:
            return candidate
    return text[-2:]


async def _body_for(session: aiohttp.ClientSession, url: str, case: Case) -> Any:
    """The body to send: a ``stop_from_output`` case gets a stop string from the target's own answer."""
    if not case.stop_from_output:
        return case.body
    probe = {k: v for k, v in case.body.items() if k not in ("stream", "stream_options")}
    status, _, raw = await _send(session, url, case, probe)
    if status != 200:
        raise RuntimeError(f"{case.name}: the probe without stop got {status}: {raw[:300]!r}")
    return {**case.body, "stop": [stop_string(_generated_text(raw, case.chat))]}


async def drive(url: str, cases: list[Case] | None = None) -> dict[str, dict[str, Any]]:
    """``{case name: answer shape}`` of every case sent to ``url`` (in corpus order)."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    shapes: dict[str, dict[str, Any]] = {}
    # a fresh connection per request: no race with the server closing an idle kept-alive one
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(force_close=True)) as session:
        for case in cases if cases is not None else corpus():
            try:
                body = await _body_for(session, url, case)
                status, headers, raw = await _send(session, url, case, body)
            except aiohttp.ClientError as exc:
                raise RuntimeError(f"{case.name}: {case.method} {url}{case.path} failed: {exc}") from exc
            shapes[case.name] = {"request": f"{case.method} {case.path}",
                                 **answer_shape(status, headers, raw, metrics="metrics" in case.tags)}
    return shapes
