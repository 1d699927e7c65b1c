"""Admin HTTP API: add, remove, drain and list instances (Bearer-token guarded).

POST /admin/instances/add     {"name"?, "role", "url", "weight"?} or {"instances": [...]}
POST /admin/instances/remove  {"name": N} or {"names": [...]}
POST /admin/instances/drain   {"name": N, "drain": true|false, "migrate"?: false|true}
GET  /admin/instances         -> {"instances": [...], "summary": {...}}; each endpoint's ``instance``
                                 (the engine instance it is a DP rank of) when set

``migrate: true`` (with ``drain: true``) also moves the instance's in-flight
decode streams to other decode instances (forward.py, migrate.py), and every
stream that starts relaying from it later, until it is undrained; the answer
carries ``migrating``: the streams this worker stopped (they continue
elsewhere; the others finish in place). Without it a drain only waits.

A name in ``remove`` and ``drain`` is an endpoint's name or an engine instance's: under rank serving
(one API server per DP rank, each its own endpoint with ``instance`` set) the instance's name stands
for every endpoint whose ``instance`` it is, and the answer adds ``endpoints``: the names acted on.
Under instance serving each endpoint is its own instance and the answers are as they always were.

Without ``Authorization: Bearer <token>`` the answer is 401; if the proxy was
started without an admin token every admin call is refused with 403.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ascend_runtime.proxy.boundedjson import JsonError, load_json
from ascend_runtime.proxy.instances import (
    InstanceSpecError,
    check_unique,
    spec_from_mapping,
)
from ascend_runtime.proxy.pool import InstancePool
from ascend_runtime.proxy.urls import redact

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _err(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def guarded(token: str | None, handler: Handler) -> Handler:
    """Wrap ``handler`` so it runs only with the right bearer token."""

    async def wrapper(request: web.Request) -> web.StreamResponse:
        if not token:
            return _err(403, "admin API disabled: start the proxy with --admin-token-env VAR")
        auth = request.headers.get("Authorization", "")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            return web.json_response({"error": {"message": "missing or invalid bearer token", "code": 401}},
                                     status=401, headers={"WWW-Authenticate": "Bearer"})
        try:
            return await handler(request)
        except BadBody as exc:  # nothing was applied: every field is checked before the pool changes
            return _err(400, str(exc))

    return wrapper


class BadBody(Exception):
    """An admin request body of the wrong shape: answered 400 in the proxy's error shape, naming the field."""


async def _json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, nested at most ``MAX_DEPTH`` deep as client requests are (boundedjson.py)."""
    try:
        data = load_json(await request.read() or b"{}")
    except JsonError as exc:
        raise BadBody(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadBody("expected a JSON object")
    return data


def _quoted(value: Any) -> str:
    """A refused admin value as messages quote it: JSON, at most 80 characters, URL credentials redacted."""
    return redact(json.dumps(value))[:80]


def _names(data: dict[str, Any]) -> list[str]:
    """``names`` (a non-empty list of instance names) or ``[name]``; BadBody naming the field otherwise."""
    if "names" in data and data["names"] is not None:
        names = data["names"]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise BadBody(f"names must be a non-empty list of instance names, got {_quoted(names)}")
        return names
    return [_name(data)]


def _name(data: dict[str, Any]) -> str:
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise BadBody(f"name must be an instance name (a non-empty string), got {_quoted(name)}")
    return name


def _instances(data: dict[str, Any]) -> list[dict[str, Any]]:
    """``instances`` (a non-empty list of objects) or the body itself as the one instance."""
    if "instances" not in data:
        return [data]
    items = data["instances"]
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise BadBody("instances must be a non-empty list of objects ({\"role\", \"url\", \"name\"?, \"weight\"?}), "
                      f"got {_quoted(items)}")
    return items


class AdminApi:
    """Routes operating on ``pool``; admin-added instances have source ``admin``.

    ``group`` (``--workers N``, workers.py): mutations are also applied on every
    other worker and the listing sums their load; not on a worker's Unix socket.
    """

    def __init__(self, pool: InstancePool, token: str | None, group: Any = None):
        self.pool = pool
        self.token = token
        self.group = group

    async def _everywhere(self, request: web.Request, answer: dict[str, Any]) -> web.Response:
        """Apply the same call on the other workers (if any) and answer with their results."""
        from ascend_runtime.proxy.workers import is_local

        if self.group is None or is_local(request):
            return web.json_response(answer)
        results = await self.group.fan_out(request.path, await request.read(),
                                           request.headers.get("Authorization", ""))
        failed = {i: r for i, r in results.items() if r != "ok"}
        if failed:
            return web.json_response({"error": {"message": f"not applied on every worker: {failed}", "code": 502},
                                      "workers": results}, status=502)
        return web.json_response({**answer, "workers": results})

    def routes(self) -> list[web.RouteDef]:
        g = lambda h: guarded(self.token, h)  # noqa: E731
        return [
            web.post("/admin/instances/add", g(self.add)),
            web.post("/admin/instances/remove", g(self.remove)),
            web.post("/admin/instances/drain", g(self.drain)),
            web.get("/admin/instances", g(self.list)),
        ]

    def _listing(self) -> dict[str, Any]:
        now = self.pool.clock()
        return {"instances": [s.snapshot(now) for s in self.pool.all()], "summary": self.pool.summary()}

    async def add(self, request: web.Request) -> web.Response:
        items = _instances(await _json(request))
        try:
            specs = [spec_from_mapping(i) for i in items]
            check_unique(specs)
        except (InstanceSpecError, TypeError, ValueError) as exc:
            return _err(400, str(exc))
        for spec in specs:
            self.pool.add(spec, source="admin")
        return await self._everywhere(request, {"added": [s.name for s in specs], **self._listing()})

    def _endpoints(self, names: list[str]) -> tuple[list[str], list[str]]:
        """(the endpoint names ``names`` stand for, each once in listing order; the names that stand for none).

        A name is an endpoint's or an engine instance's (``InstancePool.members``)."""
        found: dict[str, None] = {}
        missing = []
        for name in names:
            members = self.pool.members(name)
            if not members:
                missing.append(name)
            found.update((s.name, None) for s in members)
        return list(found), missing

    def _rank_answer(self, endpoints: list[str]) -> dict[str, Any]:
        """``{"endpoints": [...]}`` when any of ``endpoints`` is a DP rank of an instance (rank serving), else
        ``{}``: answers under instance serving keep their shape."""
        ranks = any((s := self.pool.get(n)) is not None and s.spec.instance is not None for n in endpoints)
        return {"endpoints": endpoints} if ranks else {}

    async def remove(self, request: web.Request) -> web.Response:
        names = _names(await _json(request))
        endpoints, missing = self._endpoints(names)
        if missing:
            return _err(404, f"unknown instance(s): {missing}")
        extra = self._rank_answer(endpoints)
        for name in endpoints:
            self.pool.remove(name)
        return await self._everywhere(request, {"removed": names, **extra, **self._listing()})

    async def drain(self, request: web.Request) -> web.Response:
        data = await _json(request)
        name = _name(data)
        drain, migrate = data.get("drain", True), data.get("migrate", False)
        if not isinstance(drain, bool) or not isinstance(migrate, bool):
            return _err(400, f"drain and migrate must be true or false, got drain={drain!r}, migrate={migrate!r}")
        if migrate and not drain:
            return _err(400, "migrate needs drain: true (an undrained instance keeps its streams)")
        endpoints, missing = self._endpoints([name])
        if missing:
            return _err(404, f"unknown instance: {name!r}")
        for endpoint in endpoints:  # all drained before any stream moves: none moves to a sibling rank
            self.pool.drain(endpoint, drain, migrate)
        answer: dict[str, Any] = {"drained" if drain else "undrained": name, **self._rank_answer(endpoints)}
        if migrate:
            answer["migrating"] = sum(self.pool.migrate_streams(e) for e in endpoints)
        return await self._everywhere(request, {**answer, **self._listing()})

    async def list(self, request: web.Request) -> web.Response:
        from ascend_runtime.proxy.workers import is_local

        if self.group is None or is_local(request):
            return web.json_response(self._listing())
        return web.json_response(await self.group.merged_listing(self._listing(),
                                                                 request.headers.get("Authorization", "")))
