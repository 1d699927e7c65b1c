"""Hardware catalogue: the Ascend server kinds a stack can target, as data.

Sources:
- Atlas 800I A2: Huawei's DeepSeek-on-Ascend report (facts file, section 1):
  8 x Ascend 910B per node, 64 GB HBM each, full-mesh HCCS 392 GB/s in a node.
  Between nodes: one 200 Gbit/s RoCE port per NPU (8 x 200GE per node, 200 GB/s
  in all): the A2 server with 8 x 910B 64 GB lists "4 x 2-port 200GE RoCE NIC
  (parameter plane)" (DaoCloud d.run / OceanStor A800 compatibility report,
  docs/en/docs/storage/dorado/oceanstor.md, Atlas 800T A2), and the same NPU
  generation has a 200 Gbit/s RDMA port per die on CloudMatrix384 (arXiv
  2506.12708, section 3). The report's "50 GB/s between nodes" does not match
  that port count (docs/simulator.md, "Prediction, not fit").
- CloudMatrix 384: Zuo et al., "Serving Large Language Models on Huawei
  CloudMatrix384", arXiv 2506.12708 (section 3): 384 Ascend 910C NPUs in 48
  compute nodes of 8 NPUs; each 910C is a dual-die package with 128 GB HBM
  (64 GB per die) and 3.2 TB/s; the Unified Bus (UB) gives each 910C about
  392 GB/s unidirectional to every other NPU of the supernode, non-blocking;
  the RDMA plane gives up to 400 Gb/s (50 GB/s) per NPU between supernodes.
  The driver exposes each die as one NPU device, so an A3 server shows 16
  devices (device_id = card * 2 + chip) and a super pod holds 48 x 16 = 768.

Host side of a node (``host_cpus``, ``host_memory_gib``) and the engine pod's default CPU request and
memory limit sized from it (``engine_cpu``, ``engine_memory_gib``; docs/kubernetes.md, "Engine
resources"). The defaults leave room for the kubelet's and the system's reservations, the device
plugin (500m / 500Mi, MindCluster v26.1.0 ``ascendplugin.yaml``) and node daemons (CNI, kube-proxy,
exporters, log agents):
- Atlas 800I A2: 4 x Kunpeng 920 of 48 cores (192 CPUs, no SMT) and 32 DDR4 DIMM slots, 1 TiB as
  32 x 32 GB (Huawei, Atlas 800I A2 inference server technical specifications). Defaults: 160 CPUs
  and 768 GiB, a sixth of the CPUs and a quarter of the memory left to the node.
- CloudMatrix 384: 4 Kunpeng CPUs per compute node (arXiv 2506.12708, section 3); the paper gives
  neither their cores nor the node's DRAM. The floor the kit relies on is what vLLM-Ascend's own A3
  pods are scheduled with beside the device plugin (v0.23.0
  ``tests/e2e/nightly/multi_node/scripts/lws.yaml.jinja2``: requests cpu 125, limits memory 512Gi per
  16-die node), which are also the defaults; ``host_cpus``/``host_memory_gib`` record that floor
  (128 CPUs, 1 TiB assumed), not a measured node. Stacks on larger nodes raise
  ``kubernetes.engine_cpu`` / ``kubernetes.engine_memory_gib``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

HardwareKind = Literal["atlas-800i-a2", "cm384"]


@dataclass(frozen=True)
class HardwareSpec:
    """One server kind. Memory in GiB per NPU device; bandwidths in GB/s (10**9 bytes/s):
    ``intra_node_gbps`` / ``inter_node_gbps`` are what one NPU device can send to peers
    inside its node / on other nodes (its share of the fabric)."""

    kind: str
    display_name: str
    npu_model: str
    devices_per_node: int
    chips_per_card: int
    hbm_gib_per_device: float
    intra_node_gbps: float
    inter_node_gbps: float
    super_pod_nodes: int | None
    rank_table_version: str
    server_hardware_type: str
    accelerator_type_label: str
    moe_dispatch: Literal["mc2", "all2all"]
    recommended_kv_port_base: int
    sources: tuple[str, ...]
    #: Logical CPUs of one node (the smallest node the engine defaults are sized for).
    host_cpus: int = 0
    #: Host DRAM of one node, GiB.
    host_memory_gib: int = 0
    #: Default CPU request of an engine pod (whole CPUs; no CPU limit, docs/kubernetes.md).
    engine_cpu: int = 0
    #: Default memory request = limit of an engine pod, GiB (/dev/shm included).
    engine_memory_gib: int = 0

    @property
    def has_super_pods(self) -> bool:
        """True for A3 supernodes, whose rank tables carry super pod ids."""
        return self.super_pod_nodes is not None

    @property
    def super_pod_devices(self) -> int | None:
        """NPU devices in one super pod (768 on CM384)."""
        return None if self.super_pod_nodes is None else self.super_pod_nodes * self.devices_per_node


ATLAS_800I_A2 = HardwareSpec(
    kind="atlas-800i-a2",
    display_name="Atlas 800I A2",
    npu_model="Ascend 910B",
    devices_per_node=8,
    chips_per_card=1,
    hbm_gib_per_device=64.0,
    intra_node_gbps=392.0 / 8,  # full-mesh HCCS, 392 GB/s per node
    # The report's figure; 8 x 200GE RoCE per node (25 GB/s per NPU, sources above) is the hardware's own
    # port rate, used by the prediction model (perf/fit.py A2_ROCE_PER_NPU_BYTES_S). Switching this value
    # re-baselines tests/sim/test_experts.py and tests/pdplanner/test_decide.py (a2a share falls 4x).
    inter_node_gbps=50.0 / 8,  # switched network, 50 GB/s per node
    super_pod_nodes=None,
    rank_table_version="1.0",
    server_hardware_type="800I-A2-64G",
    accelerator_type_label="module-910b-8",
    moe_dispatch="mc2",
    recommended_kv_port_base=28000,
    sources=("Huawei DeepSeek on Atlas 800I A2 report (facts file section 1)",
             ("Huawei Atlas 800I A2 inference server technical specifications: 4 x Kunpeng 920 (48 cores), "
              "32 DDR4 DIMM slots")),
    host_cpus=192,
    host_memory_gib=1024,
    engine_cpu=160,
    engine_memory_gib=768,
)

CM384 = HardwareSpec(
    kind="cm384",
    display_name="CloudMatrix 384 (Atlas A3 SuperPoD)",
    npu_model="Ascend 910C (one die per device)",
    devices_per_node=16,
    chips_per_card=2,
    hbm_gib_per_device=64.0,
    intra_node_gbps=392.0 / 2,  # UB, ~392 GB/s per 910C package of two dies, flat in the super pod
    inter_node_gbps=392.0 / 2,
    super_pod_nodes=48,
    rank_table_version="1.2",
    server_hardware_type="Atlas-A3-SuperPoD",
    accelerator_type_label="module-a3-16-super-pod",
    moe_dispatch="all2all",
    recommended_kv_port_base=36000,
    sources=(
        "Zuo et al., Serving Large Language Models on Huawei CloudMatrix384, arXiv 2506.12708, section 3",
        "vLLM-Ascend Mooncake guide: kv_port >= 36000 on 16-die nodes (facts file section 2)",
        ("vLLM-Ascend v0.23.0 tests/e2e/nightly/multi_node/scripts/lws.yaml.jinja2: A3 pods request cpu 125, "
         "limit memory 512Gi"),
    ),
    host_cpus=128,
    host_memory_gib=1024,
    engine_cpu=125,
    engine_memory_gib=512,
)

CATALOGUE: dict[str, HardwareSpec] = {spec.kind: spec for spec in (ATLAS_800I_A2, CM384)}


def hardware_spec(kind: str) -> HardwareSpec:
    """Look up a hardware kind; raises KeyError naming the valid kinds."""
    try:
        return CATALOGUE[kind]
    except KeyError:
        raise KeyError(f"unknown hardware kind {kind!r}; valid: {', '.join(sorted(CATALOGUE))}") from None
