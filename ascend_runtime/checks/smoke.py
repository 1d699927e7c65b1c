"""The smoke check: a declared list of named items, each passing or failing with a detail.

An item is a :class:`CheckItem` (name + async function of a
:class:`SmokeContext`).  The function returns a short detail on success and
raises :class:`CheckFailed` (or anything else) on failure.  Callers may plug
in more items (e.g. rank-table and launch-file consistency once the renderer
exists) via ``extra_items``.

Built-in items:

- proxy ``/health`` and ``/v1/models`` (the latter learns the model name);
- one completion and one chat request through the proxy, non-streaming and
  streaming, each requiring content, usage, a well-formed SSE stream with
  ``[DONE]`` and the PD headers ``x-prefill-instance`` / ``x-decode-instance``
  (which, when instance roles are known, must name a prefill resp. decode
  instance);
- per instance (from the Plan with ``--stack``): ``/health`` and ``/v1/models``; with rank serving
  (``serving: rank``) per DP rank, each rank's own API server;
- with the instances known: that each PD pair the proxy chose moved the prompt's KV (kv_handover.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from ascend_runtime.checks.http import JSON_HEADERS, base_url, make_session
from ascend_runtime.checks.items import (
    DECODE_HEADER,
    PREFILL_HEADER,
    CheckFailed,
    CheckFn,
    CheckItem,
    Instance,
    ItemResult,
    SmokeContext,
    SmokeReport,
)
from ascend_runtime.checks.kv_handover import PROMPT_BLOCKS, kv_handover_item
from ascend_runtime.checks.plan_files import plan_file_items
from ascend_runtime.checks.prompts import request_body
from ascend_runtime.checks.sse import DONE, SSEDecoder, chunk_text

SMOKE_PROMPT = "Say hello to the Ascend cluster in one short sentence"
SMOKE_MAX_TOKENS = 8


# ---------------------------------------------------------------- helpers


async def _get(ctx: SmokeContext, url: str) -> tuple[int, str]:
    async with ctx.session.get(url) as resp:
        return resp.status, await resp.text()


def _expect_200(what: str, status: int, text: str) -> None:
    if status != 200:
        raise CheckFailed(f"{what} returned HTTP {status}: {text[:200].strip()}")


def _models(what: str, text: str) -> list[str]:
    try:
        ids = [str(m["id"]) for m in json.loads(text)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckFailed(f"{what} is not an OpenAI model list: {text[:200]}") from exc
    if not ids:
        raise CheckFailed(f"{what} lists no model")
    return ids


def _check_pd_headers(ctx: SmokeContext, headers: Any) -> str:
    """Return 'prefill=A decode=B' or raise naming the missing/wrong header."""
    if not ctx.require_pd:
        return "PD headers not required"
    names = {}
    for header in (PREFILL_HEADER, DECODE_HEADER):
        value = (headers.get(header) or "").strip()
        if not value:
            raise CheckFailed(f"missing PD header {header}: the request did not take the prefill/decode path")
        names[header] = value
    roles = {i.name: i.role for i in ctx.instances if i.role}
    for header, role in ((PREFILL_HEADER, "prefill"), (DECODE_HEADER, "decode")):
        value = names[header]
        if roles and roles.get(value) != role:
            raise CheckFailed(f"{header}: {value} is not a {role} instance of the plan")
    ctx.pd_seen.append((names[PREFILL_HEADER], names[DECODE_HEADER]))
    return f"prefill={names[PREFILL_HEADER]} decode={names[DECODE_HEADER]}"


# ---------------------------------------------------------------- items


async def _proxy_health(ctx: SmokeContext) -> str:
    status, text = await _get(ctx, ctx.base + "/health")
    _expect_200("GET /health", status, text)
    return "HTTP 200"


async def _proxy_models(ctx: SmokeContext) -> str:
    status, text = await _get(ctx, ctx.base + "/v1/models")
    _expect_200("GET /v1/models", status, text)
    ids = _models("GET /v1/models", text)
    if ctx.model is None:
        ctx.model = ids[0]
    elif ctx.model not in ids:
        raise CheckFailed(f"model {ctx.model!r} not served; /v1/models lists {ids}")
    return f"models: {', '.join(ids)}"


def _request_item(api: str, stream: bool) -> CheckItem:
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    label = f"{'chat' if api == 'chat' else 'completion'}{' (stream)' if stream else ''} via proxy"

    async def fn(ctx: SmokeContext) -> str:
        if ctx.model is None:
            raise CheckFailed("no model name: GET /v1/models failed and no --model given")
        body = request_body(api, ctx.model, SMOKE_PROMPT, SMOKE_MAX_TOKENS, stream)
        async with ctx.session.post(ctx.base + path, data=json.dumps(body), headers=JSON_HEADERS) as resp:
            if resp.status != 200:
                raise CheckFailed(f"POST {path} returned HTTP {resp.status}: {(await resp.text())[:200]}")
            pd = _check_pd_headers(ctx, resp.headers)
            if stream:
                text, tokens = await _read_stream(path, resp)
            else:
                text, tokens = _read_json(path, await resp.text())
        return f"{tokens} tokens, {pd}"

    return CheckItem(f"{label} POST {path}", fn)


async def _read_stream(path: str, resp: aiohttp.ClientResponse) -> tuple[str, int]:
    dec = SSEDecoder()
    text, done, usage, chunks = "", False, None, 0
    async for data in resp.content.iter_any():
        for payload in dec.feed(data):
            if payload == DONE:
                done = True
                continue
            try:
                obj = json.loads(payload)
            except ValueError as exc:
                raise CheckFailed(f"POST {path} stream: invalid JSON event {payload[:120]!r}") from exc
            if "error" in obj:
                raise CheckFailed(f"POST {path} stream: error event {json.dumps(obj['error'])[:200]}")
            piece = chunk_text(obj)
            if piece:
                text += piece
                chunks += 1
            usage = obj.get("usage") or usage
    if not done:
        raise CheckFailed(f"POST {path} stream ended without data: [DONE]")
    if chunks == 0:
        raise CheckFailed(f"POST {path} stream carried no content")
    if not usage:
        raise CheckFailed(f"POST {path} stream had no usage chunk (stream_options.include_usage)")
    return text, int(usage.get("completion_tokens") or 0)


def _read_json(path: str, raw: str) -> tuple[str, int]:
    try:
        obj = json.loads(raw)
        choice = obj["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise CheckFailed(f"POST {path}: response has no choices: {raw[:200]}") from exc
    text = choice.get("text")
    if text is None:
        text = (choice.get("message") or {}).get("content") or ""
    if not text:
        raise CheckFailed(f"POST {path}: empty completion text")
    usage = obj.get("usage")
    if not usage:
        raise CheckFailed(f"POST {path}: response has no usage")
    return text, int(usage.get("completion_tokens") or 0)


def proxy_items() -> list[CheckItem]:
    """The items checking the proxy (the endpoint) itself."""
    return [
        CheckItem("proxy GET /health", _proxy_health),
        CheckItem("proxy GET /v1/models", _proxy_models),
        _request_item("completions", stream=False),
        _request_item("completions", stream=True),
        _request_item("chat", stream=False),
        _request_item("chat", stream=True),
    ]


def instance_items(instances: Sequence[Instance]) -> list[CheckItem]:
    """``/health`` and ``/v1/models`` items for every instance (named by plan name and role)."""
    items: list[CheckItem] = []
    for inst in instances:
        what = f"rank {inst.name} of {inst.instance}" if inst.instance else f"instance {inst.name}"
        who = what + (f" ({inst.role})" if inst.role else "")
        base = base_url(inst.url)

        async def health(ctx: SmokeContext, base: str = base, who: str = who) -> str:
            try:
                status, text = await _get(ctx, base + "/health")
            except aiohttp.ClientError as exc:
                raise CheckFailed(f"{who} at {base} unreachable: {exc}") from exc
            _expect_200(f"{who} GET {base}/health", status, text)
            return f"{base} HTTP 200"

        async def models(ctx: SmokeContext, base: str = base, who: str = who) -> str:
            try:
                status, text = await _get(ctx, base + "/v1/models")
            except aiohttp.ClientError as exc:
                raise CheckFailed(f"{who} at {base} unreachable: {exc}") from exc
            _expect_200(f"{who} GET {base}/v1/models", status, text)
            return f"{base} models: {', '.join(_models(f'{who} /v1/models', text))}"

        items.append(CheckItem(f"{who} GET /health", health))
        items.append(CheckItem(f"{who} GET /v1/models", models))
    return items


def failing_item(name: str, reason: str) -> CheckItem:
    """An item that always fails with ``reason`` (e.g. the Plan could not be loaded)."""

    async def fn(ctx: SmokeContext) -> str:
        raise CheckFailed(reason)

    return CheckItem(name, fn)


def plan_instances(stack: str, stacks_dir: str | None = None) -> list[Instance]:
    """Endpoints of the stack's Plan (raises the planner's ConfigError): :func:`plan_endpoints`."""
    return plan_endpoints(_load_plan(stack, stacks_dir))


def plan_endpoints(plan: Any) -> list[Instance]:
    """What the proxy routes to in ``plan`` (``Plan.endpoints()``): each instance's leader server, or with
    ``serving: rank`` each DP rank's own server, with the instance it belongs to."""
    return [Instance(name=e["name"], url=e["url"], role=e["role"], instance=e.get("instance"))
            for e in plan.endpoints()]


def _load_plan(stack: str, stacks_dir: str | None):  # noqa: ANN202 - Plan, imported lazily
    from ascend_runtime.planner import load_plan  # noqa: PLC0415 - checks stay importable without a stack

    return load_plan(stack, stacks_dir)


def stack_items(
    stack: str, stacks_dir: str | None = None, rendered_dir: Path | None = None
) -> tuple[list[Instance], list[CheckItem]]:
    """Instances and items for ``--stack``: the Plan, each instance, rank tables and launch files.

    A Plan that cannot be loaded becomes one failing item, never a skip.
    """

    try:
        plan = _load_plan(stack, stacks_dir)
    except Exception as exc:  # noqa: BLE001 - any planner error is reported as the item's failure
        return [], [failing_item(f"plan {stack}", f"load_plan({stack!r}) failed: {type(exc).__name__}: {exc}")]
    instances = plan_endpoints(plan)
    if not instances:
        return [], [failing_item(f"plan {stack}", "the plan has no instances")]
    roles = sorted({i.role or "?" for i in instances})
    groups = {i.group for i in instances}
    ranks = f" ({len(instances)} DP rank API servers)" if len(groups) != len(instances) else ""
    ok = CheckItem(f"plan {stack}", _const(f"{len(groups)} instances{ranks}, roles {', '.join(roles)}"))
    return instances, [ok, *instance_items(instances), *plan_file_items(plan, rendered_dir)]


def _const(detail: str) -> CheckFn:
    async def fn(ctx: SmokeContext) -> str:
        return detail

    return fn


# ---------------------------------------------------------------- runner


async def run_items(ctx: SmokeContext, items: Sequence[CheckItem]) -> list[ItemResult]:
    """Run ``items`` in order, each bounded by ``ctx.timeout_s``; never raises for an item failure."""
    results: list[ItemResult] = []
    for item in items:
        t0 = time.perf_counter()
        try:
            detail = await asyncio.wait_for(item.fn(ctx), ctx.timeout_s)
            passed = True
        except CheckFailed as exc:
            passed, detail = False, str(exc)
        except asyncio.TimeoutError:
            passed, detail = False, f"timed out after {ctx.timeout_s:g} s"
        except aiohttp.ClientError as exc:
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a bug in one item must not hide the others
            passed, detail = False, f"{type(exc).__name__}: {exc}"
        results.append(ItemResult(item.name, passed, detail, time.perf_counter() - t0))
    return results


async def run_smoke(
    endpoint: str,
    instances: Sequence[Instance] = (),
    *,
    stack: str | None = None,
    stacks_dir: str | None = None,
    rendered_dir: Path | None = None,
    timeout_s: float = 30.0,
    model: str | None = None,
    require_pd: bool = True,
    extra_items: Sequence[CheckItem] = (),
    kv_prompt_blocks: float = PROMPT_BLOCKS,
) -> SmokeReport:
    """Run the smoke check against ``endpoint`` (the proxy) and return the report.

    ``instances``: explicit (name, url, role) list; ``stack``: load instances
    from the Plan (failure to do so is a failed item, never a skip).
    ``timeout_s``: per-item bound in seconds. With PD required and decode instances known, the KV
    handover item (kv_handover.py) probes with prompts of ``kv_prompt_blocks`` engine blocks.
    """
    base = base_url(endpoint)
    items = proxy_items()
    insts = list(instances)
    if stack is not None:
        plan_insts, plan_items = stack_items(stack, stacks_dir, rendered_dir)
        insts.extend(plan_insts)
        items.extend(plan_items)
    elif insts:
        items.extend(instance_items(insts))
    if require_pd and any(i.role == "decode" for i in insts):
        items.append(kv_handover_item(kv_prompt_blocks))
    items.extend(extra_items)
    async with make_session(timeout_s) as session:
        ctx = SmokeContext(session, base, timeout_s, model=model, instances=insts, require_pd=require_pd)
        results = await run_items(ctx, items)
    return SmokeReport(endpoint=base, items=results)


def run_smoke_sync(endpoint: str, **kwargs: Any) -> SmokeReport:
    """Blocking wrapper of :func:`run_smoke`."""
    return asyncio.run(run_smoke(endpoint, **kwargs))
