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
            device_ip: 198.51.100.11  # NPU NIC address (hccn_tool -ip / -vnic)
            netmask: 255.255.255.0    # optional, used by npu-network
            gateway: 198.51.100.1     # optional
            netdetect: 198.51.100.1   # optional
            super_device_id: null     # A3 only (SDID)
            super_pod_id: null        # A3 only

All addresses in committed stacks come from documentation ranges
(192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) or loopback.
"""

from __future__ import annotations

from ipaddress import IPv4Address

from pydantic import BaseModel, ConfigDict, Field


class SshSettings(BaseModel):
    """How the playbook runner reaches the hosts."""

    model_config = ConfigDict(extra="forbid")

    user: str = Field("root", description="SSH login user.")
    port: int = Field(22, ge=1, le=65535, description="SSH port unless a node overrides it.")
    key_file: str | None = Field(None, description="Private key file; None uses the SSH agent / default keys.")
    jump_host: str | None = Field(None, description="Bastion as user@host[:port], or None.")
    known_hosts: str = Field("~/.ssh/known_hosts", description="known_hosts file checked strictly.")
    sudo: bool = Field(False, description="Prefix privileged commands with sudo -n.")
    connect_timeout_s: float = Field(10.0, gt=0, description="TCP + SSH handshake timeout, seconds.")


class NodeVersions(BaseModel):
    """Driver, firmware and CANN versions the facts playbook read on the host."""

    model_config = ConfigDict(extra="forbid")

    driver: str | None = None
    firmware: str | None = None
    cann: str | None = None


class Device(BaseModel):
    """One NPU device (an A2 910B chip, or one die of an A3 910C)."""

    model_config = ConfigDict(extra="forbid")

    device_id: int = Field(ge=0, description="Logical device id (hccn_tool -i, ASCEND_RT_VISIBLE_DEVICES).")
    device_ip: IPv4Address = Field(description="NPU NIC address used by HCCL between nodes.")
    netmask: IPv4Address | None = None
    gateway: IPv4Address | None = None
    netdetect: IPv4Address | None = None
    super_device_id: int | None = Field(None, ge=0, description="A3: SDID from npu-smi spod-info.")
    super_pod_id: int | None = Field(None, ge=0, description="A3: Super Pod ID from npu-smi spod-info.")


class Node(BaseModel):
    """One Atlas host."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, description="Kubernetes node name.")
    host_ip: IPv4Address = Field(description="Host address: HCCL_IF_IP and rank-table server_id.")
    nic: str = Field("eth0", min_length=1, description="Host NIC for HCCL/GLOO/TP sockets.")
    ssh_host: str | None = None
    ssh_port: int | None = Field(None, ge=1, le=65535)
    versions: NodeVersions | None = None
    devices: list[Device] = Field(default_factory=list)

    @property
    def super_pod_id(self) -> int | None:
        """The node's super pod (A3): the devices' common super_pod_id, else None."""
        ids = {d.super_pod_id for d in self.devices if d.super_pod_id is not None}
        return ids.pop() if len(ids) == 1 else None


class Inventory(BaseModel):
    """Every host of a stack."""

    model_config = ConfigDict(extra="forbid")

    ssh: SshSettings = Field(default_factory=SshSettings)
    nodes: list[Node] = Field(default_factory=list)
