"""The Plan: the validated deployment model every output derives from.

Plain frozen dataclasses, free of Pulumi, network and clock. ``Plan.to_json``
is deterministic: the same stack and inventory give byte-identical output.

Vocabulary:
- an *instance* is one vLLM-Ascend engine (one API endpoint) of a role;
- a *rank* is one engine process of an instance, on one node, driving that
  node's share of the instance's NPUs (``dp_local`` DP ranks of ``tp`` NPUs);
  rank 0 is the leader and serves the API, the others run ``--headless``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ascend_runtime.config.inventory import Inventory
    from ascend_runtime.planner.hccl_buffer import HcclBuffer
    from ascend_runtime.planner.proxy_sizing import ProxyPlan


@dataclass(frozen=True)
class PlannedDevice:
    """One NPU device as a rank uses it; ``global_rank`` is dense within its instance.

    ``device_ip`` is the RoCE port IP (``hccn_tool -ip -g``, what hccl.json and
    hccn.conf carry); ``vnic_ip`` is the A3 VNIC IP (``hccn_tool -vnic -g``, only
    the LLMDataDist PD rank table uses it), None on A2.
    """

    device_id: int
    device_ip: str
    global_rank: int
    super_device_id: int | None = None
    super_pod_id: int | None = None
    vnic_ip: str | None = None


@dataclass(frozen=True)
class RankPlan:
    """One engine process: where it runs and which devices and ports it owns."""

    instance: str
    role: str
    index: int
    node: str
    host_ip: str
    nic: str
    devices: tuple[PlannedDevice, ...]
    dp_start_rank: int
    dp_local: int
    kv_port: int
    kv_port_count: int
    engine_id: str
    #: The API port of each of this node group's DP ranks, in rank order (``serving: rank`` only; empty
    #: otherwise): ``ports.api_base + instance ordinal + local DP rank x instance count`` (planner/__init__.py).
    api_ports: tuple[int, ...] = ()

    @property
    def is_leader(self) -> bool:
        """Rank 0 serves the API; the others are headless (``serving: instance``)."""
        return self.index == 0

    @property
    def dp_ranks(self) -> range:
        """The DP ranks this node group runs (global numbering, 0 .. dp - 1)."""
        return range(self.dp_start_rank, self.dp_start_rank + self.dp_local)

    @property
    def device_ids(self) -> tuple[int, ...]:
        """Logical device ids, the value of ASCEND_RT_VISIBLE_DEVICES."""
        return tuple(d.device_id for d in self.devices)

    @property
    def kv_listen_ports(self) -> range:
        """Ports this rank's KV connector listens on.

        Mooncake's handshake port of a worker is kv_port + data_parallel_rank * tp + tp_rank
        (vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py ``side_channel_port``, v0.23.0;
        distributed/mooncake_connector.py, v0.11.0): every rank of an instance shares ``kv_port`` and
        listens on its own block.
        """
        tp = len(self.devices) // self.dp_local
        start = self.kv_port + self.dp_start_rank * tp
        return range(start, start + len(self.devices))

    @property
    def name(self) -> str:
        """``<instance>-rank<k>``, used for files and workload names."""
        return f"{self.instance}-rank{self.index}"


@dataclass(frozen=True)
class MemoryEstimate:
    """HBM use per NPU, GiB."""

    weights_gib: float
    kv_cache_gib: float
    reserve_gib: float
    budget_gib: float
    hbm_gib: float

    @property
    def total_gib(self) -> float:
        """Weights + KV cache + reserve."""
        return round(self.weights_gib + self.kv_cache_gib + self.reserve_gib, 2)


@dataclass(frozen=True)
class ApiEndpoint:
    """One OpenAI API server the proxy routes to: a whole instance (``serving: instance``; its leader's
    server, vLLM's internal DP load balancer picks the rank) or one DP rank of it (``serving: rank``;
    ``--data-parallel-rank``, vLLM's external load-balancer mode)."""

    name: str  #: the instance's name, or ``<instance>-dp<rank>``
    instance: str
    role: str
    host: str
    port: int
    dp_rank: int | None  #: None: the whole instance

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def rank_endpoint_name(instance: str, dp_rank: int) -> str:
    """The routable name of one DP rank's API server, ``<instance>-dp<rank>``."""
    return f"{instance}-dp{dp_rank}"


@dataclass(frozen=True)
class InstancePlan:
    """One engine instance: shape, ports, placement and memory."""

    name: str
    role: str
    ordinal: int
    dp: int
    tp: int
    ep: int
    npus: int
    expert_slots_per_rank: int
    redundant_experts: int
    api_host: str
    api_port: int
    dp_rpc_port: int
    llmdd_rpc_port: int
    super_pod_id: int | None
    memory: MemoryEstimate
    ranks: tuple[RankPlan, ...]
    serving: str = "instance"  #: ``instance`` or ``rank`` (the stack's ``serving``)

    @property
    def api_url(self) -> str:
        """The leader's OpenAI endpoint (in rank mode, DP rank 0's)."""
        return f"http://{self.api_host}:{self.api_port}"

    @property
    def api_endpoints(self) -> tuple[ApiEndpoint, ...]:
        """What the proxy routes to for this instance: its leader's server, or one server per DP rank."""
        if self.serving != "rank":
            return (ApiEndpoint(self.name, self.name, self.role, self.api_host, self.api_port, None),)
        return tuple(ApiEndpoint(rank_endpoint_name(self.name, dp_rank), self.name, self.role, r.host_ip, port, dp_rank)
                     for r in self.ranks for dp_rank, port in zip(r.dp_ranks, r.api_ports, strict=True))

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names in rank order."""
        return tuple(r.node for r in self.ranks)

    @property
    def kv_ports(self) -> str:
        """``first-last`` of the ports the instance's KV connector listens on, over all its ranks."""
        ports = [r.kv_listen_ports for r in self.ranks]
        return f"{min(p.start for p in ports)}-{max(p.stop for p in ports) - 1}"


@dataclass(frozen=True)
class NodePlan:
    """A node of the inventory and the role the Plan gives it (None: unused).

    ``device_count``: devices the inventory lists; ``devices_out_of_service``: their device ids the
    inventory takes out of service (never placed; ``planner/service.py``), in the JSON only when any;
    ``spare_for``: on a spare (unused, every device in service), what it is kept for, ``prefill``,
    ``decode`` or ``shared`` (``planner/spares.py``), in the JSON only on spares.
    """

    name: str
    host_ip: str
    nic: str
    device_count: int
    super_pod_id: int | None
    role: str | None
    devices_used: int
    devices_out_of_service: tuple[int, ...] = ()
    spare_for: str | None = None


@dataclass(frozen=True)
class FlexGroup:
    """A node group that serves either stage (``pd_ratio.mode: auto``): both shapes are planned on its
    nodes, one runs. ``prefill`` / ``decode``: instance names of each shape; ``initial``: the role it starts in."""

    name: str
    nodes: tuple[str, ...]
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    initial: str

    def shape(self, role: str) -> tuple[str, ...]:
        """Instance names of the ``role`` shape."""
        return self.prefill if role == "prefill" else self.decode


@dataclass(frozen=True)
class Plan:
    """The whole deployment. ``config`` is the validated stack config as JSON data;
    ``secret_keys`` names the secrets the stack declares (never their values)."""

    stack: str
    hardware: str
    target: str
    kv_connector: str
    vllm_ascend_version: str
    config: dict[str, Any]
    nodes: tuple[NodePlan, ...]
    instances: tuple[InstancePlan, ...]
    proxy_host: str
    proxy_port: int
    secret_keys: tuple[str, ...] = field(default_factory=tuple)
    engine_image: str = ""  # engine.image, else the release's image for the hardware (-a3 on cm384)
    #: Flexible node groups (``pd_ratio.mode: auto``); ``instances`` holds the shape each starts in,
    #: ``standby`` the other shape's instances (planned, not started).
    flex_groups: tuple[FlexGroup, ...] = field(default_factory=tuple)
    standby: tuple[InstancePlan, ...] = field(default_factory=tuple)
    #: The inventory the Plan was placed on (devices of every node, spares included), for re-placing an
    #: instance onto a spare (planner/spares.py); not part of the Plan's JSON.
    source_inventory: "Inventory | None" = field(default=None, compare=False, repr=False)

    def by_role(self, role: str) -> tuple[InstancePlan, ...]:
        """Instances of one role in ordinal order."""
        return tuple(i for i in self.instances if i.role == role)

    def instance(self, name: str) -> InstancePlan:
        """Look an instance up by name; KeyError if absent."""
        for inst in (*self.instances, *self.standby):
            if inst.name == name:
                return inst
        raise KeyError(name)

    @property
    def all_instances(self) -> tuple[InstancePlan, ...]:
        """Every planned instance: the running shapes, then the flexible groups' standby shapes."""
        return (*self.instances, *self.standby)

    def flex_group_of(self, instance: str) -> FlexGroup | None:
        """The flexible group an instance belongs to (either shape), or None for a fixed instance."""
        return next((g for g in self.flex_groups if instance in g.prefill or instance in g.decode), None)

    @property
    def ranks(self) -> tuple[RankPlan, ...]:
        """Every rank of every instance, prefill first."""
        return tuple(r for i in self.instances for r in i.ranks)

    def endpoints(self) -> list[dict[str, str]]:
        """What the proxy routes to: name, role and API URL of every instance (``serving: instance``), or of
        every DP rank with the instance it belongs to (``serving: rank``: ``instance`` key; draining the
        instance drains all of them)."""
        out: list[dict[str, str]] = []
        for inst in self.instances:
            for ep in inst.api_endpoints:
                entry = {"name": ep.name, "role": ep.role, "url": ep.url}
                if ep.dp_rank is not None:
                    entry["instance"] = ep.instance
                out.append(entry)
        return out

    @property
    def proxy_url(self) -> str:
        """The proxy's OpenAI endpoint."""
        return f"http://{self.proxy_host}:{self.proxy_port}"

    @property
    def proxy(self) -> "ProxyPlan":
        """PD proxy workers and replicas sized from the expected token rate (planner/proxy_sizing.py)."""
        from ascend_runtime.planner.proxy_sizing import size_proxy

        return size_proxy(self)

    @property
    def hccl_buffers(self) -> "dict[str, HcclBuffer]":
        """HCCL_BUFFSIZE of each stage (MB) and the MC2 window it holds, by role (planner/hccl_buffer.py)."""
        from ascend_runtime.planner.hccl_buffer import stage_buffers

        return stage_buffers(self.config)

    def to_dict(self) -> dict[str, Any]:
        """The Plan as JSON-ready data (with derived fields such as api_url)."""
        data = asdict(dataclasses.replace(self, source_inventory=None))
        del data["source_inventory"]
        for inst, raw in [*zip(self.instances, data["instances"]), *zip(self.standby, data["standby"])]:
            raw["api_url"] = inst.api_url
            raw["memory"]["total_gib"] = inst.memory.total_gib
            if inst.serving == "instance":  # the Plan's JSON is what it was before rank serving existed
                del raw["serving"]
            for rank, raw_rank in zip(inst.ranks, raw["ranks"]):
                raw_rank["name"] = rank.name
                raw_rank["is_leader"] = rank.is_leader
                if not rank.api_ports:
                    del raw_rank["api_ports"]
        for raw in data["nodes"]:  # a node with every device in service: its JSON is what it was before the key
            if not raw["devices_out_of_service"]:
                del raw["devices_out_of_service"]
            if raw["spare_for"] is None:
                del raw["spare_for"]
        if data["config"].get("serving") == "instance":  # the default: the JSON is what it was before the key
            del data["config"]["serving"]
        if not self.flex_groups:  # fixed P:D: the Plan's JSON is what it was before flexible groups existed
            del data["flex_groups"], data["standby"]
        data["proxy_url"] = self.proxy_url
        return data

    def to_json(self) -> str:
        """Deterministic JSON (sorted keys, 2-space indent, trailing newline)."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2) + "\n"
