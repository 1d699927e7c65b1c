"""The fault signals MindCluster v26.1.0 puts into the Kubernetes API, and how to read them.

Every name below is MindCluster's (tag ``v26.1.0``, commit
``9e132e216bb7b81f4a2742a4ac6d3b50754e8a77``, the release the kit's device plugin
manifest pins: ``ascend_runtime/render/objects/device_plugin.py``), except the Node
``Ready`` condition, which is Kubernetes' own.

1. **Ascend Device Plugin, per node**: ConfigMap ``mindx-dl-deviceinfo-<node>`` in
   ``kube-system``.
   ``component/ascend-device-plugin/pkg/common/constants.go`` (``DeviceInfoCMNamePrefix``),
   ``pkg/kubeclient/kubeclient.go`` (``DeviceInfoName``) and
   ``pkg/kubeclient/client_server.go`` (``WriteDeviceInfoDataIntoCM``: namespace ``api.KubeNS``
   = ``kube-system`` from ``component/ascend-common/api/consts.go``). Its data key
   ``DeviceInfoCfg`` (``api.DeviceInfoCMDataKey``) holds the JSON of ``NodeDeviceInfoCache``
   (``pkg/common/proto.go``): ``{"DeviceInfo": {"DeviceList": {...}, "UpdateTime": <unix s>},
   "SuperPodID": .., "ServerIndex": .., "CheckCode": ..}``. ``DeviceList`` keys are the
   device resource name plus a suffix (``GetAscend910Key`` in ``pkg/common/device.go``;
   suffixes in ``component/ascend-common/api/consts.go``), values comma-separated chip
   names (``Ascend910-<physical id>``):

   * ``<resource>-Unhealthy`` (``CmCardUnhealthySuffix``): chips whose fault level is not
     NotHandleFault/SubHealthFault/NormalNPU (``AscendTools.isHealthy`` in
     ``pkg/device/ascendcommon.go``): RestartRequest, RestartBusiness, RestartNPU,
     FreeRestartNPU, SeparateNPU, ManuallySeparateNPU, idle PreSeparateNPU;
   * ``<resource>-NetworkUnhealthy`` (``CmCardNetworkUnhealthySuffix``): chips whose RoCE /
     UBoE link is faulty (``isNetworkHealthy``; link-down code ``0x81078603``);
   * ``<resource>-Recovering`` (``CmRecoveringSuffix``): chips being reset;
   * ``<resource>-Fault`` (``CmFaultListSuffix``): JSON list of ``DeviceFault``
     (``fault_type``, ``npu_name``, ``fault_level``, ``fault_handling``, ``fault_code``, ...),
     used here for the message only.

   ``<resource>`` is ``huawei.com/Ascend910`` for Atlas A2 and A3 (``api.HuaweiAscend910`` in
   ``component/ascend-common/api/default_name.go``); a device plugin built with
   ``deviceNameCustomization.json`` renames it, which is what the stack's
   ``kubernetes.npu_resource`` says. On A3 the same ConfigMap also carries ``SwitchInfoCfg``
   (``api.SwitchInfoCMDataKey``, ``SwitchFaultInfo`` in ``proto.go``: the UnifiedBus switch
   faults) whose ``NodeStatus`` is ``UnHealthy`` for Separate/RestartRequest faults, and
   ``ManuallySeparateNPU`` (``DeviceInfoCMManuallySeparateNPUKey``): chips an escalation
   isolated. Documented in ``docs/en/scheduling/api/ascend_device_plugin.md``. The plugin
   checks the devices every ``-listWatchPeriod`` seconds (default 5, range 3-1800, ``main.go``) and
   rewrites the ConfigMap when its content changed, otherwise once the last write is 5 minutes old
   (``defaultUpdateTimeInterval``, ``pkg/device/ascendcommon.go``); faults are read from the content, and
   ``UpdateTime`` tells whether the plugin still writes (``faults/sources.py``).

2. **NodeD, per node**: ConfigMap ``mindx-dl-nodeinfo-<node>`` in ``mindx-dl``
   (``component/noded/pkg/common/constants.go`` ``NodeInfoCMNamePrefix``;
   ``pkg/reporter/cmreporter/configmap_reporter.go``: namespace ``api.DLNamespace`` =
   ``mindx-dl``, data key ``NodeInfo`` = ``api.NodeInfoCMDataKey``, plus ``updateTime``
   RFC 3339). ``NodeInfo`` holds ``{"NodeInfo": {"FaultDevList": [...], "NodeStatus":
   "Healthy"|"PreSeparate"|"UnHealthy"}, "CheckCode": ..}`` (``NodeInfoCM`` in
   ``pkg/common/type.go``). NodeD **deletes** the ConfigMap when the node is healthy
   (``deleteHealthyCM``), so "not found" means healthy. ``UnHealthy`` (a SeparateFault)
   drains; ``PreSeparate`` does not ("if a job exists on this node, the fault is ignored",
   ``docs/en/scheduling/api/noded.md``).

3. **Kubernetes**: the Node's ``Ready`` condition not ``True`` (kubelet stopped reporting,
   the node controller sets ``Unknown``), or the Node object gone.

Not read: ClusterD's ``cluster-info-device-<n>`` / ``cluster-info-node-cm`` /
``cluster-info-switch-<n>`` (namespace ``mindx-dl``, ``component/clusterd/pkg/common/
constant/configmap.go`` and ``pkg/application/resource/report.go``) aggregate the same
per-node ConfigMaps cluster-wide, later and only where ClusterD is installed; the device
plugin's Events (``doWriteFaultToEvent`` in ``ascendcommon.go``, involved object: the
plugin's own pod) repeat what the ConfigMap says. The ``CheckCode`` fields are not
verified: a ConfigMap update is atomic, and refusing a ConfigMap whose hash this code
computes differently from Go's ``json.Marshal`` would hide a real fault.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: MindCluster v26.1.0, the release whose names this module reads.
MINDCLUSTER_RELEASE = "v26.1.0"
DEVICE_INFO_PREFIX = "mindx-dl-deviceinfo-"
DEVICE_INFO_NAMESPACE = "kube-system"
DEVICE_INFO_KEY = "DeviceInfoCfg"
SWITCH_INFO_KEY = "SwitchInfoCfg"
MANUALLY_SEPARATE_KEY = "ManuallySeparateNPU"
UNHEALTHY_SUFFIX = "-Unhealthy"
NETWORK_UNHEALTHY_SUFFIX = "-NetworkUnhealthy"
RECOVERING_SUFFIX = "-Recovering"
FAULT_LIST_SUFFIX = "-Fault"
NODE_INFO_PREFIX = "mindx-dl-nodeinfo-"
NODE_INFO_NAMESPACE = "mindx-dl"
#: Where Events about a Node go. A Node is cluster-scoped, so its Events carry no involved-object
#: namespace, and the API server accepts such an Event (no ``eventTime``, as these are) only in
#: namespace ``""`` / ``default`` (Kubernetes ``legacyValidateEvent``, pkg/apis/core/validation/events.go;
#: the kubelet posts its Node Events there too). Any other namespace is refused with 422.
NODE_EVENT_NAMESPACE = "default"
NODE_INFO_KEY = "NodeInfo"
NODED_UNHEALTHY = "UnHealthy"
NODED_PRESEPARATE = "PreSeparate"
SWITCH_UNHEALTHY = "UnHealthy"
DEFAULT_NPU_RESOURCE = "huawei.com/Ascend910"

#: Signal kinds (the ``kind`` label of the metrics and the words of Event messages).
NPU, LINK, RESETTING, SEPARATED, SWITCH, NODE_HARDWARE, NOT_READY, NODE_GONE = (
    "npu", "link", "npu-resetting", "npu-separated", "switch", "node-hardware", "node-not-ready", "node-gone")


def device_info_name(node: str) -> str:
    """``mindx-dl-deviceinfo-<node>`` (the device plugin's ConfigMap of ``node``)."""
    return DEVICE_INFO_PREFIX + node


def node_info_name(node: str) -> str:
    """``mindx-dl-nodeinfo-<node>`` (NodeD's ConfigMap of ``node``)."""
    return NODE_INFO_PREFIX + node


class SignalFormatError(ValueError):
    """An object is there but does not have the documented shape (treated as a read error)."""


@dataclass(frozen=True)
class Signal:
    """One reason a node is faulty: what (``kind``), where it was read (``source``), details."""

    kind: str
    source: str
    detail: str

    def describe(self) -> str:
        return f"{self.kind} ({self.source}: {self.detail})"


def _names(value: Any) -> list[str]:
    if not isinstance(value, str):
        return []
    return sorted({v.strip() for v in value.split(",") if v.strip()})


def _json(text: Any, what: str) -> Any:
    if not isinstance(text, str):
        raise SignalFormatError(f"{what} is missing or not a string")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SignalFormatError(f"{what} is not JSON: {exc}") from None


def _fault_codes(device_list: dict[str, Any], resource: str, chips: list[str]) -> str:
    """``Ascend910-3: 0x80E01801 (SeparateNPU)`` per chip named in the ``-Fault`` list (best effort)."""
    raw = device_list.get(resource + FAULT_LIST_SUFFIX)
    try:
        faults = json.loads(raw) if isinstance(raw, str) and raw else []
    except ValueError:
        return ""
    out = []
    for f in faults if isinstance(faults, list) else []:
        if isinstance(f, dict) and f.get("npu_name") in chips:
            handling = f.get("fault_handling") or f.get("fault_level") or "?"
            out.append(f"{f.get('npu_name')}: {f.get('fault_code') or '?'} ({handling})")
    return "; ".join(sorted(set(out)))


def device_plugin_signals(configmap: dict[str, Any] | None, resource: str = DEFAULT_NPU_RESOURCE) -> list[Signal]:
    """Faults in a ``mindx-dl-deviceinfo-<node>`` ConfigMap (None: not there, i.e. no plugin on the node)."""
    if configmap is None:
        return []
    name = configmap.get("metadata", {}).get("name", "deviceinfo")
    data = configmap.get("data") or {}
    source = f"{DEVICE_INFO_NAMESPACE}/{name}"
    doc = _json(data.get(DEVICE_INFO_KEY), f"{source} {DEVICE_INFO_KEY}")
    try:
        device_list = doc["DeviceInfo"]["DeviceList"]
    except (KeyError, TypeError):
        raise SignalFormatError(f"{source} {DEVICE_INFO_KEY} has no DeviceInfo.DeviceList") from None
    if not isinstance(device_list, dict):
        raise SignalFormatError(f"{source} DeviceInfo.DeviceList is not a mapping")
    out = []
    for suffix, kind in ((UNHEALTHY_SUFFIX, NPU), (NETWORK_UNHEALTHY_SUFFIX, LINK), (RECOVERING_SUFFIX, RESETTING)):
        key = resource + suffix
        chips = _names(device_list.get(key))
        if chips:
            codes = _fault_codes(device_list, resource, chips)
            out.append(Signal(kind, source, f"{key}={','.join(chips)}" + (f" [{codes}]" if codes else "")))
    separated = _names(data.get(MANUALLY_SEPARATE_KEY))
    if separated:
        out.append(Signal(SEPARATED, source, f"{MANUALLY_SEPARATE_KEY}={','.join(separated)}"))
    if data.get(SWITCH_INFO_KEY):
        switch = _json(data[SWITCH_INFO_KEY], f"{source} {SWITCH_INFO_KEY}")
        if isinstance(switch, dict) and switch.get("NodeStatus") == SWITCH_UNHEALTHY:
            codes = ",".join(str(c) for c in (switch.get("FaultCode") or [])[:4])
            out.append(Signal(SWITCH, source, f"{SWITCH_INFO_KEY}.NodeStatus={SWITCH_UNHEALTHY} "
                                              f"FaultLevel={switch.get('FaultLevel')} FaultCode=[{codes}]"))
    return out


def noded_signals(configmap: dict[str, Any] | None) -> tuple[list[Signal], str]:
    """(faults, NodeStatus) of a ``mindx-dl-nodeinfo-<node>`` ConfigMap; None (deleted) is ``Healthy``."""
    if configmap is None:
        return [], "Healthy"
    name = configmap.get("metadata", {}).get("name", "nodeinfo")
    source = f"{NODE_INFO_NAMESPACE}/{name}"
    doc = _json((configmap.get("data") or {}).get(NODE_INFO_KEY), f"{source} {NODE_INFO_KEY}")
    try:
        info = doc["NodeInfo"]
        status = str(info["NodeStatus"])
    except (KeyError, TypeError):
        raise SignalFormatError(f"{source} {NODE_INFO_KEY} has no NodeInfo.NodeStatus") from None
    if status != NODED_UNHEALTHY:
        return [], status
    devs = []
    for dev in info.get("FaultDevList") or []:
        if isinstance(dev, dict):
            devs.append(f"{dev.get('DeviceType')}{dev.get('DeviceId')}:{','.join(dev.get('FaultCode') or [])}"
                        f"({dev.get('FaultLevel')})")
    return [Signal(NODE_HARDWARE, source, f"NodeStatus={status}" + (f" [{'; '.join(devs)}]" if devs else ""))], status


def node_signals(node: dict[str, Any] | None, name: str) -> list[Signal]:
    """Kubernetes' own: the Node object gone, or its ``Ready`` condition not ``True``."""
    source = f"node/{name}"
    if node is None:
        return [Signal(NODE_GONE, source, "the Node object does not exist")]
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            if cond.get("status") == "True":
                return []
            return [Signal(NOT_READY, source, f"Ready={cond.get('status')} ({cond.get('reason') or 'no reason'})")]
    return []
