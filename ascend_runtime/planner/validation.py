"""Checks of a stack against its inventory and hardware, before any placement.

Each function returns a list of :class:`Problem`; the planner raises them all
at once so an operator fixes everything in one pass. One check needs the placed
Plan: :func:`require_engine_resources` (the engine pods' CPU and memory fit), run by
``ascend-deploy plan`` and by ``render`` / ``pulumi`` (``render/objects/``), the same
message from each.
"""

from __future__ import annotations

import math
from collections import Counter

from ascend_runtime.config.errors import ConfigError, Problem, is_dns_label
from ascend_runtime.config.inventory import Inventory
from ascend_runtime.config.stack import Role, StackConfig
from ascend_runtime.hardware import HardwareSpec
from ascend_runtime.planner.memory import estimate_memory
from ascend_runtime.planner.plan import Plan
from ascend_runtime.planner.pod_resources import resource_problems

ROLES: tuple[Role, Role] = ("prefill", "decode")

#: Ports no range of the Plan may cover: engines run with hostNetwork, so they share the node's ports
#: with the cluster's own daemons, and a NodePort Service would take the port on every node.
RESERVED_PORTS: tuple[tuple[int, int, str], ...] = (
    (2379, 2380, "etcd client and peer ports"),
    (6443, 6443, "the Kubernetes API server port"),
    (10248, 10250, "kubelet healthz and API ports (10248, 10250) and kube-proxy metrics (10249)"),
    (10255, 10257, "kubelet read-only port (10255), kube-proxy healthz (10256) and kube-controller-manager (10257)"),
    (10259, 10259, "the kube-scheduler port"),
    (30000, 32767, "the NodePort range"),
)
#: Suffixes the Pulumi program appends to an instance name (render/objects/engine.py) besides -rank<k>.
INSTANCE_NAME_SUFFIXES = ("-ranktable", "-launch", "-api")


def devices_per_node(config: StackConfig, role: Role, hardware: HardwareSpec) -> int:
    """NPUs an instance of ``role`` uses on each of its nodes."""
    return config.stage(role).devices_per_node or hardware.devices_per_node


def check_inventory(inventory: Inventory, hardware: HardwareSpec) -> list[Problem]:
    """Device counts per hardware kind, unique names/IPs, super pod facts on A3."""
    problems: list[Problem] = []
    if not inventory.nodes:
        return [Problem("inventory.nodes", "the inventory lists no nodes", hint="run the facts playbook or add nodes")]
    names: dict[str, int] = {}
    host_ips: dict[str, int] = {}
    device_ips: dict[str, str] = {}
    super_devices: dict[tuple[int, int], str] = {}
    for i, node in enumerate(inventory.nodes):
        at = f"inventory.nodes[{i}]"
        if node.name in names:
            problems.append(Problem(f"{at}.name", f"node name listed twice (also nodes[{names[node.name]}])", node.name))
        names.setdefault(node.name, i)
        ip = str(node.host_ip)
        if ip in host_ips:
            problems.append(
                Problem(f"{at}.host_ip", f"host IP listed twice (also nodes[{host_ips[ip]}])", ip, "each node needs its own host IP")
            )
        host_ips.setdefault(ip, i)
        count = len(node.devices)
        if count != hardware.devices_per_node:
            problems.append(
                Problem(
                    f"{at}.devices",
                    f"node {node.name} lists {count} devices; {hardware.display_name} nodes have {hardware.devices_per_node}",
                    count,
                    "re-run the facts playbook or fix the hardware kind; keep a broken NPU listed and name its "
                    "device_id in the node's devices_out_of_service",
                )
            )
        listed = {d.device_id for d in node.devices}
        problems += [
            Problem(f"{at}.devices_out_of_service[{k}]", f"node {node.name} lists no device {dev_id} under devices "
                    f"(its device ids: {', '.join(map(str, sorted(listed))) or 'none'})", dev_id,
                    "name the device_id of a listed device, or remove the entry")
            for k, dev_id in enumerate(node.devices_out_of_service) if dev_id not in listed
        ]
        seen_ids: set[int] = set()
        for j, dev in enumerate(node.devices):
            dat = f"{at}.devices[{j}]"
            if dev.device_id in seen_ids or dev.device_id >= hardware.devices_per_node:
                problems.append(
                    Problem(
                        f"{dat}.device_id",
                        f"device id duplicated or out of range 0..{hardware.devices_per_node - 1} on {node.name}",
                        dev.device_id,
                    )
                )
            seen_ids.add(dev.device_id)
            dip = str(dev.device_ip)
            if dip in device_ips:
                problems.append(
                    Problem(f"{dat}.device_ip", f"device IP listed twice (also {device_ips[dip]})", dip, "every NPU needs its own IP")
                )
            device_ips.setdefault(dip, f"{node.name} device {dev.device_id}")
            if hardware.has_super_pods:
                if dev.super_pod_id is None or dev.super_device_id is None:
                    problems.append(
                        Problem(dat, "A3 devices need super_pod_id and super_device_id", hint="run the facts playbook")
                    )
                else:
                    key = (dev.super_pod_id, dev.super_device_id)
                    if key in super_devices:
                        problems.append(
                            Problem(
                                f"{dat}.super_device_id",
                                f"super_device_id listed twice in super pod {dev.super_pod_id} (also {super_devices[key]})",
                                dev.super_device_id,
                            )
                        )
                    super_devices.setdefault(key, f"{node.name} device {dev.device_id}")
        if hardware.has_super_pods:
            pods = Counter(d.super_pod_id for d in node.devices if d.super_pod_id is not None)
            if len(pods) > 1:  # the pod most of the node's devices name is taken for right; the others are named
                common, count = max(pods.items(), key=lambda kv: kv[1])
                problems += [Problem(f"{at}.devices[{j}].super_pod_id",
                                     f"node {node.name} has devices in several super pods ({count} of its "
                                     f"{sum(pods.values())} devices are in super pod {common})", d.super_pod_id,
                                     "a server is in one super pod: re-run the facts playbook")
                             for j, d in enumerate(node.devices) if d.super_pod_id not in (None, common)]
    return problems


def check_stage_shapes(config: StackConfig, hardware: HardwareSpec, connector: str) -> list[Problem]:
    """DP x TP = NPUs, TP fits a node, EP divides the expert slots, batch sizes, HBM fit."""
    problems: list[Problem] = []
    model = config.model
    for role in ROLES:
        stage = config.stage(role)
        per_node = devices_per_node(config, role, hardware)
        npus = stage.nodes_per_instance * per_node
        if per_node > hardware.devices_per_node:
            problems.append(
                Problem(
                    f"{role}.devices_per_node",
                    f"{hardware.display_name} nodes have {hardware.devices_per_node} devices",
                    per_node,
                )
            )
        if stage.dp * stage.tp != npus:
            problems.append(
                Problem(
                    f"{role}.dp",
                    f"dp x tp = {stage.dp} x {stage.tp} = {stage.dp * stage.tp} must equal the instance's NPUs, "
                    f"nodes_per_instance x devices_per_node = {stage.nodes_per_instance} x {per_node} = {npus}",
                    stage.dp,
                    f"for tp={stage.tp} set dp to {npus // stage.tp}" if npus % stage.tp == 0 else "change tp or the node count",
                )
            )
        if per_node % stage.tp:
            problems.append(
                Problem(f"{role}.tp", f"tp must divide the {per_node} NPUs an instance uses per node", stage.tp)
            )
        elif model.num_attention_heads % stage.tp:
            problems.append(
                Problem(f"{role}.tp", f"tp must divide model.num_attention_heads ({model.num_attention_heads})", stage.tp,
                        "use a power of two up to the NPUs per node")
            )
        slots = model.num_routed_experts + stage.redundant_experts
        if stage.ep not in (1, stage.dp * stage.tp):
            problems.append(
                Problem(
                    f"{role}.ep",
                    f"expert parallelism spans all dp x tp = {stage.dp * stage.tp} NPUs of the instance",
                    stage.ep,
                    f"set ep to {stage.dp * stage.tp} (or 1 to disable)",
                )
            )
        elif slots % stage.ep:
            fix = math.ceil(slots / stage.ep) * stage.ep - model.num_routed_experts
            problems.append(
                Problem(
                    f"{role}.ep",
                    f"ep must divide the {slots} expert slots ({model.num_routed_experts} experts + "
                    f"{stage.redundant_experts} redundant)",
                    stage.ep,
                    f"set redundant_experts to {fix}",
                )
            )
        shape_ok = not any(p.path.startswith(role + ".") for p in problems)
        if stage.max_num_batched_tokens < stage.max_num_seqs:
            problems.append(
                Problem(
                    f"{role}.max_num_batched_tokens",
                    "must be at least max_num_seqs",
                    stage.max_num_batched_tokens,
                    f"set it to {stage.max_num_seqs} or more",
                )
            )
        if stage.context_len > model.max_model_len:
            problems.append(
                Problem(f"{role}.context_len", f"exceeds model.max_model_len {model.max_model_len}", stage.context_len)
            )
        if shape_ok:
            mem = estimate_memory(model, stage, hardware)
            if mem.total_gib > mem.budget_gib:
                per_seq = mem.kv_cache_gib / stage.max_num_seqs
                room = mem.budget_gib - mem.weights_gib - mem.reserve_gib
                fit = max(int(room / per_seq), 0) if per_seq else 0
                # the field to blame: the sequences when some fit; else the reserve when the weights alone fit
                blamed, value = (f"{role}.max_num_seqs", stage.max_num_seqs)
                if not fit and mem.weights_gib <= mem.budget_gib:
                    blamed, value = f"{role}.reserve_gib", stage.reserve_gib
                problems.append(
                    Problem(
                        blamed,
                        f"HBM overflow: weights {mem.weights_gib} GiB + KV cache {mem.kv_cache_gib} GiB + "
                        f"reserve {mem.reserve_gib} GiB = {mem.total_gib} GiB per NPU > budget {mem.budget_gib} GiB "
                        f"({mem.hbm_gib} GiB x gpu_memory_utilization {stage.gpu_memory_utilization})",
                        value,
                        f"at most {fit} sequences fit at context_len {stage.context_len}; or raise ep / lower context_len"
                        if fit
                        else f"lower {role}.reserve_gib: the weights take {mem.weights_gib} of the {mem.budget_gib} GiB "
                        f"budget, and the reserve and the KV cache of {stage.max_num_seqs} sequences share the rest"
                        if blamed.endswith("reserve_gib")
                        else "the weights alone do not fit: raise ep or tp (or check the model shape)",
                    )
                )
    if connector == "mooncake" and config.prefill.tp < config.decode.tp:
        problems.append(
            Problem(
                "decode.tp",
                f"Mooncake needs prefill tp >= decode tp (prefill tp is {config.prefill.tp})",
                config.decode.tp,
                f"set decode.tp to {config.prefill.tp} or less",
            )
        )
    return problems


def instance_names(config: StackConfig) -> list[str]:
    """The longest Kubernetes names derived from each role's instances: ``<role>-<i>`` and its -rank<k>,
    -ranktable, -launch and -api, for the last instance and rank (the longest of each form)."""
    names = []
    for role in ROLES:
        stage = config.stage(role)
        from ascend_runtime.planner.flex import planned_instances  # noqa: PLC0415

        base = f"{role}-{planned_instances(config, role) - 1}"
        names += [base, *(base + s for s in INSTANCE_NAME_SUFFIXES), f"{base}-rank{stage.nodes_per_instance - 1}"]
    return names


def check_names(config: StackConfig) -> list[Problem]:
    """Instance-derived object names are DNS-1123 labels (Service names must be, others as well)."""
    bad = [name for name in instance_names(config) if not is_dns_label(name)]
    if not bad:
        return []
    role = bad[0].split("-", 1)[0]
    return [Problem(f"{role}.instances", f"derived object names such as {bad[0][:70]!r} exceed a DNS-1123 label "
                    "(63 characters)", config.stage(role).instances, "lower instances or nodes_per_instance")]


def total_npus(config: StackConfig) -> int:
    """NPUs of every instance of both stages (with both shapes of every flexible group, pd_ratio auto)."""
    from ascend_runtime.planner.flex import planned_instances  # noqa: PLC0415

    return sum(planned_instances(config, r) * config.stage(r).dp * config.stage(r).tp for r in ROLES)


def local_dp_ranks(config: StackConfig, role: Role) -> int:
    """DP ranks of one instance of ``role`` on one of its nodes: dp / nodes_per_instance."""
    stage = config.stage(role)
    return max(1, stage.dp // stage.nodes_per_instance)


def rank_api_ports(api_base: int, ordinal: int, instance_count: int, count: int) -> tuple[int, ...]:
    """API ports of the ``count`` DP ranks one node runs for instance ``ordinal`` (``serving: rank``):
    ``api_base + ordinal + local rank x instance_count``, local rank being the rank's index on its node.
    Local rank 0 keeps the instance's own port, and no two ranks of instances sharing a host (host
    networking) share a port; ranks on different nodes reuse ports, as instances' leaders do."""
    return tuple(api_base + ordinal + j * instance_count for j in range(count))


def port_ranges(config: StackConfig, hardware: HardwareSpec, connector: str, instance_count: int) -> dict[str, range]:
    """Every port range the Plan will use, by the key that sets its base."""
    ports = config.ports
    kv_base = ports.kv_base or hardware.recommended_kv_port_base
    api_ports = instance_count
    if config.serving == "rank":  # every DP rank on a node has its own API port
        api_ports = instance_count * max(local_dp_ranks(config, r) for r in ROLES)
    ranges = {
        "ports.api_base": range(ports.api_base, ports.api_base + api_ports),
        "ports.dp_rpc_base": range(ports.dp_rpc_base, ports.dp_rpc_base + instance_count),
        "ports.kv_base": range(kv_base, kv_base + total_npus(config)),
        "ports.proxy": range(ports.proxy, ports.proxy + 1),
        "ports.balancer_metrics": range(ports.balancer_metrics, ports.balancer_metrics + 1),
    }
    if connector == "llmdatadist":
        ranges["ports.rpc_base"] = range(ports.rpc_base, ports.rpc_base + instance_count)
    return ranges


#: Ports one host can give a range: 1024-65535.
PORT_SPACE = 65535 - 1024 + 1


def check_port_space(config: StackConfig, instance_count: int) -> list[Problem]:
    """Instance and NPU counts a port range can hold at all (each instance takes one API, one DP RPC port;
    each NPU one KV port), naming the count that overflows rather than the ports it would push past 65535."""
    from ascend_runtime.planner.flex import flex_groups  # noqa: PLC0415

    npus = total_npus(config)
    if instance_count <= PORT_SPACE and npus <= PORT_SPACE:
        return []
    counts = {f"{r}.instances": config.stage(r).instances for r in ROLES}
    counts["pd_ratio.groups"] = flex_groups(config)
    key = max(counts, key=lambda k: counts[k])
    what = (f"{instance_count} instances need {instance_count} API ports" if instance_count > PORT_SPACE
            else f"{npus} NPUs need {npus} KV ports")
    return [Problem(key, f"{what}, more than the {PORT_SPACE} ports from 1024 to 65535", counts[key],
                    f"lower {key}")]


def check_ports(config: StackConfig, hardware: HardwareSpec, connector: str, instance_count: int) -> list[Problem]:
    """No port range is privileged, reserved by the cluster (:data:`RESERVED_PORTS`), runs past 65535 or
    overlaps another; also the derived instance names (:func:`check_names`)."""
    problems: list[Problem] = check_names(config)
    too_many = check_port_space(config, instance_count)
    if too_many:  # every port range below would only restate this cause under a ports.* key
        return problems + too_many
    ranges = port_ranges(config, hardware, connector, instance_count)
    keys = list(ranges)
    for i, key in enumerate(keys):
        span = ranges[key]
        if span.stop - 1 > 65535:
            problems.append(Problem(key, f"ports {span.start}-{span.stop - 1} run past 65535", span.start))
        if span.start < 1024:
            problems.append(Problem(key, f"ports {span.start}-{span.stop - 1} include privileged ports (below 1024)",
                                    span.start, "use ports from 1024 up"))
        for low, high, what in RESERVED_PORTS:
            if span.start <= high and low < span.stop:
                problems.append(Problem(
                    key, f"ports {span.start}-{span.stop - 1} cover {low}-{high}, {what}", span.start,
                    f"move {key} outside {low}-{high} (e.g. {high + 1}, or below {low - (span.stop - span.start)})"))
        for other in keys[i + 1 :]:
            o = ranges[other]
            if span.start < o.stop and o.start < span.stop:
                problems.append(
                    Problem(
                        other,
                        f"ports {o.start}-{o.stop - 1} collide with {key} ports {span.start}-{span.stop - 1}",
                        o.start,
                        f"move {other} outside {span.start}-{span.stop - 1}",
                    )
                )
    return problems


def require_engine_resources(plan: Plan) -> None:
    """Raise ConfigError (exit 2 in the CLI) when the engine pods' CPU or memory do not fit
    (:func:`ascend_runtime.planner.pod_resources.resource_problems`; nothing on local and kind)."""
    problems = resource_problems(plan)
    if problems:
        raise ConfigError(problems, f"stack {plan.stack}")
