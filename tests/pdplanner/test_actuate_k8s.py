"""The P:D planner's Kubernetes backend against an API double over real HTTP: scaling a flexible group
is a PATCH the API server accepts.

The double answers GET with the workload and PATCH as the API server does: a Content-Type that is not
a patch type is refused with 415 ("the body of the request was in an unknown format",
k8s.io/apiserver pkg/endpoints/handlers/patch.go ``PatchResource``); a merge patch is applied; a
strategic merge patch of a custom resource (LeaderWorkerSet) is refused with 415 as the API server
refuses it for CRDs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ascend_runtime.faults.kube import KubeAuth, KubeClient
from ascend_runtime.pdplanner.actuate import ActuationError
from ascend_runtime.pdplanner.actuate_k8s import KubeBackend, flexible_workloads
from ascend_runtime.planner import load_plan
from tests.pdplanner.test_k8s_objects import auto_kind

PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
               "application/strategic-merge-patch+json", "application/apply-patch+yaml")


class WorkloadApi:
    """Deployments and LeaderWorkerSets by API path: ``{path: object}``; every PATCH seen in ``patches``."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # noqa: SLF001

    async def handle(self, request: web.Request) -> web.Response:
        obj = self.objects.get(request.path)
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.method == "GET":
            return web.json_response(obj)
        if request.method != "PATCH":
            return web.json_response({"kind": "Status", "code": 405}, status=405)
        ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
        self.patches.append((request.path, ctype))
        custom = not request.path.startswith("/apis/apps/")
        if ctype not in PATCH_TYPES or (custom and ctype == "application/strategic-merge-patch+json"):
            return web.json_response({"kind": "Status", "code": 415,
                                      "message": "the body of the request was in an unknown format"}, status=415)
        patch = json.loads(await request.read())
        obj["spec"].update(patch["spec"])
        obj["status"]["readyReplicas"] = obj["spec"]["replicas"]
        return web.json_response(obj)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_scaling_a_group_is_a_patch_the_api_server_accepts(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(auto_kind(tmp_path)))
    plan = load_plan("kind")
    api = WorkloadApi()
    await api.start()
    workloads = flexible_workloads(plan)
    assert workloads and {w.kind for w in workloads} >= {"LeaderWorkerSet"}
    for w in workloads:
        api.objects[w.path("deepseek")] = {"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}
    try:
        async with aiohttp.ClientSession() as session:
            backend = KubeBackend(plan, KubeClient(KubeAuth(api.url, token="t"), session), "deepseek", poll_s=0.01)
            group = plan.flex_groups[0]
            names = list(group.shape("prefill"))
            await backend.stop(names)
            stopped = {p for p, _ in api.patches}
            assert stopped and all(api.objects[p]["spec"]["replicas"] == 0 for p in stopped)
            assert {c for _, c in api.patches} == {"application/merge-patch+json"}
            await backend.start(names, timeout_s=5.0)
            assert all(api.objects[p]["spec"]["replicas"] == 1 for p in stopped)
            # the double is strict: a PATCH sent as plain JSON is refused, and the backend says so
            status, _ = await backend.kube._request("PATCH", next(iter(stopped)), {"spec": {"replicas": 0}})  # noqa: SLF001
            assert status == 415
            monkeypatch.setattr(backend.kube, "merge_patch",
                                lambda path, body: backend.kube._request("PATCH", path, body))  # noqa: SLF001
            with pytest.raises(ActuationError, match="HTTP 415"):
                await backend.stop(names)
    finally:
        await api.stop()
