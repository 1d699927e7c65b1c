"""The HCCL intra-node pair of a stage: ``HCCL_INTRA_PCIE_ENABLE`` / ``HCCL_INTRA_ROCE_ENABLE``.

CANN reads the pair to pick the link between the NPUs of a server; vLLM-Ascend reads it too. At v0.23.0,
PCIE=1 with ROCE=0 turns on hierarchical MC2 (vllm_ascend/utils.py ``is_hierarchical_communication_enabled``):
the dispatch op is given the expert scales (ops/fused_moe/token_dispatcher.py ``TokenDispatcherWithMC2``)
and, with no ``comm_alg`` passed, CANN runs its "hierarchy" algorithm on A2, which crosses servers once
between same-numbered NPUs and fans out over HCCS (torch_npu ``npu_moe_distribute_dispatch_v2``, Ascend/op-plugin
docs/context/torch_npu-npu_moe_distribute_dispatch_v2.md, ``comm_alg``), and decode keeps its all-reduce across the DP group every step (utils.py ``should_skip_allreduce_across_dp_group``
returns False under it). That is the A2 path.

Defaults per hardware kind, as the vLLM-Ascend v0.23.0 recipes set the pair:

- Atlas 800I A2: ``pcie`` (PCIE=1, ROCE=0), the A2 multi-node DP recipes
  (docs/source/tutorials/models/DeepSeek-R1.md lines 266-267 and 315-316, section 5.2;
  docs/source/tutorials/models/DeepSeek-V3.1.md lines 379-380 and 435-436, section 5.2).
- CM384 (Atlas A3): neither variable. The A3 PD recipes export neither: DeepSeek-V3.1.md section 5.3
  "run_dp_template.sh script(A3)" (the exports of its four nodes, lines 556-575, 633-652, 710-729 and
  786-805) and docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md (the A3 2P1D
  scripts; HCCL exports at lines 285-296, 343-354, 401-410).

``<stage>.hccl_intra`` (``pcie`` or ``roce``) overrides the default on either kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

IntraPath = Literal["pcie", "roce"]

#: Hardware kinds whose recipes leave the pair unset (Atlas A3 / CloudMatrix 384).
A3_KINDS = frozenset({"cm384"})
#: Default path of the other kinds (Atlas 800I A2).
A2_DEFAULT: IntraPath = "pcie"


def hccl_intra(config: Mapping[str, Any], role: str) -> IntraPath | None:
    """The stage's path inside a node from the stack config (JSON form, ``Plan.config``):
    ``<role>.hccl_intra`` when set, else ``pcie`` on A2 and None (pair unset) on A3."""
    explicit = config[role].get("hccl_intra")
    if explicit:
        return explicit  # type: ignore[no-any-return]
    return None if config["hardware"] in A3_KINDS else A2_DEFAULT


def intra_env(path: IntraPath | None) -> dict[str, str]:
    """The pair's variables for a path: exactly one of them "1" for ``pcie`` / ``roce``; none for None."""
    if path is None:
        return {}
    return {"HCCL_INTRA_ROCE_ENABLE": "1" if path == "roce" else "0",
            "HCCL_INTRA_PCIE_ENABLE": "1" if path == "pcie" else "0"}


def hierarchical_mc2(config: Mapping[str, Any], role: str) -> bool:
    """Whether vLLM-Ascend 0.23.0 runs the stage's MC2 in the hierarchical layout: PCIE=1 and ROCE=0
    (vllm_ascend/utils.py ``is_hierarchical_communication_enabled``; ``enable_mc2_hierarchy_comm``, the
    other trigger, is never rendered)."""
    return hccl_intra(config, role) == "pcie"
