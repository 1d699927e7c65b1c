"""What the watcher needs from the Plan: nodes, which instances have a rank on each, spares, fault sources.

A spare is a node of the inventory the Plan gives no role (``NodePlan.role is
None``) and whose devices are all in service: a fault there drains nothing, and
it is where a LeaderWorkerSet group can be recreated. A node the Plan leaves
unused because devices of it are out of service (``devices_out_of_service``)
is no spare. ``expected_sources`` names the MindCluster fault sources that must
be alive on every node (``device-plugin``, ``noded``; the stack's
``kubernetes.fault_sources`` on the kubernetes target, none elsewhere): the
watcher flags a node where one is not (``faults/sources.py``). The topology is
plain data (:meth:`Topology.to_dict`) so the Kubernetes objects can hand it to
the watcher pod in a ConfigMap without the stack files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ascend_runtime.config.errors import ResourceName
from ascend_runtime.faults.signals import DEFAULT_NPU_RESOURCE
from ascend_runtime.planner.plan import Plan

_RESOURCE_NAME = TypeAdapter(ResourceName)  # the stack's kubernetes.npu_resource check


def npu_resource_of(value: object) -> str:
    """A topology file's ``npu_resource``: the device plugin's extended resource name, ``<domain>/<name>``.

    The watcher reads the device plugin's ConfigMap keys ``<resource>-Unhealthy`` and the like
    (faults/signals.py), so the value is the resource name itself, e.g. ``huawei.com/Ascend910``
    (``api.HuaweiAscend910`` in mind-cluster ``component/ascend-common/api/default_name.go``), never a
    chip number. Absent or null: that default. ValueError naming the field otherwise.
    """
    if value is None:
        return DEFAULT_NPU_RESOURCE
    if not isinstance(value, str):
        raise ValueError(f"npu_resource: must be a string, the device plugin's extended resource name such as "
                         f"'huawei.com/Ascend910' (got {type(value).__name__} {str(value)[:40]!r})")
    try:
        _RESOURCE_NAME.validate_python(value)
    except ValidationError as exc:
        raise ValueError(f"npu_resource: {value[:80]!r}: {exc.errors()[0]['msg']}; write the device plugin's "
                         "extended resource name, e.g. 'huawei.com/Ascend910' (the stack's kubernetes.npu_resource)"
                         ) from None
    return value


#: Fault source names (the watcher's ``source`` label) a topology may expect, in reading order.
EXPECTABLE_SOURCES = ("device-plugin", "noded")
#: ``node_role`` of a node the Plan leaves unused because devices of it are out of service.
OUT_OF_SERVICE = "out-of-service"


def expected_sources_of(value: object) -> tuple[str, ...]:
    """A topology file's ``sources``: a list of :data:`EXPECTABLE_SOURCES` names; absent or null: none."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v in EXPECTABLE_SOURCES for v in value):
        raise ValueError(f"sources: must be a list of {' and '.join(EXPECTABLE_SOURCES)} (the fault sources expected "
                         f"on every node), got {str(value)[:60]!r}")
    return tuple(s for s in EXPECTABLE_SOURCES if s in value)


def _device_ids(value: object, at: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 63
                                              for v in value):
        raise ValueError(f"{at}: must be a list of device ids 0..63 (got {str(value)[:60]!r})")
    return tuple(sorted(set(value)))


@dataclass(frozen=True)
class Topology:
    """``nodes``: node -> role (None: unused); ``instances``: instance -> (role, nodes in rank order);
    ``out_of_service``: node -> its device ids out of service (only nodes with any); ``expected_sources``:
    the fault sources that must be alive on every node (names of :data:`EXPECTABLE_SOURCES`)."""

    stack: str
    nodes: dict[str, str | None]
    instances: dict[str, tuple[str, tuple[str, ...]]]
    npu_resource: str = DEFAULT_NPU_RESOURCE
    expected_sources: tuple[str, ...] = ()
    out_of_service: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _by_node: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        by_node: dict[str, list[str]] = {n: [] for n in self.nodes}
        for name, (_, nodes) in sorted(self.instances.items()):
            for node in nodes:
                if node not in by_node:
                    raise ValueError(f"instance {name} has a rank on {node}, which is not a node of the topology")
                if name not in by_node[node]:
                    by_node[node].append(name)
        object.__setattr__(self, "_by_node", {n: tuple(v) for n, v in by_node.items()})

    @classmethod
    def from_plan(cls, plan: Plan) -> Topology:
        k8s = plan.config.get("kubernetes") or {}
        wanted = k8s.get("fault_sources") or {}
        expected = tuple(s for s in EXPECTABLE_SOURCES if wanted.get(s.replace("-", "_"), True)) \
            if plan.target == "kubernetes" else ()  # kind and local run no MindCluster
        return cls(
            stack=plan.stack,
            nodes={n.name: n.role for n in plan.nodes},
            instances={i.name: (i.role, i.nodes) for i in plan.instances},
            npu_resource=k8s.get("npu_resource") or DEFAULT_NPU_RESOURCE,
            expected_sources=expected,
            out_of_service={n.name: n.devices_out_of_service for n in plan.nodes if n.devices_out_of_service},
        )

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Topology:
        """The topology of a JSON document (``to_dict``'s shape); ValueError naming the first key that is wrong."""
        if not isinstance(doc, dict):
            raise ValueError(f"must be a JSON object with stack, nodes and instances (got {type(doc).__name__})")
        for key, kind in (("stack", str), ("nodes", list), ("instances", list)):
            if not isinstance(doc.get(key), kind):
                raise ValueError(f"{key}: missing or not a JSON {'string' if kind is str else 'list'}; "
                                 "write the file `ascend-deploy render` puts in the watcher's ConfigMap")
        for key in ("nodes", "instances"):
            for k, item in enumerate(doc[key]):
                if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
                    raise ValueError(f"{key}[{k}]: must be an object with a non-empty name")
                if key == "nodes" and item.get("role") not in (None, "prefill", "decode"):
                    raise ValueError(f"nodes[{k}].role: must be prefill, decode or null (got {item.get('role')!r})")
                if key == "instances" and (item.get("role") not in ("prefill", "decode")
                                           or not isinstance(item.get("nodes"), list)
                                           or not all(isinstance(n, str) for n in item["nodes"])):
                    raise ValueError(f"instances[{k}]: needs role prefill or decode and nodes, a list of node names")
        npu_resource = npu_resource_of(doc.get("npu_resource"))
        out_of_service = {str(n["name"]): _device_ids(n.get("devices_out_of_service"), f"nodes[{k}].devices_out_of_service")
                          for k, n in enumerate(doc["nodes"])}
        return cls(
            stack=str(doc["stack"]),
            nodes={str(n["name"]): n.get("role") for n in doc["nodes"]},
            instances={str(i["name"]): (str(i["role"]), tuple(i["nodes"])) for i in doc["instances"]},
            npu_resource=npu_resource,
            expected_sources=expected_sources_of(doc.get("sources")),
            out_of_service={n: ids for n, ids in out_of_service.items() if ids},
        )

    @classmethod
    def from_file(cls, path: str | Path) -> Topology:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def to_dict(self) -> dict[str, Any]:
        nodes: list[dict[str, Any]] = []
        for n, r in self.nodes.items():
            nodes.append({"name": n, "role": r})
            if self.out_of_service.get(n):
                nodes[-1]["devices_out_of_service"] = list(self.out_of_service[n])
        return {
            "stack": self.stack,
            "npu_resource": self.npu_resource,
            "sources": list(self.expected_sources),
            "nodes": nodes,
            "instances": [{"name": n, "role": r, "nodes": list(ns)} for n, (r, ns) in self.instances.items()],
        }

    def instances_on(self, node: str) -> tuple[str, ...]:
        """Instances with a rank on ``node`` (none for a spare)."""
        return self._by_node.get(node, ())

    def role(self, instance: str) -> str:
        return self.instances[instance][0]

    def nodes_of(self, instance: str) -> tuple[str, ...]:
        return self.instances[instance][1]

    @property
    def spares(self) -> tuple[str, ...]:
        """Nodes the Plan leaves unused, every device of them in service."""
        return tuple(n for n, r in self.nodes.items() if r is None and not self.out_of_service.get(n))

    def node_role(self, node: str) -> str:
        """``prefill``, ``decode``, ``spare`` or ``out-of-service`` (the metrics' ``role`` label)."""
        if self.nodes.get(node):
            return str(self.nodes[node])
        return OUT_OF_SERVICE if self.out_of_service.get(node) else "spare"
