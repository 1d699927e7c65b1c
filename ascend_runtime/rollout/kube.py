"""Replace one engine instance on Kubernetes: patch its workload's image, wait for its group to be ready.

An instance's workloads are the ones :func:`ascend_runtime.render.objects.build_system`
gives it (the objects ``pulumi up`` registers): one LeaderWorkerSet (a multi-node
instance), or one Deployment per rank (single-node, LLMDataDist). Each is changed with
one JSON patch through the ``kubernetes`` client:

* ``test`` of ``/metadata/resourceVersion`` (a concurrent writer makes the patch fail, then it
  is read and tried again once);
* ``replace`` of the ``engine`` container's ``image`` in every pod template (a LeaderWorkerSet's
  leader and worker templates; a Deployment's template);
* the pod template annotation ``ascend-deepseek/restartedAt`` (UTC time), so the group is
  replaced even when the image is unchanged (a rolling restart, like ``kubectl rollout restart``).
  A LeaderWorkerSet's revision is its whole ``leaderWorkerTemplate``, metadata included
  (``getPatch`` in pkg/utils/revision/revision_utils.go, lws v0.10.0), so either change rolls
  its group (``rolloutStrategy`` ``maxUnavailable: 1``, ``maxSurge: 0``: the old group goes, the
  new one starts on the same nodes).

The same driver recreates an instance elsewhere for the fault watcher (``faults/spares_kube.py``): there the
patch of each object is another (:data:`Patcher`), and the instance's ConfigMaps are patched too.

Ready (:func:`group_ready`): the controller has observed the new generation
(``status.observedGeneration``, in both the LeaderWorkerSet v0.10.0 status and apps/v1), and
every replica is updated and ready (LeaderWorkerSet: ``updatedReplicas`` = ``readyReplicas`` =
``replicas`` = ``spec.replicas`` and no ``UpdateInProgress`` condition true; Deployment:
``updatedReplicas`` = ``availableReplicas`` = ``replicas`` = ``spec.replicas``, so no old pod is left).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ascend_runtime.config.runtime_image import simulator_image
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects.engine import api_service_name
from ascend_runtime.render.objects.lws import RELEASE as LWS_RELEASE
from ascend_runtime.rollout.jsonpatch import Op, escape
from ascend_runtime.rollout.order import Target
from ascend_runtime.rollout.steps import ReplaceError

ENGINE_CONTAINER = "engine"
RESTARTED_AT = "ascend-deepseek/restartedAt"
JSON_PATCH = "application/json-patch+json"
LWS_GROUP, _, LWS_VERSION = LWS_RELEASE.api_version.partition("/")
LWS_PLURAL = "leaderworkersets"
#: Pod template paths of each workload kind (JSON pointers).
TEMPLATES = {
    "LeaderWorkerSet": ("/spec/leaderWorkerTemplate/leaderTemplate", "/spec/leaderWorkerTemplate/workerTemplate"),
    "Deployment": ("/spec/template",),
}
#: Kinds the driver patches besides workloads (no pod template, nothing to wait for).
CONFIG_KINDS = ("ConfigMap",)


@dataclass(frozen=True)
class Workload:
    """One Kubernetes workload of an engine instance."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def target_image(plan: Plan) -> str:
    """The image the stack file names for its engines: ``engine.image`` (or the release's), the simulator's on kind."""
    return simulator_image(plan.config) if plan.target == "kind" else plan.engine_image


def instance_workloads(objects_by_instance: dict[str, list[dict[str, Any]]]) -> dict[str, list[Workload]]:
    """Instance -> its LeaderWorkerSet or Deployments, from ``build_system(plan).engines``."""
    return {name: [Workload(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs
                   if o["kind"] in TEMPLATES]
            for name, objs in objects_by_instance.items()}


def _pointer(obj: dict[str, Any], path: str) -> Any:
    node: Any = obj
    for part in path.strip("/").split("/"):
        node = node[part]
    return node


def image_patch(obj: dict[str, Any], kind: str, image: str, stamp: str) -> list[dict[str, Any]]:
    """The JSON patch setting ``image`` on the engine container of every pod template of ``obj``."""
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                  "value": obj["metadata"]["resourceVersion"]}]
    for path in TEMPLATES[kind]:
        try:
            template = _pointer(obj, path)
            containers = template["spec"]["containers"]
        except (KeyError, TypeError):
            raise ReplaceError(f"{kind} {obj['metadata'].get('name')}: no pod template at {path}") from None
        index = next((i for i, c in enumerate(containers) if c.get("name") == ENGINE_CONTAINER), None)
        if index is None:
            raise ReplaceError(f"{kind} {obj['metadata'].get('name')}: no container {ENGINE_CONTAINER!r} at {path}")
        ops.append({"op": "replace", "path": f"{path}/spec/containers/{index}/image", "value": image})
        meta = template.get("metadata") or {}
        if "metadata" not in template:
            ops.append({"op": "add", "path": f"{path}/metadata", "value": {"annotations": {RESTARTED_AT: stamp}}})
        elif "annotations" not in meta or meta["annotations"] is None:
            ops.append({"op": "add", "path": f"{path}/metadata/annotations", "value": {RESTARTED_AT: stamp}})
        else:
            ops.append({"op": "add", "path": f"{path}/metadata/annotations/{escape(RESTARTED_AT)}", "value": stamp})
    return ops


#: Builds the JSON patch of one object: (the object as read, its workload, a UTC time stamp) -> ops.
Patcher = Callable[[dict[str, Any], Workload, str], list[Op]]


def image_patcher(image: str) -> Patcher:
    """The rollout's patch: :func:`image_patch` to ``image``."""
    return lambda obj, w, stamp: image_patch(obj, w.kind, image, stamp)


def group_ready(obj: dict[str, Any], kind: str) -> tuple[bool, str]:
    """(ready, progress text) of a workload as its controller reports it (see the module doc); a ConfigMap
    is ready once written."""
    if kind in CONFIG_KINDS:
        return True, "data written"
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    want = int(spec.get("replicas", 1))
    observed = int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0)
    updated, replicas = int(status.get("updatedReplicas") or 0), int(status.get("replicas") or 0)
    if kind == "LeaderWorkerSet":
        ready = int(status.get("readyReplicas") or 0)
        rolling = any(c.get("type") == "UpdateInProgress" and c.get("status") == "True"
                      for c in status.get("conditions") or [])
        done = observed and not rolling and updated == ready == replicas == want
        return done, f"groups ready {ready}/{want}, updated {updated}/{want}" + (", updating" if rolling else "")
    available = int(status.get("availableReplicas") or 0)
    done = observed and updated == available == replicas == want
    return done, f"pods available {available}/{want}, updated {updated}/{want}, total {replicas}"


class KubeWorkloads:
    """GET and JSON-PATCH of LeaderWorkerSets, Deployments and ConfigMaps through a ``kubernetes.client.ApiClient``
    (blocking); ``field_manager`` names the writer in ``managedFields``."""

    def __init__(self, api_client: Any, timeout_s: float = 10.0, field_manager: str = "ascend-deploy-rollout") -> None:
        from kubernetes import client  # noqa: PLC0415 - only the Kubernetes path needs it

        self.apps = client.AppsV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.timeout_s, self.field_manager = timeout_s, field_manager

    def get(self, w: Workload) -> dict[str, Any]:
        if w.kind == "ConfigMap":
            resp = self.core.read_namespaced_config_map(w.name, w.namespace, _preload_content=False,
                                                        _request_timeout=self.timeout_s)
        elif w.kind == "LeaderWorkerSet":
            resp = self.custom.get_namespaced_custom_object(LWS_GROUP, LWS_VERSION, w.namespace, LWS_PLURAL, w.name,
                                                            _preload_content=False, _request_timeout=self.timeout_s)
        else:
            resp = self.apps.read_namespaced_deployment(w.name, w.namespace, _preload_content=False,
                                                        _request_timeout=self.timeout_s)
        return json.loads(resp.data)

    def patch(self, w: Workload, ops: list[dict[str, Any]]) -> dict[str, Any]:
        call = dict(field_manager=self.field_manager, _content_type=JSON_PATCH, _preload_content=False,
                    _request_timeout=self.timeout_s)
        if w.kind == "ConfigMap":
            resp = self.core.patch_namespaced_config_map(w.name, w.namespace, ops, **call)
        elif w.kind == "LeaderWorkerSet":
            resp = self.custom.patch_namespaced_custom_object(LWS_GROUP, LWS_VERSION, w.namespace, LWS_PLURAL, w.name,
                                                              ops, **call)
        else:
            resp = self.apps.patch_namespaced_deployment(w.name, w.namespace, ops, **call)
        return json.loads(resp.data)


def _api_message(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", None) or getattr(exc, "data", None) or ""
    try:
        body = json.loads(body).get("message", body)
    except (ValueError, TypeError, AttributeError):
        pass
    return f"HTTP {status}: {str(body)[:200]}" if status else f"{type(exc).__name__}: {exc}"


class KubeDriver:
    """Patches an instance's objects, in the order given, and waits (``ready_timeout_s``) for their groups.

    The patch is the rollout's image change (``image``) unless ``patcher`` builds another; ``what`` says
    what it does for :meth:`describe`.
    """

    kind = "kubernetes"

    def __init__(self, api: KubeWorkloads, workloads: dict[str, list[Workload]], image: str = "",
                 ready_timeout_s: float = 1800.0, poll_s: float = 2.0, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, patcher: Patcher | None = None, what: str = "") -> None:
        self.api, self.workloads, self.image = api, workloads, image
        self.patcher = patcher or image_patcher(image)
        self.what = what or f"(container {ENGINE_CONTAINER}) to image {image}"
        self.ready_timeout_s, self.poll_s, self.say, self.clock = ready_timeout_s, poll_s, say, clock

    def describe(self, target: Target) -> str:
        names = ", ".join(str(w) for w in self.workloads.get(target.name, [])) or "no workload"
        return f"patch {names} {self.what}, wait until ready"

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args)
        except Exception as exc:  # noqa: BLE001 - ApiException, urllib3 and socket errors alike
            raise ReplaceError(_api_message(exc)) from None

    async def _patch(self, w: Workload, stamp: str) -> None:
        for attempt in (1, 2):
            obj = await self._call(self.api.get, w)
            ops = self.patcher(obj, w, stamp)
            if len(ops) <= 1:  # only the resourceVersion test: nothing changes
                return
            try:
                await asyncio.to_thread(self.api.patch, w, ops)
                return
            except Exception as exc:  # noqa: BLE001
                if getattr(exc, "status", None) == 422 and attempt == 1:
                    continue  # resourceVersion moved between read and patch: read again
                raise ReplaceError(f"patch {w}: {_api_message(exc)}") from None

    async def replace(self, target: Target) -> str:
        workloads = self.workloads.get(target.name) or []
        if not workloads:
            raise ReplaceError(f"{target.name}: no LeaderWorkerSet or Deployment in the stack's objects")
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for w in workloads:
            await self._patch(w, stamp)
        start = self.clock()
        last = ""
        while True:
            states = [(w, *group_ready(await self._call(self.api.get, w), w.kind)) for w in workloads]
            text = "; ".join(f"{w}: {detail}" for w, _, detail in states)
            if all(ok for _, ok, _ in states):
                done = f"image {self.image}" if self.image else self.what
                return f"{text} ({done}, {self.clock() - start:.1f} s)"
            if self.clock() - start >= self.ready_timeout_s:
                raise ReplaceError(f"not ready after {self.ready_timeout_s:g} s (--ready-timeout-s): {text}")
            if self.say is not None and text != last:
                self.say(f"    {text}")
                last = text
            await asyncio.sleep(self.poll_s)


def api_client(kube_api: str | None, token: str | None, context: str | None) -> Any:
    """A ``kubernetes.client.ApiClient``: ``kube_api`` + bearer ``token``, else the pod's service account,
    else the kubeconfig (``context``). Raises the loader's errors."""
    from kubernetes import client, config  # noqa: PLC0415

    cfg = client.Configuration()
    if kube_api:
        cfg.host = kube_api.rstrip("/")
        if token:
            cfg.api_key = {"BearerToken": token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            config.load_kube_config(context=context, client_configuration=cfg)
    return client.ApiClient(cfg)


def kube_targets(plan: Plan, in_cluster_urls: bool, namespace: str) -> list[tuple[str, str, int, str]]:
    """(name, role, ordinal, url) of the Plan's instances; the URL is the leader's node address (host
    network) or, ``in_cluster_urls``, its ``<inst>-api`` Service."""
    return [(i.name, i.role, i.ordinal,
             f"http://{api_service_name(i)}.{namespace}.svc:{i.api_port}" if in_cluster_urls else i.api_url)
            for i in plan.instances]


def missing_workloads(workloads: dict[str, list[Workload]], names: Iterable[str]) -> list[str]:
    """Instances among ``names`` without a workload (a kit bug if it ever happens)."""
    return [n for n in names if not workloads.get(n)]
