"""FakeWorkloadApi: a test double of the Kubernetes API server and the workload controllers, on 127.0.0.1.

It serves what the rollout's Kubernetes driver calls, over real HTTP, to the real ``kubernetes``
client:

* ``GET`` and ``PATCH`` (``application/json-patch+json`` only: ``test``, ``replace``, ``add``, ``remove``;
  415 otherwise) of
  ``/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ns}/leaderworkersets/{name}`` and
  ``/apis/apps/v1/namespaces/{ns}/deployments/{name}``;
* a JSON patch is applied op by op (``test``, ``replace``, ``add``, RFC 6902); a failing ``test`` is
  422 as on the API server; the result must still be a valid object: a LeaderWorkerSet against the
  pinned CRD's schema (tests/deploy/crds), a Deployment with kubernetes-validate (422 otherwise, kept
  in :attr:`rejected`); a changed ``spec`` bumps ``metadata.generation``, every write ``resourceVersion``;
* the controllers: after a spec change the status reports the old generation for one read, then
  ``settle_reads`` reads of a group being replaced (not ready), then ready, when :attr:`on_ready`
  runs (the test starts the new engine there). :attr:`never_ready` names objects that stay not ready.

Every call needs ``Authorization: Bearer <token>`` (401).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
from aiohttp import web

from tests.deploy.crd_schemas import validate_lws
from tests.kube_api_double import kube_status, serve_on_loopback

K8S_VERSION = "1.30"
JSON_PATCH = "application/json-patch+json"
KINDS = {"leaderworkersets": "LeaderWorkerSet", "deployments": "Deployment"}


class PatchError(Exception):
    """A JSON patch op could not be applied."""


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node, parts[-1]


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``test``, ``replace``, ``add`` and ``remove`` on a copy of ``doc``."""
    out = copy.deepcopy(doc)
    for op in ops:
        try:
            parent, key = _parent(out, op["path"])
            if isinstance(parent, list):
                index = len(parent) if key == "-" else int(key)
                if op["op"] == "test":
                    if parent[index] != op["value"]:
                        raise PatchError(f"test failed at {op['path']}")
                elif op["op"] == "replace":
                    parent[index] = op["value"]
                elif op["op"] == "add":
                    parent.insert(index, op["value"])
                elif op["op"] == "remove":
                    del parent[index]
                else:
                    raise PatchError(f"unsupported op {op['op']}")
            else:
                if op["op"] == "test":
                    if parent.get(key) != op["value"]:
                        raise PatchError(f"test failed at {op['path']}: {parent.get(key)!r} != {op['value']!r}")
                elif op["op"] == "replace":
                    if key not in parent:
                        raise PatchError(f"replace of a missing member {op['path']}")
                    parent[key] = op["value"]
                elif op["op"] == "add":
                    parent[key] = op["value"]
                elif op["op"] == "remove":
                    if key not in parent:
                        raise PatchError(f"remove of a missing member {op['path']}")
                    del parent[key]
                else:
                    raise PatchError(f"unsupported op {op['op']}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise PatchError(f"{op.get('op')} {op.get('path')}: {exc}") from None
    return out


def _client_view(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as a client wrote it: no status, no server-set metadata (what the schemas describe)."""
    meta = {k: v for k, v in obj["metadata"].items() if k in ("name", "namespace", "labels", "annotations")}
    return {**{k: v for k, v in obj.items() if k != "status"}, "metadata": meta}


@dataclass
class Tracked:
    """One object and its controller's progress."""

    obj: dict[str, Any]
    reads_left: int = 0
    stale_read: bool = False


@dataclass(repr=False)
class FakeWorkloadApi:
    """The API server and controller double; ``url`` once :meth:`start` ran."""

    token: str = "fake-rollout-token"
    settle_reads: int = 2
    objects: dict[tuple[str, str, str], Tracked] = field(default_factory=dict)
    patches: list[tuple[str, str, list[dict[str, Any]]]] = field(default_factory=list)
    rejected: list[tuple[int, str]] = field(default_factory=list)
    never_ready: set[str] = field(default_factory=set)
    #: Awaited with (kind, name) when a patched object's group becomes ready.
    on_ready: Callable[[str, str], Awaitable[None]] | None = None
    #: Called with (kind, name) before a PATCH is applied (tests look at the proxies then).
    on_patch: Callable[[str, str], None] | None = None
    #: Names whose next PATCH first sees a concurrent write (its resourceVersion moves).
    race_once: set[str] = field(default_factory=set)
    url: str = ""
    _runner: web.AppRunner | None = None

    def __repr__(self) -> str:
        return f"FakeWorkloadApi({self.url}, {len(self.objects)} objects, {len(self.patches)} patches)"

    async def start(self) -> str:
        app = web.Application(middlewares=[self._auth])
        self.add_routes(app, self._get, self._patch)
        self._runner, self.url = await serve_on_loopback(app)
        return self.url

    @staticmethod
    def add_routes(app: web.Application, get: Any, patch: Any) -> None:
        """GET and PATCH of LeaderWorkerSets and Deployments, answered by ``get`` and ``patch``."""
        for group_version in ("apis/leaderworkerset.x-k8s.io/v1", "apis/apps/v1"):
            path = f"/{group_version}/namespaces/{{ns}}/{{plural}}/{{name}}"
            app.router.add_get(path, get)
            app.router.add_patch(path, patch)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return kube_status(401, "Unauthorized", "Unauthorized")
        return await handler(request)

    # ---- state -------------------------------------------------------------------------------
    def add(self, obj: dict[str, Any]) -> None:
        """A workload as ``pulumi up`` created it, its group ready."""
        obj = copy.deepcopy(obj)
        obj["metadata"].update(generation=1, resourceVersion="1")
        obj["status"] = self._readykube_status(obj)
        self.objects[(obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"])] = Tracked(obj)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return next(t.obj for (k, _, n), t in self.objects.items() if k == kind and n == name)

    @staticmethod
    def _readykube_status(obj: dict[str, Any]) -> dict[str, Any]:
        gen = obj["metadata"]["generation"]
        if obj["kind"] == "LeaderWorkerSet":
            return {"observedGeneration": gen, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
                    "conditions": [{"type": "Available", "status": "True"},
                                   {"type": "UpdateInProgress", "status": "False"}]}
        return {"observedGeneration": gen, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                "availableReplicas": 1}

    @staticmethod
    def _updatingkube_status(obj: dict[str, Any]) -> dict[str, Any]:
        gen = obj["metadata"]["generation"]
        if obj["kind"] == "LeaderWorkerSet":  # the old group deleted, the new one starting (maxSurge 0)
            return {"observedGeneration": gen, "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1,
                    "conditions": [{"type": "Available", "status": "False"},
                                   {"type": "UpdateInProgress", "status": "True"}]}
        return {"observedGeneration": gen, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 0,
                "availableReplicas": 0}

    # ---- handlers ------------------------------------------------------------------------------
    def _tracked(self, request: web.Request) -> Tracked | None:
        kind = KINDS.get(request.match_info["plural"])
        return self.objects.get((kind or "", request.match_info["ns"], request.match_info["name"]))

    async def _get(self, request: web.Request) -> web.Response:
        t = self._tracked(request)
        if t is None:
            return kube_status(404, "NotFound", f"{request.match_info['plural']} \"{request.match_info['name']}\" not found")
        name, kind = t.obj["metadata"]["name"], t.obj["kind"]
        if t.stale_read:  # the controller has not seen the new generation yet
            t.stale_read = False
        elif t.reads_left > 0 or name in self.never_ready:
            t.obj["status"] = self._updatingkube_status(t.obj)
            t.reads_left -= 1
        elif t.obj["status"].get("readyReplicas") == 0:
            t.obj["status"] = self._readykube_status(t.obj)
            if self.on_ready is not None:
                await self.on_ready(kind, name)
        return web.json_response(t.obj)

    async def _patch(self, request: web.Request) -> web.Response:
        t = self._tracked(request)
        if t is None:
            return kube_status(404, "NotFound", f"\"{request.match_info['name']}\" not found")
        if request.content_type != JSON_PATCH:
            return kube_status(415, "UnsupportedMediaType", f"expected {JSON_PATCH}, got {request.content_type}")
        ops = await request.json()
        name, kind = t.obj["metadata"]["name"], t.obj["kind"]
        if self.on_patch is not None:
            self.on_patch(kind, name)
        if name in self.race_once:
            self.race_once.discard(name)
            t.obj["metadata"]["resourceVersion"] = str(int(t.obj["metadata"]["resourceVersion"]) + 1)
        try:
            new = apply_json_patch(t.obj, ops)
        except PatchError as exc:
            self.rejected.append((422, str(exc)))
            return kube_status(422, "Invalid", str(exc))
        try:
            if kind == "LeaderWorkerSet":
                validate_lws(_client_view(new))
            else:
                kubernetes_validate.validate(_client_view(new), K8S_VERSION, strict=True)
        except Exception as exc:  # noqa: BLE001 - either validator's error
            self.rejected.append((422, f"{kind} {name}: {exc}"))
            return kube_status(422, "Invalid", f"{kind} {name} is invalid: {str(exc)[:300]}")
        meta = new["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if new["spec"] != t.obj["spec"]:
            meta["generation"] += 1
            t.reads_left, t.stale_read = self.settle_reads, True
        t.obj = new
        self.patches.append((kind, name, ops))
        return web.json_response(json.loads(json.dumps(new)))
