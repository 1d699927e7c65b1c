"""Rank tables rendered from the Plan (facts file, section 3).

Tables, by name (file ``<name>.json`` under :data:`~ascend_runtime.render.paths.RANKTABLE_DIR`):

- ``hccl-<instance>`` (e.g. ``hccl-prefill-0``): the MindCluster ``hccl.json`` of one
  instance, v1.0 on Atlas A2, v1.2 on A3 / CM384 (``super_device_id`` per device and
  ``super_pod_list``). ``rank_id`` is the device's dense global rank inside the instance,
  in node order; ``server_id`` is the host IP of the node where that rank's pod runs.
- ``pd-llmdatadist`` (LLMDataDist connector only): the vLLM-Ascend PD table of
  ``examples/disaggregated_prefill_v1/gen_ranktable.py``: ``prefill_device_list`` then
  ``decode_device_list``, ``cluster_id`` running 1..N across both lists, prefill first;
  on A3 each entry also carries ``super_pod_id`` and ``super_device_id``.
- ``global``: a grouped table in the MindIE / omni-infer shape: ``server_group_list`` with
  group 0 the proxy, 1 prefill, 2 decode. ``rank_id`` is dense over the whole table
  (prefill devices first), so it is unique per table as well as per group.

Which device address each table's ``device_ip`` holds (facts section 3):

- ``hccl-<instance>`` (v1.0 and v1.2) and ``global``: the RoCE port IP
  (``PlannedDevice.device_ip``, ``hccn_tool -i N -ip -g``) on A2 and A3, the address
  HCCL connects to and ``/etc/hccn.conf`` ``address_N`` sets.
- ``pd-llmdatadist``: on A3 the VNIC IP (``PlannedDevice.vnic_ip``, ``hccn_tool -i N
  -vnic -g``), on A2 the RoCE port IP, as vllm-ascend v0.11.0
  ``examples/disaggregated_prefill_v1/gen_ranktable.py`` does (lines 82-95: ``-vnic -g``
  when ``soc_info == AscendSocVersion.A3``, else ``-ip -g``). An A3 device without a
  ``vnic_ip`` is an error, never a silent fallback to the RoCE address.

All values are strings, as HCCL reads them. Every function is pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner.plan import InstancePlan, Plan, PlannedDevice, RankPlan

PD_TABLE = "pd-llmdatadist"
GLOBAL_TABLE = "global"
PD_TABLE_VERSION = "1.2"  # gen_ranktable.py writes "1.2" on A2 and A3 alike

#: JSON Schema file (under ascend_runtime/render/schemas/) of each kind of table.
SCHEMAS = {
    "1.0": "hccl-ranktable-v1.0.schema.json",
    "1.2": "hccl-ranktable-v1.2.schema.json",
    PD_TABLE: "pd-llmdatadist.schema.json",
    GLOBAL_TABLE: "global-ranktable.schema.json",
}


def instance_table_name(instance: str) -> str:
    """``hccl-<instance>``."""
    return f"hccl-{instance}"


def _super_pods(plan: Plan) -> bool:
    return hardware_spec(plan.hardware).has_super_pods


def _hccl_device(dev: PlannedDevice, super_pods: bool) -> dict[str, str]:
    entry = {"device_id": str(dev.device_id), "device_ip": dev.device_ip}  # RoCE port IP, also on A3
    if super_pods:
        entry["super_device_id"] = str(dev.super_device_id)
    entry["rank_id"] = str(dev.global_rank)
    return entry


def instance_table(plan: Plan, inst: InstancePlan) -> dict[str, Any]:
    """HCCL rank table (v1.0 or v1.2 by hardware) of one instance."""
    spec = hardware_spec(plan.hardware)
    super_pods = spec.has_super_pods
    servers = [
        {
            "server_id": rank.host_ip,
            "host_ip": rank.host_ip,
            "container_ip": rank.host_ip,  # engine pods run with hostNetwork
            "hardware_type": spec.server_hardware_type,
            "device": [_hccl_device(d, super_pods) for d in rank.devices],
        }
        for rank in inst.ranks
    ]
    table: dict[str, Any] = {
        "version": spec.rank_table_version,
        "status": "completed",
        "server_count": str(len(servers)),
        "server_list": servers,
    }
    if super_pods:
        table["super_pod_list"] = _super_pod_list(inst.ranks)
    return table


def _super_pod_list(ranks: Iterable[RankPlan]) -> list[dict[str, Any]]:
    pods: dict[int, list[str]] = {}
    for rank in ranks:
        for pod in sorted({d.super_pod_id for d in rank.devices if d.super_pod_id is not None}):
            servers = pods.setdefault(pod, [])
            if rank.host_ip not in servers:
                servers.append(rank.host_ip)
    return [
        {"super_pod_id": str(pod), "server_list": [{"server_id": ip} for ip in servers]}
        for pod, servers in sorted(pods.items())
    ]


def pd_device_ip(plan: Plan, dev: PlannedDevice) -> str:
    """The address the PD table lists for a device: the VNIC IP on A3, the RoCE port IP on A2 (gen_ranktable.py)."""
    if not _super_pods(plan):
        return dev.device_ip
    if dev.vnic_ip is None:
        raise ValueError(
            f"device {dev.device_id} (global rank {dev.global_rank}) has no vnic_ip: the LLMDataDist PD table on "
            f"{plan.hardware} lists the VNIC IP (hccn_tool -vnic -g), not the RoCE device_ip; run the facts playbook"
        )
    return dev.vnic_ip


def pd_table(plan: Plan) -> dict[str, Any]:
    """The LLMDataDist PD rank table (``gen_ranktable.py`` format; ``device_ip`` per :func:`pd_device_ip`)."""
    super_pods = _super_pods(plan)
    cluster_id = 0
    lists: dict[str, list[dict[str, str]]] = {"prefill": [], "decode": []}
    for role in ("prefill", "decode"):
        for inst in plan.by_role(role):
            for rank in inst.ranks:
                for dev in rank.devices:
                    cluster_id += 1
                    entry = {"server_id": rank.host_ip, "device_id": str(dev.device_id),
                             "device_ip": pd_device_ip(plan, dev)}
                    if super_pods:
                        entry["super_pod_id"] = str(dev.super_pod_id)
                        entry["super_device_id"] = str(dev.super_device_id)
                    entry["cluster_id"] = str(cluster_id)
                    lists[role].append(entry)
    servers = {r.host_ip for r in plan.ranks}
    return {
        "version": PD_TABLE_VERSION,
        "server_count": str(len(servers)),
        "status": "completed",
        "prefill_device_list": lists["prefill"],
        "decode_device_list": lists["decode"],
    }


def global_table(plan: Plan) -> dict[str, Any]:
    """Grouped table: group 0 the proxy, 1 prefill, 2 decode; one server entry per node."""
    super_pods = _super_pods(plan)
    groups: list[dict[str, Any]] = [
        {
            "group_id": "0",
            "server_count": "1",
            "server_list": [{"server_id": plan.proxy_host, "server_ip": plan.proxy_host, "device": []}],
        }
    ]
    next_rank = 0
    for group_id, role in (("1", "prefill"), ("2", "decode")):
        servers: dict[str, dict[str, Any]] = {}
        for inst in plan.by_role(role):
            for rank in inst.ranks:
                server = servers.setdefault(
                    rank.node, {"server_id": rank.host_ip, "server_ip": rank.host_ip, "device": []}
                )
                for dev in rank.devices:
                    entry = {"device_id": str(dev.device_id), "device_ip": dev.device_ip}  # RoCE port IP
                    if super_pods:
                        entry["super_device_id"] = str(dev.super_device_id)
                    entry["rank_id"] = str(next_rank)
                    next_rank += 1
                    server["device"].append(entry)
        groups.append({"group_id": group_id, "server_count": str(len(servers)), "server_list": list(servers.values())})
    return {"version": "1.0", "status": "completed", "server_group_list": groups}


def rank_tables(plan: Plan) -> dict[str, dict[str, Any]]:
    """Every rank table of the Plan, by name (instances in Plan order, then PD, then global)."""
    tables = {instance_table_name(inst.name): instance_table(plan, inst) for inst in plan.instances}
    if plan.kv_connector == "llmdatadist":
        tables[PD_TABLE] = pd_table(plan)
    tables[GLOBAL_TABLE] = global_table(plan)
    return tables


def ranktables_for_rank(plan: Plan, rank: RankPlan) -> list[str]:
    """Names of the tables a rank's engine reads, so its pod mounts them: only LLMDataDist reads one.

    vLLM-Ascend reads no HCCL rank table: the LLMDataDist connector (0.11) reads the PD table named by
    DISAGGREGATED_PREFILL_RANK_TABLE_PATH (vllm_ascend/distributed/llmdatadist_c_mgr_connector.py, v0.11.0);
    Mooncake reads none. The instance tables (hccl.json) are rendered for MindCluster / MindIE, which read them.
    """
    return [PD_TABLE] if plan.kv_connector == "llmdatadist" else []


def schema_name(plan: Plan, table: str) -> str:
    """File name of the JSON Schema a table validates against."""
    if table in (PD_TABLE, GLOBAL_TABLE):
        return SCHEMAS[table]
    return SCHEMAS[hardware_spec(plan.hardware).rank_table_version]
