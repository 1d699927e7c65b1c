"""Per-NPU hardware figures of the timing model, and the published instance shape per hardware and role.

``HARDWARE`` is the catalogue (:mod:`ascend_runtime.hardware`) as the timing model reads it, with the
figures the catalogue does not carry (HBM bandwidth, dense FLOP/s, the default PD KV link);
``ROLE_DEFAULTS`` is the instance shape a simulator or a model query takes when it gives none.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascend_runtime.hardware import CATALOGUE, HardwareSpec


@dataclass(frozen=True)
class HardwareProfile:
    """Per-NPU figures of one hardware generation (an "NPU" is one 910B or one 910C die).

    Units: bytes, bytes/s, FLOP/s.
    """

    name: str
    npus_per_node: int
    hbm_bytes: float
    hbm_bandwidth: float
    flops: float
    #: Bytes/s one NPU can move to peers inside its node (HCCS / UB share).
    intra_node_bandwidth: float
    #: Bytes/s one NPU can move to peers on other nodes (its share of the node NIC).
    inter_node_bandwidth: float
    #: Default PD link rate in Gbit/s (KV transfer between instances).
    default_link_gbps: float


#: Figures the timing model needs beyond the catalogue (calibrated constants absorb their error):
#: kind -> (HBM bytes/s per device, dense FLOP/s per device, default PD KV link in Gbit/s).
#: The KV link: A2 moves KV over the node's 50 GB/s network; CM384 over one die's UB share (196 GB/s).
_COMPUTE: dict[str, tuple[float, float, float]] = {
    "atlas-800i-a2": (1.6e12, 300e12, 50 * 8),
    "cm384": (1.6e12, 376e12, 392 / 2 * 8),
}


def _profile(spec: HardwareSpec) -> HardwareProfile:
    """The timing model's view of one catalogue entry (ascend_runtime.hardware)."""
    hbm_bandwidth, flops, link_gbps = _COMPUTE[spec.kind]
    return HardwareProfile(
        name=spec.kind,
        npus_per_node=spec.devices_per_node,
        hbm_bytes=spec.hbm_gib_per_device * 2**30,
        hbm_bandwidth=hbm_bandwidth,
        flops=flops,
        intra_node_bandwidth=spec.intra_node_gbps * 1e9,
        inter_node_bandwidth=spec.inter_node_gbps * 1e9,
        default_link_gbps=link_gbps,
    )


#: Hardware kind -> its profile.
HARDWARE: dict[str, HardwareProfile] = {kind: _profile(spec) for kind, spec in CATALOGUE.items()}


@dataclass(frozen=True)
class RoleDefaults:
    """Published instance shape used when the CLI gives none (NPUs, degrees; batch limits per DP rank)."""

    npus: int
    dp: int
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int


#: (hardware, role) -> default shape. A2 from Huawei's article; CM384 decode from the A3 large-EP recipe.
ROLE_DEFAULTS: dict[tuple[str, str], RoleDefaults] = {
    ("atlas-800i-a2", "prefill"): RoleDefaults(npus=16, dp=2, tp=8, max_num_seqs=16, max_num_batched_tokens=8192),
    ("atlas-800i-a2", "decode"): RoleDefaults(npus=32, dp=32, tp=1, max_num_seqs=72, max_num_batched_tokens=2048),
    ("cm384", "prefill"): RoleDefaults(npus=16, dp=2, tp=8, max_num_seqs=16, max_num_batched_tokens=8192),
    ("cm384", "decode"): RoleDefaults(npus=64, dp=64, tp=1, max_num_seqs=96, max_num_batched_tokens=2048),
}
