"""Where the instance list comes from: a watched file, or Kubernetes EndpointSlices.

Each source hands complete lists of :class:`InstanceSpec` to a ``apply(specs)``
callback, which syncs the pool entries owned by that source (instances that
disappear are drained: no new requests, removed once idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ascend_runtime.proxy.instances import (
    InstanceSpec,
    InstanceSpecError,
    Role,
    load_instances_file,
    normalize_url,
)

log = logging.getLogger(__name__)

ApplyFn = Callable[[list[InstanceSpec]], None]


class FileDiscovery:
    """Reads an instances file; re-reads it on :meth:`reload` (SIGHUP) or when its mtime changes.

    A file that fails to parse leaves the current instances untouched (logged).
    """

    def __init__(self, path: Path, apply: ApplyFn, poll_interval_s: float = 1.0):
        self.path = Path(path)
        self.apply = apply
        self.poll_interval_s = poll_interval_s
        self._stamp: tuple[float, int] | None = None
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None

    def _file_stamp(self) -> tuple[float, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def reload(self) -> bool:
        """Re-read the file now; return True if the instance list was applied."""
        self._stamp = self._file_stamp()
        try:
            specs = load_instances_file(self.path)
        except (OSError, ValueError, InstanceSpecError) as exc:
            self.last_error = f"{self.path}: {exc}"
            log.error("instances file not applied: %s", self.last_error)
            return False
        self.last_error = None
        self.apply(specs)
        return True

    def start(self) -> None:
        self.reload()
        if self.poll_interval_s > 0:
            self._task = asyncio.create_task(self._poll(), name="proxy-file-discovery")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval_s)
            if self._file_stamp() != self._stamp:
                self.reload()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _field(obj: Any, snake: str, camel: str | None = None) -> Any:
    """Read a field from a kubernetes model object or a raw (camelCase) dict."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        if camel is not None and camel in obj:
            return obj[camel]
        return obj.get(snake)
    return getattr(obj, snake, None)


class KubernetesDiscovery:
    """Watches ``discovery.k8s.io/v1`` EndpointSlices for prefill and decode Services.

    selectors: role -> label selector, e.g. ``{"prefill": "app=ds-prefill",
    "decode": "app=ds-decode"}``. Each ready endpoint becomes an instance named
    after its target pod (``targetRef.name``), URL ``scheme://address:port``
    with the slice port named ``port_name`` (else the first port).
    :meth:`handle_event` takes the ``{"type", "object"}`` dicts that
    ``kubernetes.watch.Watch().stream`` yields, so it is testable without a cluster.
    """

    def __init__(self, apply: ApplyFn, namespace: str, selectors: Mapping[Role, str], port_name: str = "http",
                 scheme: str = "http", api: Any = None):
        self.apply = apply
        self.namespace = namespace
        self.selectors = dict(selectors)
        self.port_name = port_name
        self.scheme = scheme
        self._api = api
        self._slices: dict[Role, dict[str, list[InstanceSpec]]] = {role: {} for role in self.selectors}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watches: list[Any] = []

    # -------------------------------------------------------------- pure event handling
    def endpoints_of(self, role: Role, slice_obj: Any) -> list[InstanceSpec]:
        """Ready endpoints of one EndpointSlice as specs; an endpoint no instance may have (an address urls.py
        refuses, a port out of range) is left out with a warning, the others are kept."""
        ports = _field(slice_obj, "ports") or []
        port = None
        for p in ports:
            if _field(p, "name") == self.port_name:
                port = _field(p, "port")
                break
        if port is None and ports:
            port = _field(ports[0], "port")
        if port is None:
            return []
        specs = []
        for ep in _field(slice_obj, "endpoints") or []:
            ready = _field(_field(ep, "conditions"), "ready")
            if ready is False:
                continue
            addresses = _field(ep, "addresses") or []
            if not addresses:
                continue
            address = addresses[0]
            host = f"[{address}]" if ":" in address else address
            target = _field(ep, "target_ref", "targetRef")
            name = _field(target, "name") or f"{role}-{address}:{port}"
            try:
                specs.append(InstanceSpec(name=name, role=role, url=normalize_url(f"{self.scheme}://{host}:{port}")))
            except InstanceSpecError as exc:
                log.warning("EndpointSlice %s: endpoint %s left out: %s",
                            _field(_field(slice_obj, "metadata"), "name"), name, exc)
        return specs

    def handle_event(self, role: Role, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; return True if the instance list changed."""
        kind = event.get("type")
        obj = event.get("object")
        name = _field(_field(obj, "metadata"), "name")
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not name:
            return False
        with self._lock:
            slices = self._slices.setdefault(role, {})
            before = slices.get(name)
            if kind == "DELETED":
                slices.pop(name, None)
            else:
                slices[name] = self.endpoints_of(role, obj)
            changed = slices.get(name) != before
        return changed

    def specs(self) -> list[InstanceSpec]:
        """Current instance list over all slices (deduplicated by name)."""
        with self._lock:
            out: dict[str, InstanceSpec] = {}
            for slices in self._slices.values():
                for specs in slices.values():
                    for spec in specs:
                        out.setdefault(spec.name, spec)
            return list(out.values())

    # -------------------------------------------------------------- watching a cluster
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start one watch thread per role; changes are applied on ``loop``."""
        if self._api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._api = client.DiscoveryV1Api()
        for role, selector in self.selectors.items():
            t = threading.Thread(target=self._watch, args=(role, selector, loop), daemon=True,
                                 name=f"proxy-k8s-{role}")
            t.start()
            self._threads.append(t)

    def _watch(self, role: Role, selector: str, loop: asyncio.AbstractEventLoop) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            w = watch.Watch()
            self._watches.append(w)
            try:
                for event in w.stream(self._api.list_namespaced_endpoint_slice, namespace=self.namespace,
                                      label_selector=selector, timeout_seconds=60):
                    if self._stop.is_set():
                        break
                    if self.handle_event(role, event):
                        loop.call_soon_threadsafe(self.apply, self.specs())
            except Exception as exc:  # noqa: BLE001 - keep watching through API hiccups
                log.warning("EndpointSlice watch (%s) failed: %s; retrying", role, exc)
                self._stop.wait(2.0)

    def stop(self) -> None:
        self._stop.set()
        for w in self._watches:
            with contextlib.suppress(Exception):
                w.stop()
