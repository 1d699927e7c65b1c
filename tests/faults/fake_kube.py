"""FakeKubernetesApi: a test double of the Kubernetes API server for the fault watcher, on 127.0.0.1.

It serves exactly what the watcher calls, over real HTTP:

* ``GET /api/v1/nodes/{name}``;
* ``GET /api/v1/namespaces/{ns}/configmaps/{name}``, holding the MindCluster v26.1.0 fault
  ConfigMaps in the shape their writers produce (:meth:`set_device_info` mirrors the device
  plugin's ``WriteDeviceInfoDataIntoCM``, ``pkg/kubeclient/client_server.go``; :meth:`set_node_info`
  NodeD's ``ConfigMapReporter.constructNodeInfoCM``, which deletes the ConfigMap when healthy);
* ``GET /apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=...``;
* ``GET /api/v1/namespaces/{ns}/pods?labelSelector=k=v[,k=v]``: the fault sources' DaemonSet pods
  (:meth:`set_source_pod`, in the shape the DaemonSet controller gives them: ``spec.nodeName``, phase and
  ``Ready`` condition);
* ``POST /api/v1/namespaces/{ns}/events``: every Event is validated as a core/v1 Event with
  kubernetes-validate (422 if it is not one), must pass the API server's namespace rule for Events
  (422, :func:`event_namespace_problem`), must have a new name (409), and is kept in :attr:`events`.

Every call needs ``Authorization: Bearer <token>`` (401). With :meth:`restrict` it answers 403
to whatever the given RBAC rules do not allow, the way the API server's RBAC authorizer treats
``resourceNames`` (get by name; list/create only without names).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kubernetes_validate
from aiohttp import web

from ascend_runtime.faults import signals
from tests.kube_api_double import kube_status, serve_on_loopback

K8S_VERSION = "1.30"



def event_namespace_problem(event: dict[str, Any], ns: str) -> str | None:
    """The API server's namespace rule for core/v1 Events (Kubernetes ``legacyValidateEvent``,
    pkg/apis/core/validation/events.go, as in 1.30): without ``eventTime``, an Event whose
    ``involvedObject`` has no namespace (a Node: cluster-scoped) must be in namespace ``""`` or
    ``default``, otherwise the two namespaces must be equal; with ``eventTime``, such an Event must be
    in ``default`` or ``kube-system``."""
    involved = (event.get("involvedObject") or {}).get("namespace") or ""
    event_ns = (event.get("metadata") or {}).get("namespace") or ns
    allowed = ("", "default") if not event.get("eventTime") else ("default", "kube-system")
    if not involved and event_ns not in allowed:
        return f'involvedObject.namespace: Invalid value: "": does not match event.namespace ({event_ns!r})'
    if involved and not event.get("eventTime") and involved != event_ns:
        return f'involvedObject.namespace: Invalid value: "{involved}": does not match event.namespace'
    return None

@dataclass
class Rule:
    """One RBAC rule, as in a Role: api group, resource, verbs, names (empty: any)."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    names: tuple[str, ...] = ()
    namespace: str | None = None  # None: cluster-wide (a ClusterRoleBinding); else a RoleBinding's namespace


@dataclass(repr=False)
class FakeKubernetesApi:
    """The API server double; ``url`` once :meth:`start` ran."""

    token: str = "fake-service-account-token"
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    configmaps: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    endpointslices: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (namespace, name) -> Pod
    events: list[dict[str, Any]] = field(default_factory=list)
    rejected_events: list[tuple[int, str]] = field(default_factory=list)
    requests: list[tuple[str, str, int]] = field(default_factory=list)
    denied: list[tuple[str, str]] = field(default_factory=list)
    rules: list[Rule] | None = None
    #: Paths answered 500 (an API server in trouble).
    failing: set[str] = field(default_factory=set)
    #: Called with the request path before each GET is answered (tests look at the proxies then).
    observers: list[Callable[[str], None]] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    def __repr__(self) -> str:
        return (f"FakeKubernetesApi({self.url}, {len(self.nodes)} nodes, {len(self.configmaps)} configmaps, "
                f"{len(self.events)} events, {len(self.requests)} requests)")

    # ---- server -------------------------------------------------------------------------
    async def start(self) -> str:
        app = web.Application(middlewares=[self._middleware])
        self.add_routes(app)
        self._runner, self.url = await serve_on_loopback(app)
        return self.url

    def add_routes(self, app: web.Application) -> None:
        """The routes this double answers."""
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_get("/api/v1/namespaces/{ns}/configmaps/{name}", self._get_configmap)
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._list_slices)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._list_pods)
        app.router.add_post("/api/v1/namespaces/{ns}/events", self._create_event)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            resp: web.StreamResponse = kube_status(401, "Unauthorized", "Unauthorized")
        elif request.path in self.failing:
            resp = kube_status(500, "InternalError", "etcdserver: request timed out")
        else:
            if request.method == "GET":
                for observe in self.observers:
                    observe(request.path)
            resp = await handler(request)
        self.requests.append((request.method, request.path, resp.status))
        return resp

    def restrict(self, rules: list[Rule]) -> None:
        """Answer 403 to every call these rules do not allow."""
        self.rules = rules

    def bind(self, cluster_role_rules: list[dict[str, Any]], role_rules: list[dict[str, Any]], namespace: str,
             other_roles: tuple[tuple[list[dict[str, Any]], str], ...] = ()) -> None:
        """Restrict to a ClusterRole bound cluster-wide plus a Role bound in ``namespace`` (RBAC rule dicts),
        and the Roles of ``other_roles`` (rules, namespace)."""
        out = []
        for rules, ns in ((cluster_role_rules, None), (role_rules, namespace), *other_roles):
            for r in rules:
                for group in r["apiGroups"]:
                    for res in r["resources"]:
                        out.append(Rule(group, res, tuple(r["verbs"]), tuple(r.get("resourceNames") or ()), ns))
        self.restrict(out)

    def _allowed(self, group: str, resource: str, verb: str, namespace: str | None, name: str | None) -> bool:
        if self.rules is None:
            return True
        for r in self.rules:
            if r.group != group or r.resource != resource or verb not in r.verbs:
                continue
            if r.namespace is not None and r.namespace != namespace:
                continue
            if r.names and (name is None or name not in r.names):
                continue  # resourceNames never match a list or a create
            return True
        self.denied.append((verb, f"{resource} {namespace}/{name}"))
        return False

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if not self._allowed("", "nodes", "get", None, name):
            return kube_status(403, "Forbidden", f'nodes "{name}" is forbidden')
        node = self.nodes.get(name)
        return web.json_response(node) if node else kube_status(404, "NotFound", f'nodes "{name}" not found')

    async def _get_configmap(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        if not self._allowed("", "configmaps", "get", ns, name):
            return kube_status(403, "Forbidden", f'configmaps "{name}" is forbidden')
        cm = self.configmaps.get((ns, name))
        return web.json_response(cm) if cm else kube_status(404, "NotFound", f'configmaps "{name}" not found')

    async def _list_slices(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        if not self._allowed("discovery.k8s.io", "endpointslices", "list", ns, None):
            return kube_status(403, "Forbidden", "endpointslices is forbidden")
        selector = request.query.get("labelSelector", "")
        key, _, service = selector.partition("=")
        assert key == "kubernetes.io/service-name", selector
        return web.json_response({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                  "items": self.endpointslices.get((ns, service), [])})

    async def _list_pods(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        if not self._allowed("", "pods", "list", ns, None):
            return kube_status(403, "Forbidden", f'pods is forbidden: cannot list resource "pods" in namespace "{ns}"')
        wanted = dict(kv.split("=", 1) for kv in request.query.get("labelSelector", "").split(",") if kv)
        items = [p for (pns, _), p in sorted(self.pods.items()) if pns == ns
                 and wanted.items() <= (p["metadata"].get("labels") or {}).items()]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "items": items})

    async def _create_event(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        if not self._allowed("", "events", "create", ns, None):
            return kube_status(403, "Forbidden", "events is forbidden")
        event = await request.json()
        try:
            kubernetes_validate.validate(event, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.rejected_events.append((422, str(exc)))
            return kube_status(422, "Invalid", f"not a v1 Event: {exc}")
        problem = event_namespace_problem(event, ns)
        if problem:
            self.rejected_events.append((422, problem))
            return kube_status(422, "Invalid", problem)
        if event["metadata"].get("namespace") not in (None, ns):
            self.rejected_events.append((400, "namespace mismatch"))
            return kube_status(400, "BadRequest", "the namespace of the provided object does not match")
        if any(e["metadata"]["name"] == event["metadata"]["name"] for e in self.events):
            self.rejected_events.append((409, event["metadata"]["name"]))
            return kube_status(409, "AlreadyExists", f'events "{event["metadata"]["name"]}" already exists')
        self.events.append(event)
        return web.json_response(event, status=201)

    # ---- state ---------------------------------------------------------------------------
    def add_node(self, name: str) -> None:
        self.nodes[name] = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": hashlib.md5(name.encode()).hexdigest()},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
        }
        self.set_device_info(name)

    def set_ready(self, name: str, status: str, reason: str = "NodeStatusUnknown") -> None:
        self.nodes[name]["status"]["conditions"] = [{"type": "Ready", "status": status, "reason": reason}]

    def set_source_pod(self, source: str, node: str, phase: str | None = "Running", ready: bool = True) -> None:
        """The pod of fault source ``source``'s DaemonSet (faults/sources.py ``DAEMONSETS``) on ``node``; ``phase``
        None deletes it."""
        from ascend_runtime.faults.sources import DAEMONSETS  # noqa: PLC0415

        ds = DAEMONSETS[source]
        name = f"{ds.daemonset}-{hashlib.md5(node.encode()).hexdigest()[:5]}"
        if phase is None:
            self.pods.pop((ds.namespace, name), None)
            return
        self.pods[(ds.namespace, name)] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ds.namespace, "labels": dict(ds.pod_labels)},
            "spec": {"nodeName": node, "containers": [{"name": ds.source, "image": f"{ds.source}:v26.1.0"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    def set_device_info(self, node: str, unhealthy: tuple[str, ...] = (), network_unhealthy: tuple[str, ...] = (),
                        recovering: tuple[str, ...] = (), faults: list[dict[str, Any]] | None = None,
                        resource: str = signals.DEFAULT_NPU_RESOURCE, chips: int = 8,
                        update_time: int | None = None) -> None:
        """The device plugin's ConfigMap of ``node`` with these chips unhealthy (Atlas A2 layout), written at unix
        time ``update_time`` (default now)."""
        names = [f"Ascend910-{i}" for i in range(chips)]
        device_list = {
            resource: ",".join(n for n in names if n not in unhealthy),
            resource + signals.UNHEALTHY_SUFFIX: ",".join(unhealthy),
            resource + signals.NETWORK_UNHEALTHY_SUFFIX: ",".join(network_unhealthy),
            resource + signals.RECOVERING_SUFFIX: ",".join(recovering),
            resource + signals.FAULT_LIST_SUFFIX: json.dumps(faults or [], separators=(",", ":")),
        }
        info = {"DeviceList": device_list, "UpdateTime": int(time.time()) if update_time is None else update_time}
        check = hashlib.sha256(json.dumps(info, separators=(",", ":"), sort_keys=True).encode()).hexdigest()
        cache = {"DeviceInfo": info, "SuperPodID": -2, "ServerIndex": -2, "CheckCode": check}
        self.configmaps[(signals.DEVICE_INFO_NAMESPACE, signals.device_info_name(node))] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": signals.device_info_name(node), "namespace": signals.DEVICE_INFO_NAMESPACE,
                         "labels": {"mx-consumer-cim": "true"}},
            "data": {signals.DEVICE_INFO_KEY: json.dumps(cache, separators=(",", ":")),
                     signals.MANUALLY_SEPARATE_KEY: "", "UpgradeFaultReason": "{}",
                     "Description": "The field[xxx.com/xxx] is sunset."},
        }

    def set_node_info(self, node: str, status: str, fault_devs: list[dict[str, Any]] | None = None) -> None:
        """NodeD's ConfigMap of ``node``; ``Healthy`` with no faults deletes it, as NodeD does."""
        key = (signals.NODE_INFO_NAMESPACE, signals.node_info_name(node))
        if status == "Healthy" and not fault_devs:
            self.configmaps.pop(key, None)
            return
        info = {"FaultDevList": fault_devs or [], "NodeStatus": status}
        check = hashlib.sha256(json.dumps(info, separators=(",", ":")).encode()).hexdigest()
        self.configmaps[key] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": key[1], "namespace": key[0], "labels": {"mx-consumer-cim": "true"}},
            "data": {signals.NODE_INFO_KEY: json.dumps({"NodeInfo": info, "CheckCode": check}, separators=(",", ":")),
                     "updateTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
        }

    def gets_of(self, path: str) -> int:
        """How many GETs of ``path`` were answered."""
        return sum(1 for m, p, _ in self.requests if m == "GET" and p == path)

    def events_with(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["reason"] == reason]
