"""FakeCluster: one fake Kubernetes API server for the fault watcher *and* the objects a recovery onto spares
patches, on 127.0.0.1 (a test double, never used by the kit).

It is :class:`~tests.faults.fake_kube.FakeKubernetesApi` (Nodes, the MindCluster fault ConfigMaps, Events,
EndpointSlices, RBAC by rules) plus, on the same server and token:

* ``GET`` and ``PATCH`` of LeaderWorkerSets and Deployments, answered by a
  :class:`~tests.rollout.fake_kube_workloads.FakeWorkloadApi` (its JSON patch, its validation against the
  pinned LWS CRD schema or kubernetes-validate, its controller that reports the replaced group ready);
* ``PATCH`` of ConfigMaps (``application/json-patch+json``, RFC 6902 ``test``/``add``/``replace``/``remove``;
  the result validated as a core/v1 ConfigMap, ``resourceVersion`` bumped) and ``PATCH`` of Nodes
  (``application/merge-patch+json``, RFC 7386; the result validated as a core/v1 Node); 415 for another
  content type, as the API server answers.

Each PATCH is checked against the bound RBAC rules (verb ``patch``, by name) and kept in :attr:`patched`
as (kind, name, body).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
from aiohttp import web

from tests.faults.fake_kube import K8S_VERSION, FakeKubernetesApi
from tests.kube_api_double import kube_status
from tests.rollout.fake_kube_workloads import JSON_PATCH, FakeWorkloadApi, PatchError, apply_json_patch

MERGE_PATCH = "application/merge-patch+json"
WORKLOAD_GROUPS = {"leaderworkersets": "leaderworkerset.x-k8s.io", "deployments": "apps"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` merged into a copy of ``target`` (null removes a member)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


@dataclass(repr=False)
class FakeCluster(FakeKubernetesApi):
    """The watcher's API server double plus the engine objects (module docstring); ``url`` once started."""

    workloads: FakeWorkloadApi = field(default_factory=lambda: FakeWorkloadApi(settle_reads=1))
    patched: list[tuple[str, str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.workloads.token = self.token

    def add_routes(self, app: web.Application) -> None:
        super().add_routes(app)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_patch("/api/v1/namespaces/{ns}/configmaps/{name}", self._patch_configmap)
        self.workloads.add_routes(app, self._get_workload, self._patch_workload)

    # ---- objects ---------------------------------------------------------------------------
    def add_object(self, obj: dict[str, Any]) -> None:
        """An object as ``pulumi up`` created it (a workload's group ready)."""
        if obj["kind"] in ("LeaderWorkerSet", "Deployment"):
            self.workloads.add(obj)
            return
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = "1"
        self.configmaps[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    # ---- handlers ------------------------------------------------------------------------------
    async def _get_workload(self, request: web.Request) -> web.StreamResponse:
        ns, plural, name = (request.match_info[k] for k in ("ns", "plural", "name"))
        if not self._allowed(WORKLOAD_GROUPS[plural], plural, "get", ns, name):
            return kube_status(403, "Forbidden", f'{plural} "{name}" is forbidden')
        return await self.workloads._get(request)  # noqa: SLF001 - the double's own handler

    async def _patch_workload(self, request: web.Request) -> web.StreamResponse:
        ns, plural, name = (request.match_info[k] for k in ("ns", "plural", "name"))
        if not self._allowed(WORKLOAD_GROUPS[plural], plural, "patch", ns, name):
            return kube_status(403, "Forbidden", f'{plural} "{name}" is forbidden: cannot patch')
        before = len(self.workloads.patches)
        resp = await self.workloads._patch(request)  # noqa: SLF001
        if len(self.workloads.patches) > before:
            kind, obj_name, ops = self.workloads.patches[-1]
            self.patched.append((kind, obj_name, ops))
        return resp

    async def _patch_configmap(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if not self._allowed("", "configmaps", "patch", ns, name):
            return kube_status(403, "Forbidden", f'configmaps "{name}" is forbidden: cannot patch')
        if request.content_type != JSON_PATCH:
            return kube_status(415, "UnsupportedMediaType", f"expected {JSON_PATCH}, got {request.content_type}")
        cm = self.configmaps.get((ns, name))
        if cm is None:
            return kube_status(404, "NotFound", f'configmaps "{name}" not found')
        ops = await request.json()
        try:
            new = apply_json_patch(cm, ops)
            kubernetes_validate.validate({k: v for k, v in new.items() if k != "status"}, K8S_VERSION, strict=True)
        except (PatchError, kubernetes_validate.ValidationError) as exc:
            return kube_status(422, "Invalid", str(exc)[:300])
        new["metadata"]["resourceVersion"] = str(int(new["metadata"]["resourceVersion"]) + 1)
        self.configmaps[(ns, name)] = new
        self.patched.append(("ConfigMap", name, ops))
        return web.json_response(new)

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not self._allowed("", "nodes", "patch", None, name):
            return kube_status(403, "Forbidden", f'nodes "{name}" is forbidden: cannot patch')
        if request.content_type != MERGE_PATCH:
            return kube_status(415, "UnsupportedMediaType", f"expected {MERGE_PATCH}, got {request.content_type}")
        node = self.nodes.get(name)
        if node is None:
            return kube_status(404, "NotFound", f'nodes "{name}" not found')
        body = await request.json()
        new = merge_patch(node, body)
        try:
            kubernetes_validate.validate(new, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return kube_status(422, "Invalid", str(exc)[:300])
        self.nodes[name] = new
        self.patched.append(("Node", name, body))
        return web.json_response(new)
