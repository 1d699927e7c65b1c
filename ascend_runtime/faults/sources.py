"""Whether a MindCluster fault source is alive on a node: its DaemonSet pod, and the freshness of its ConfigMap.

The watcher reads faults from what the device plugin and NodeD write (``faults/signals.py``). Neither
writes "I am gone": NodeD deletes its ConfigMap when the node is healthy, so a NodeD that never ran
looks like a healthy node, and a device plugin that died leaves its last ConfigMap in place. So for
every source a topology expects (``Topology.expected_sources``) the watcher also checks, per node:

* **the DaemonSet pod**: a pod of the source's DaemonSet bound to the node (``spec.nodeName``) whose
  phase is ``Running`` and whose ``Ready`` condition is ``True``. None at all is :data:`POD_ABSENT`
  (never scheduled there, e.g. a taint it does not tolerate, or a node selector label missing); one
  that is not running and ready is :data:`POD_NOT_READY` (Pending, crash-looping). Identities, from
  MindCluster v26.1.0 (tag ``v26.1.0``, commit ``9e132e216bb7b81f4a2742a4ac6d3b50754e8a77``):

  - NodeD: DaemonSet ``noded`` in ``mindx-dl``, pod label ``app: noded``
    (``component/noded/build/noded.yaml``);
  - device plugin: DaemonSet ``ascend-device-plugin-daemonset`` in ``kube-system``, pod label
    ``name: ascend-device-plugin-ds`` (``component/ascend-device-plugin/build/ascendplugin.yaml``; the kit's
    own copy keeps name, namespace and label, ``render/objects/device_plugin.py``).

* **the device plugin's ConfigMap** ``mindx-dl-deviceinfo-<node>``: its ``DeviceInfoCfg`` JSON carries
  ``DeviceInfo.UpdateTime``, unix seconds of the write (``NodeDeviceInfo`` in
  ``component/ascend-device-plugin/pkg/common/proto.go``, set in ``getNodeDeviceInfoCache``). The plugin
  rewrites the ConfigMap when its content changes and otherwise once it is ``defaultUpdateTimeInterval``
  = 5 minutes old (``UpdateNodeDeviceInfo`` in ``pkg/device/ascendcommon.go``: ``dataSame && time.Since(
  lastUpdateTimeStamp) < defaultUpdateTimeInterval*time.Minute`` skips the write). Older than twice that
  period, :data:`STALE_AFTER_S`, is :data:`CONFIGMAP_STALE`; no ConfigMap at all where the plugin is
  expected is :data:`CONFIGMAP_ABSENT`. NodeD's ConfigMap has no such clock: it is written on change
  and deleted when healthy (``deleteHealthyCM``), so only its pod tells whether NodeD runs.

The check compares the plugin node's clock (``UpdateTime``) with the watcher's: skew of seconds is
nothing against 600 s. A failed source is no fault: nothing is drained for it (the instance stays
routable); the watcher flags the node and its instances in metrics, ``/healthz`` and an Event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ascend_runtime.faults import signals as sig

#: ``defaultUpdateTimeInterval`` (minutes) of ``pkg/device/ascendcommon.go`` at v26.1.0, in seconds.
DEVICE_INFO_REWRITE_S = 5 * 60
#: A device plugin ConfigMap whose ``UpdateTime`` is older than this (seconds) is stale: two rewrite periods.
STALE_AFTER_S = 2 * DEVICE_INFO_REWRITE_S

DEVICE_PLUGIN, NODED = "device-plugin", "noded"
#: Reasons a source is failed on a node (the ``reason`` label of ``ascend_faults_source_failed``).
POD_ABSENT, POD_NOT_READY, CONFIGMAP_ABSENT, CONFIGMAP_STALE = (
    "pod-absent", "pod-not-ready", "configmap-absent", "configmap-stale")
POD_REASONS = (POD_ABSENT, POD_NOT_READY)
CONFIGMAP_REASONS = (CONFIGMAP_ABSENT, CONFIGMAP_STALE)


@dataclass(frozen=True)
class DaemonSetSource:
    """Where a fault source's pods are: namespace, DaemonSet name, the pod label selector; and its manifest."""

    source: str
    namespace: str
    daemonset: str
    pod_labels: tuple[tuple[str, str], ...]
    manifest: str

    @property
    def selector(self) -> str:
        """The pod label selector as the API takes it (``app=noded``)."""
        return ",".join(f"{k}={v}" for k, v in self.pod_labels)


DAEMONSETS: dict[str, DaemonSetSource] = {
    NODED: DaemonSetSource(NODED, sig.NODE_INFO_NAMESPACE, "noded", (("app", "noded"),),
                           "component/noded/build/noded.yaml"),
    DEVICE_PLUGIN: DaemonSetSource(DEVICE_PLUGIN, sig.DEVICE_INFO_NAMESPACE, "ascend-device-plugin-daemonset",
                                   (("name", "ascend-device-plugin-ds"),),
                                   "component/ascend-device-plugin/build/ascendplugin.yaml"),
}


@dataclass(frozen=True)
class SourceFailure:
    """Why ``source`` is not to be trusted on a node: ``reason`` (one of the reasons above) and a detail."""

    source: str
    reason: str
    detail: str

    def describe(self) -> str:
        return f"{self.source} {self.reason} ({self.detail})"


def _ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return status.get("phase") == "Running" and ready


def pods_by_node(pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Pods of a DaemonSet by the node they are bound to (unbound pods are left out)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if isinstance(node, str) and node:
            out.setdefault(node, []).append(pod)
    return out


def pod_failure(ds: DaemonSetSource, pods: list[dict[str, Any]], node: str) -> SourceFailure | None:
    """None when one of ``pods`` (the DaemonSet's pods bound to ``node``) is running and ready."""
    where = f"{ds.namespace}/{ds.daemonset}"
    if not pods:
        return SourceFailure(ds.source, POD_ABSENT, f"no pod of DaemonSet {where} on {node}")
    if any(_ready(p) for p in pods):
        return None
    states = ", ".join(f"{(p.get('metadata') or {}).get('name', '?')} {(p.get('status') or {}).get('phase', '?')}"
                       for p in pods[:3])
    return SourceFailure(ds.source, POD_NOT_READY, f"pod of DaemonSet {where} on {node} not running and ready: {states}")


def device_info_update_time(configmap: dict[str, Any]) -> int | None:
    """``DeviceInfo.UpdateTime`` (unix seconds) of a ``mindx-dl-deviceinfo-<node>`` ConfigMap, None without one."""
    try:
        doc = json.loads((configmap.get("data") or {}).get(sig.DEVICE_INFO_KEY) or "")
        value = doc["DeviceInfo"]["UpdateTime"]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def configmap_failure(configmap: dict[str, Any] | None, node: str, now: float,
                      stale_after_s: float = STALE_AFTER_S) -> SourceFailure | None:
    """The device plugin's ConfigMap of ``node`` judged at unix time ``now``: absent, stale, or None (fresh)."""
    name = f"{sig.DEVICE_INFO_NAMESPACE}/{sig.device_info_name(node)}"
    if configmap is None:
        return SourceFailure(DEVICE_PLUGIN, CONFIGMAP_ABSENT, f"{name} does not exist: the plugin never wrote it")
    written = device_info_update_time(configmap)
    if written is None:
        return SourceFailure(DEVICE_PLUGIN, CONFIGMAP_STALE, f"{name} has no {sig.DEVICE_INFO_KEY} DeviceInfo.UpdateTime")
    age = now - written
    if age > stale_after_s:
        return SourceFailure(DEVICE_PLUGIN, CONFIGMAP_STALE,
                             f"{name} UpdateTime is {age:.0f} s old (the plugin rewrites it at least every "
                             f"{DEVICE_INFO_REWRITE_S} s; stale after {stale_after_s:.0f} s)")
    return None
