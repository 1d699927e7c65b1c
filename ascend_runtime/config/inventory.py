"""Host inventory: the facts about each node that rank tables and playbooks need.

The inventory lives in its own YAML file under ``stacks/inventories/`` (named by
the stack's ``inventory`` key) because the facts playbook writes it. Shape::

    ssh:                      # how playbooks reach the hosts
      user: root
      port: 22
      key_file: ~/.ssh/id_ed25519
      jump_host: null         # "user@host:port" or null
      known_hosts: ~/.ssh/known_hosts
      sudo: false
    nodes:
      - name: a2-node-01      # Kubernetes node name (kubernetes.io/hostname)
        host_ip: 192.0.2.11   # HCCL_IF_IP, rank table server_id
        nic: enp189s0f0       # HCCL/GLOO/TP socket interface
        ssh_host: null        # address SSH connects to (default host_ip)
        ssh_port: null        # overrides ssh.port for this node
        versions: {driver: 24.1.rc3, firmware: 7.5.0.1.129, cann: 8.1.RC1}
        devices:
          - device_id: 0              # logical NPU id (card * chips_per_card + chip)
            device_ip: 198.51.100.11  # RoCE port IP (hccn_tool -i 0 -ip -g), A2 and A3
            netmask: 255.255.255.0    # optional: RoCE port netmask, used by npu-network
            gateway: 198.51.100.1     # optional
            netdetect: 198.51.100.1   # optional
            vnic_ip: null             # A3 only: VNIC IP (hccn_tool -i 0 -vnic -g)
            super_device_id: null     # A3 only (SDID)
            super_pod_id: null        # A3 only
        devices_out_of_service: []    # device ids kept listed but never placed (a broken NPU)

Two device addresses, never interchangeable:

- ``device_ip`` is always the RoCE port IP, ``hccn_tool -i N -ip -g`` on A2 and
  A3 alike. It is what HCCL's hccl.json ``device_ip`` and ``/etc/hccn.conf``
  ``address_N`` mean, and the only address npu-network writes
  (``hccn_tool -i N -ip -s``).
- ``vnic_ip`` (A3 / CM384 only) is the VNIC IP, ``hccn_tool -i N -vnic -g``: a
  different address, used only by the vLLM-Ascend LLMDataDist PD rank table
  (``gen_ranktable.py`` of v0.11.0 reads ``-vnic -g`` on A3, ``-ip -g`` on A2).
  It must never be written to a RoCE port; the kit only reads and verifies it.

The model alone does not know the hardware kind (that is the stack's
``hardware`` key), so it only refuses a ``vnic_ip`` equal to ``device_ip``;
:meth:`Inventory.hardware_problems` refuses ``vnic_ip`` on Atlas A2, and the
playbook runner and the planner call it with the stack's hardware.

Addresses are checked by use (docs/validation.md): no unspecified, multicast,
broadcast, reserved or link-local address anywhere; loopback only as the host
IP of a ``local`` stack (the loader checks the target). The RoCE addresses of a
device form a subnet (``device_ip``/``netmask``) that must hold its gateway;
the devices of one plane (the same ``device_id`` on every node: NPU *i* of each
server is cabled to plane *i*) reach each other on-link unless routed, so
:meth:`Inventory.network_problems` refuses a plane whose devices without a
gateway are not all in one subnet, devices of one subnet that disagree on the
netmask or gateway, and a device address that is also a host IP or VNIC IP.

All addresses in committed stacks come from documentation ranges
(192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) or loopback, except the 384
A3 VNIC addresses of ``cm384-prod.yaml``, which do not fit beside its 384 RoCE
addresses and come from the benchmarking range 198.18.0.0/15 (RFC 2544).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from ipaddress import IPv4Address, IPv4Interface, IPv4Network
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ascend_runtime.config.errors import (
    DeviceIPv4,
    HostIPv4,
    InterfaceName,
    Netmask,
    NodeName,
    Problem,
    address_problem,
    invalid,
    is_dns_subdomain,
    shorten,
)

#: Hardware kinds whose devices have a VNIC besides the RoCE port (A3 / CloudMatrix 384).
VNIC_HARDWARE = ("cm384",)

_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")


def _ssh_host_problem(value: str) -> str | None:
    """Why ``value`` is neither a host name nor a usable IPv4 address, or None."""
    try:
        ip = IPv4Address(value)
    except ValueError:
        return None if is_dns_subdomain(value.lower()) else "not a host name or IPv4 address"
    problem = address_problem(ip, loopback_ok=True)
    return problem[0] if problem else None


class _Strict(BaseModel):
    # strict: a YAML `true` is no port, `"22"` no number; allow_inf_nan=False: `.inf` is no timeout (docs/validation.md)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


#: Longest SSH connect timeout (seconds): an hour; a TCP and SSH handshake that takes longer has failed.
MAX_CONNECT_TIMEOUT_S = 3600
#: Largest super pod and super device id (npu-smi prints 32-bit unsigned ids).
MAX_POD_ID = 0xFFFFFFFF


def _one_line(value: str | None) -> str | None:
    """A path or version text without control characters (a newline or NUL pasted into the value)."""
    if value is not None and any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise invalid(f"{shorten(value)!r} holds a control character (a newline, tab or NUL)", "write it on one line")
    return value


class SshSettings(_Strict):
    """How the playbook runner reaches the hosts."""

    user: str = Field("root", description="SSH login user.")
    port: int = Field(22, ge=1, le=65535, description="SSH port unless a node overrides it.")
    key_file: str | None = Field(None, min_length=1, max_length=4096,
                                 description="Private key file; None uses the SSH agent / default keys.")
    jump_host: str | None = Field(None, description="Bastion as user@host[:port], or None.")
    known_hosts: str = Field("~/.ssh/known_hosts", min_length=1, max_length=4096, description="known_hosts file checked strictly.")
    sudo: bool = Field(False, description="Prefix privileged commands with sudo -n.")
    connect_timeout_s: float = Field(10.0, gt=0, le=MAX_CONNECT_TIMEOUT_S,
                                     description="TCP + SSH handshake timeout, seconds (at most 3600).")

    _paths_one_line = field_validator("key_file", "known_hosts")(_one_line)

    @field_validator("user")
    @classmethod
    def _user(cls, value: str) -> str:
        if not _USER.match(value):
            raise invalid("not a login name (letters, digits, '_', '.', '-', at most 32)", "e.g. 'root'")
        return value

    @field_validator("jump_host")
    @classmethod
    def _jump_host(cls, value: str | None) -> str | None:
        if value is None:
            return value
        user, at, rest = value.rpartition("@")
        host, colon, port = rest.partition(":")
        bad = (at and not _USER.match(user)) or _ssh_host_problem(host) or (
            colon and not (port.isdigit() and 1 <= int(port) <= 65535))
        if bad:
            raise invalid("not user@host[:port]", "e.g. 'ops@192.0.2.1:22'")
        return value


class NodeVersions(_Strict):
    """Driver, firmware and CANN versions the facts playbook read on the host."""

    driver: str | None = Field(None, max_length=128)
    firmware: str | None = Field(None, max_length=128)
    cann: str | None = Field(None, max_length=128)

    _versions_one_line = field_validator("driver", "firmware", "cann")(_one_line)


class Device(_Strict):
    """One NPU device (an A2 910B chip, or one die of an A3 910C)."""

    device_id: int = Field(ge=0, le=63, description="Logical device id (hccn_tool -i, ASCEND_RT_VISIBLE_DEVICES).")
    device_ip: DeviceIPv4 = Field(
        description="RoCE port IP (hccn_tool -i N -ip -g) on A2 and A3: hccl.json device_ip, hccn.conf address_N."
    )
    netmask: Netmask | None = Field(None, description="RoCE port netmask (hccn_tool -ip -g).")
    gateway: DeviceIPv4 | None = Field(None, description="RoCE port gateway, inside the port's subnet; needs netmask.")
    netdetect: DeviceIPv4 | None = None
    vnic_ip: DeviceIPv4 | None = Field(
        None,
        description="A3 only: VNIC IP (hccn_tool -i N -vnic -g), used only by the LLMDataDist PD rank table; "
        "never written to the RoCE port.",
    )
    super_device_id: int | None = Field(None, ge=0, le=MAX_POD_ID, description="A3: SDID from npu-smi spod-info (32-bit).")
    super_pod_id: int | None = Field(None, ge=0, le=MAX_POD_ID, description="A3: Super Pod ID from npu-smi spod-info (32-bit).")

    @model_validator(mode="after")
    def _vnic_is_not_the_roce_ip(self) -> Device:
        if self.vnic_ip is not None and self.vnic_ip == self.device_ip:
            raise ValueError(
                f"vnic_ip equals device_ip ({self.device_ip}): device_ip is the RoCE port IP (hccn_tool -ip -g) "
                "and vnic_ip the A3 VNIC IP (hccn_tool -vnic -g), two different addresses; "
                "re-run the facts playbook"
            )
        return self

    @property
    def network(self) -> IPv4Network | None:
        """The RoCE port's subnet (device_ip/netmask), None without a netmask."""
        return IPv4Interface(f"{self.device_ip}/{self.netmask}").network if self.netmask else None

    @model_validator(mode="after")
    def _addresses_fit_the_subnet(self) -> Device:
        net = self.network
        if net is None:
            if self.gateway is not None:
                raise invalid("a gateway needs the port's netmask to be checked", "add netmask (hccn_tool -ip -g)", at="netmask")
            return self
        if net.prefixlen <= 30 and self.device_ip in (net.network_address, net.broadcast_address):
            raise invalid(f"{self.device_ip} is the network or broadcast address of its subnet {net}",
                          "give the port a host address of the subnet", at="device_ip")
        if self.gateway is not None:
            if self.gateway not in net:
                raise invalid(f"gateway {self.gateway} is outside the port's subnet {net} (device_ip/netmask)",
                              "fix the gateway or the netmask (hccn_tool -gateway -g, -ip -g)", at="gateway")
            if self.gateway == self.device_ip or (
                    net.prefixlen <= 30 and self.gateway in (net.network_address, net.broadcast_address)):
                raise invalid(f"gateway {self.gateway} is the port's own, network or broadcast address",
                              "write the router's address", at="gateway")
        return self


class Node(_Strict):
    """One Atlas host."""

    name: NodeName = Field(description="Kubernetes node name (DNS-1123 subdomain, at most 63 characters).")
    host_ip: HostIPv4 = Field(description="Host address: HCCL_IF_IP and rank-table server_id.")
    nic: InterfaceName = Field("eth0", description="Host NIC for HCCL/GLOO/TP sockets.")
    ssh_host: str | None = None
    ssh_port: int | None = Field(None, ge=1, le=65535)
    versions: NodeVersions | None = None
    devices: list[Device] = Field(default_factory=list)
    devices_out_of_service: list[Annotated[int, Field(ge=0, le=63)]] = Field(
        default_factory=list,
        description="Logical device ids (devices[].device_id) taken out of service: still listed under devices, "
        "never placed, in no rank table or ASCEND_RT_VISIBLE_DEVICES (docs/runbooks/replace-failed-node.md).",
    )

    @field_validator("devices_out_of_service")
    @classmethod
    def _each_device_once(cls, value: list[int]) -> list[int]:
        twice = sorted({d for d in value if value.count(d) > 1})
        if twice:
            raise invalid(f"device {', '.join(map(str, twice))} is listed twice", "list each device id once")
        return value

    @property
    def in_service(self) -> list[Device]:
        """The devices the planner may place on: every listed device not in ``devices_out_of_service``."""
        out = set(self.devices_out_of_service)
        return [d for d in self.devices if d.device_id not in out]

    @field_validator("ssh_host")
    @classmethod
    def _ssh_host(cls, value: str | None) -> str | None:
        problem = _ssh_host_problem(value) if value is not None else None
        if problem:
            raise invalid(problem, "write the address SSH connects to, e.g. '192.0.2.11' or 'a2-node-01.example.net'")
        return value

    @property
    def super_pod_id(self) -> int | None:
        """The node's super pod (A3): the devices' common super_pod_id, else None."""
        ids = {d.super_pod_id for d in self.devices if d.super_pod_id is not None}
        return ids.pop() if len(ids) == 1 else None


class Inventory(_Strict):
    """Every host of a stack."""

    ssh: SshSettings = Field(default_factory=SshSettings)
    nodes: list[Node] = Field(default_factory=list)

    def hardware_problems(self, hardware: str) -> list[Problem]:
        """Facts that contradict the stack's hardware kind: ``vnic_ip`` on hardware without a VNIC (Atlas A2)."""
        if hardware in VNIC_HARDWARE:
            return []
        return [
            Problem(
                f"inventory.nodes[{i}].devices[{j}].vnic_ip",
                f"vnic_ip is A3 (cm384) only; {hardware} devices have no VNIC, their one address is device_ip "
                f"(hccn_tool -ip -g) (node {node.name}, device {dev.device_id})",
                str(dev.vnic_ip),
                "remove vnic_ip, or fix the stack's hardware kind",
            )
            for i, node in enumerate(self.nodes)
            for j, dev in enumerate(node.devices)
            if dev.vnic_ip is not None
        ]

    def target_problems(self, target: str) -> list[Problem]:
        """Host IPs against the stack's target: loopback on the ``local`` target only, and always there."""
        problems = []
        for i, node in enumerate(self.nodes):
            if node.host_ip.is_loopback and target != "local":
                problems.append(Problem(
                    f"inventory.nodes[{i}].host_ip", f"is a loopback address; on the {target} target it becomes "
                    "HCCL_IF_IP and the rank table server_id, which other nodes must reach", str(node.host_ip),
                    "write the node's own address (loopback is for the local target only)"))
            elif not node.host_ip.is_loopback and target == "local":
                problems.append(Problem(
                    f"inventory.nodes[{i}].host_ip", "the local target runs every node's processes on this machine, "
                    "on loopback", str(node.host_ip), "use a 127.0.0.0/8 address, e.g. 127.0.1.1"))
        return problems

    def network_problems(self) -> list[Problem]:
        """Device addresses against their peers: one subnet per on-link plane, one netmask and gateway per subnet,
        no device address that is also a host IP or a VNIC IP."""
        problems: list[Problem] = []
        hosts = {str(n.host_ip): n.name for n in self.nodes}
        vnics = {str(d.vnic_ip): (n.name, d.device_id) for n in self.nodes for d in n.devices if d.vnic_ip}
        planes: dict[int, list[tuple[str, Device]]] = defaultdict(list)
        subnets: dict[IPv4Network, tuple[str, Device]] = {}
        members_of: dict[IPv4Network, list[tuple[str, Device]]] = defaultdict(list)
        for i, node in enumerate(self.nodes):
            for j, dev in enumerate(node.devices):
                at = f"inventory.nodes[{i}].devices[{j}]"
                ip = str(dev.device_ip)
                if ip in hosts:
                    problems.append(Problem(f"{at}.device_ip", f"is also the host IP of node {hosts[ip]}", ip,
                                            "the RoCE port and the host NIC need addresses of their own"))
                if ip in vnics and vnics[ip] != (node.name, dev.device_id):
                    other = vnics[ip]
                    problems.append(Problem(f"{at}.device_ip", f"is also the VNIC IP of {other[0]} device {other[1]}",
                                            ip, "re-run the facts playbook"))
                net = dev.network
                if net is None:
                    continue
                planes[dev.device_id].append((at, dev))
                if net not in subnets:  # a new subnet: it must not overlap one seen before
                    for other_net, (other_at, other) in subnets.items():
                        if other_net.overlaps(net):
                            problems.append(Problem(f"{at}.netmask", f"subnet {net} overlaps {other_net} of {other_at}",
                                                    str(dev.netmask), f"use the same netmask as its peers ({other.netmask})"))
                            break
                subnets.setdefault(net, (at, dev))
                members_of[net].append((at, dev))
        for net, members in members_of.items():  # the gateway most ports of the subnet name is taken for right
            votes = Counter(str(dev.gateway) if dev.gateway else None for _, dev in members)
            common, count = max(votes.items(), key=lambda kv: (kv[1], kv[0] is not None))
            for at, dev in members:
                if (str(dev.gateway) if dev.gateway else None) != common:
                    problems.append(Problem(f"{at}.gateway", f"devices of subnet {net} name different gateways "
                                            f"({count} of its {len(members)} ports name {common or 'none'})",
                                            str(dev.gateway) if dev.gateway else None,
                                            "give every port of one subnet the same gateway"))
        for device_id, members in sorted(planes.items()):
            on_link = [(at, dev) for at, dev in members if dev.gateway is None]
            if not on_link:
                continue  # a routed plane: every port reaches its peers through its gateway
            at0, dev0 = on_link[0]
            outside = [(at, dev) for at, dev in members if dev.network != dev0.network]
            if outside:
                at, dev = outside[0]
                more = f" ({len(outside)} ports of the plane are outside it)" if len(outside) > 1 else ""
                problems.append(Problem(
                    f"{at}.device_ip", f"plane {device_id} (device {device_id} of every node) is on-link in "
                    f"{dev0.network} ({at0} has no gateway) but this port is in {dev.network}{more}",
                    str(dev.device_ip),
                    f"put device {device_id} of every node in one subnet, or give the plane's ports a gateway"))
        return problems
