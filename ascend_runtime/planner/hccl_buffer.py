"""HCCL_BUFFSIZE of a stage, sized from the window its MC2 dispatch/combine needs (MB = 2**20 bytes).

Why HCCL_BUFFSIZE is MC2's window: vLLM-Ascend v0.23.0 gives every HCCL communicator it creates an explicit
buffer except the MC2 group, "mc2 operators only perform communication space partitioning based on
HCCL_BUFFSIZE" (vllm_ascend/utils.py ``get_hccl_config_for_pg_options`` and its FIXME; the others get 200 MB,
the DP group a few MB). MoE layers within the MC2 capacity call ``torch_npu.npu_moe_distribute_dispatch_v2`` /
``npu_moe_distribute_combine_v2`` (ops/fused_moe/token_dispatcher.py ``TokenDispatcherWithMC2``; CM384 W8A8
decode runs the fused ``dispatch_gmm_combine_decode`` over the same EP window, csrc/mc2 at v0.23.0, which checks
no size of its own), and CANN requires HCCL_BUFFSIZE to hold the op's window. vLLM-Ascend itself never checks it.

**Tokens per die (BS)**: the largest MoE step the engine sends through MC2, per TP rank
(vllm_ascend/ascend_forward_context.py ``set_mc2_tokens_capacity``, v0.23.0): a graph stage's largest graph
(``graph_capture_sizes`` when listed, else vllm_ascend/platform.py ``_get_default_max_cudagraph_capture_size``:
min(max_num_seqs x (1 + MTP speculative tokens), 512)); an eager stage's uniform decode step,
max_num_seqs x (1 + MTP tokens); divided by tp (rounded up) and capped at 512. A larger step, such as a prefill
chunk of ``max_num_batched_tokens``, is not MC2: it runs all-to-all on A3 and all-gather on A2
(``select_moe_comm_method``), which take no MC2 window.

**Which layout**: no MC2 without expert parallelism, nor on A2 with EP < 16 or more than 24 experts per die
(``_select_a2_moe_comm_method``). On A2, PCIE=1 / ROCE=0 (:mod:`ascend_runtime.planner.hccl_pair`) selects
CANN's hierarchical algorithm, else full mesh; A3 runs full mesh ("fullmesh_v1": vLLM passes no ``comm_alg``).

**Need** (torch_npu ``npu_moe_distribute_dispatch_v2`` API page, "HCCL_BUFFSIZE" constraint: Ascend/op-plugin
docs/context/torch_npu-npu_moe_distribute_dispatch_v2.md; the v1 page
docs/context/torch_npu-npu_moe_distribute_dispatch.md gives the same A2 full-mesh rule), with BS tokens per die,
EP ranks, E physical experts (routed + redundant), L = E / EP local experts, K top-k, and T bytes per token
slot:

- A2 full mesh: 2 x (BS x EP x min(L, K) x T + 2 MB);
- A2 hierarchy: E x BS x (T + 4 x align8(K) x 4) + 4 MB + 100 MB;
- A3: 2 x (L x BS x EP x align512(align32(T) + 64) + (K + 1) x BS x align512(T)), the 1 being
  ``shared_expert_num``, which vLLM leaves at the op's default.

T is what a token slot must carry both ways: a W8A8 dispatch sends H int8 values and a 4-byte fp32
per-token scale (H + 4 bytes; bf16 weights: 2H), the combine returns H bf16 values (2H), so T = 2H, the
``sizeof(uint16)`` of CANN's formulas.

**Value**: the stage's ``hccl_buffsize_mb`` when set (refused below the need), else the need plus
:data:`MARGIN`, rounded up to :data:`ROUND_MB`, and never below the recipes' value (:data:`PUBLISHED_MB`).
The margin covers what the documented formulas leave open: they differ between API versions (the v1 page
states the A3 rule as 2 MB + 2 x BS x 2 x (H + 128) x (EP x L + K + 1) bytes, 1.5% less for cm384-prod's
decode), and the fused decode operator documents none of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ascend_runtime.config.errors import Problem
from ascend_runtime.engine.releases import decode_graph_tokens, release
from ascend_runtime.planner.engine_rules import MTP_SPEC_TOKENS
from ascend_runtime.planner.hccl_pair import A3_KINDS, hierarchical_mc2

MB = 2**20
#: Share added to the need when the kit picks the value.
MARGIN = 0.25
#: The value is a multiple of this many MB.
ROUND_MB = 16
#: The v0.23.0 recipes' HCCL_BUFFSIZE (MB): the floor of the value the kit picks (large-EP guide; facts file
#: section 2; docs/rendering.md "Against the vLLM-Ascend v0.23.0 recipes").
PUBLISHED_MB = {"prefill": 256, "decode": 1024}
#: MC2 tokens per TP rank at most (ascend_forward_context.py ``set_mc2_tokens_capacity``) and the largest
#: default graph (platform.py ``_get_default_max_cudagraph_capture_size``), v0.23.0.
MC2_MAX_TOKENS = 512
#: A2 runs MC2 only with EP >= 16 and <= 24 logical experts per die (``_select_a2_moe_comm_method``, v0.23.0).
A2_MC2_MIN_EP = 16
A2_MC2_MAX_EXPERTS_PER_DIE = 24
COMBINE_BYTES = 2  # bf16 per hidden element, the combine's return
SCALE_BYTES = 4  # fp32 dynamic-quantisation scale per token of a W8A8 dispatch
SHARED_EXPERT_NUM = 1  # the op's default; vLLM-Ascend passes none
ROLES = ("prefill", "decode")

Layout = Literal["a2-fullmesh", "a2-hierarchy", "a3-fullmesh"]


def _align(value: int, to: int) -> int:
    """``value`` rounded up to a multiple of ``to``."""
    return -(-value // to) * to


@dataclass(frozen=True)
class Mc2Window:
    """One stage's MC2 dispatch/combine: its shape and the HCCL window CANN requires for it.

    ``tokens_per_die``: BS, tokens one die sends per MoE layer at most; ``ep``: ranks of the EP group;
    ``experts``: physical experts per MoE layer (routed + redundant); ``top_k``: experts per token;
    ``hidden``: H, elements per token; ``quantization``: ``w8a8`` or ``bf16`` weights.
    """

    layout: Layout
    tokens_per_die: int
    ep: int
    experts: int
    top_k: int
    hidden: int
    quantization: str

    @property
    def local_experts(self) -> int:
        """Experts on one die (L)."""
        return self.experts // self.ep

    @property
    def dispatch_token_bytes(self) -> int:
        """Bytes a token takes on the way out: H int8 + its fp32 scale (W8A8), else H bf16."""
        return self.hidden + SCALE_BYTES if self.quantization == "w8a8" else COMBINE_BYTES * self.hidden

    @property
    def token_bytes(self) -> int:
        """T: bytes of a token slot, the larger of the dispatch and the bf16 combine (2H in both cases)."""
        return max(self.dispatch_token_bytes, COMBINE_BYTES * self.hidden)

    @property
    def need_bytes(self) -> int:
        """Bytes CANN requires HCCL_BUFFSIZE to hold (module docstring, per layout)."""
        bs, ep, k, t = self.tokens_per_die, self.ep, self.top_k, self.token_bytes
        if self.layout == "a2-hierarchy":
            return self.experts * bs * (t + 4 * _align(k, 8) * 4) + 104 * MB
        if self.layout == "a2-fullmesh":
            return 2 * (bs * ep * min(self.local_experts, k) * t + 2 * MB)
        slot = _align(_align(t, 32) + 64, 512)
        return 2 * (self.local_experts * bs * ep * slot + (k + SHARED_EXPERT_NUM) * bs * _align(t, 512))

    @property
    def need_mb(self) -> int:
        """The need in whole MB, rounded up."""
        return -(-self.need_bytes // MB)

    def describe(self) -> str:
        """One line: the layout and the figures that size it."""
        return (f"{self.layout}: {self.tokens_per_die} tokens per die x EP {self.ep}, {self.local_experts} local "
                f"experts, top-{self.top_k}, {self.token_bytes} B per token")


@dataclass(frozen=True)
class HcclBuffer:
    """HCCL_BUFFSIZE of one stage (MB): its MC2 window need, the value that fits and the value rendered."""

    role: str
    window: Mc2Window | None
    explicit_mb: int | None
    no_window: str = ""  # why the stage runs no MC2, when ``window`` is None

    @property
    def need_mb(self) -> int:
        """MB the MC2 window needs (0 without MC2)."""
        return self.window.need_mb if self.window else 0

    @property
    def fitting_mb(self) -> int:
        """The kit's value: need + MARGIN, a multiple of ROUND_MB, at least the recipes' value."""
        with_margin = _align(math.ceil(self.need_mb * (1 + MARGIN)), ROUND_MB)
        return max(PUBLISHED_MB[self.role], with_margin)

    @property
    def value_mb(self) -> int:
        """What HCCL_BUFFSIZE is rendered as: the stack's value, else :attr:`fitting_mb`."""
        return self.explicit_mb if self.explicit_mb is not None else self.fitting_mb

    def describe(self) -> str:
        """One line for ``plan``: the value, where it comes from and the need it covers."""
        source = f"{self.role}.hccl_buffsize_mb" if self.explicit_mb is not None else (
            f"need + {MARGIN:.0%}, at least {PUBLISHED_MB[self.role]}")
        need = (f"MC2 window {self.need_mb} MB ({self.window.describe()})" if self.window
                else f"no MC2 window ({self.no_window})")
        return f"HCCL_BUFFSIZE {self.role}: {self.value_mb} MB ({source}); {need}"


def mc2_tokens_per_die(config: Mapping[str, Any], role: str) -> int:
    """BS of a stage: its largest MC2 step per TP rank (module docstring, "Tokens per die")."""
    stage = config[role]
    spec = MTP_SPEC_TOKENS if stage.get("mtp") else 0
    step = int(stage["max_num_seqs"]) * (1 + spec)
    graphs = role == "decode" if stage.get("graph_mode") is None else bool(stage["graph_mode"])  # decode's default
    if graphs:
        row = release(config["engine"]["vllm_ascend_version"])
        if stage.get("graph_capture_sizes"):
            step = max(stage["graph_capture_sizes"])
        elif row.graph == "torchair":  # 0.11: the padded torchair graph (engine/releases.py)
            step = decode_graph_tokens(row.version, int(stage["max_num_seqs"]), spec, role == "decode",
                                       config["hardware"], int(stage["tp"])).tokens
        else:
            step = min(step, MC2_MAX_TOKENS)
    return min(-(-step // int(stage["tp"])), MC2_MAX_TOKENS)


def mc2_window(config: Mapping[str, Any], role: str) -> Mc2Window | str:
    """The stage's MC2 window from the stack config (JSON form, ``Plan.config``), or why it has none."""
    stage, model = config[role], config["model"]
    ep = int(stage["ep"])
    experts = int(model["num_routed_experts"]) + int(stage.get("redundant_experts") or 0)
    if ep <= 1:
        return "ep 1: MoE runs all-gather"
    if experts % ep:
        return f"ep {ep} does not divide the {experts} expert slots"  # the shape check names the key
    a3 = config["hardware"] in A3_KINDS
    per_die = int(model["num_routed_experts"]) // ep
    if not a3 and (ep < A2_MC2_MIN_EP or per_die > A2_MC2_MAX_EXPERTS_PER_DIE):
        return f"A2 runs MC2 only with ep >= {A2_MC2_MIN_EP} and <= {A2_MC2_MAX_EXPERTS_PER_DIE} experts per die"
    layout: Layout = "a3-fullmesh" if a3 else ("a2-hierarchy" if hierarchical_mc2(config, role) else "a2-fullmesh")
    return Mc2Window(layout, mc2_tokens_per_die(config, role), ep, experts, int(model["experts_per_token"]),
                     int(model["hidden_size"]), str(model["quantization"]))


def stage_buffer(config: Mapping[str, Any], role: str) -> HcclBuffer:
    """HCCL_BUFFSIZE of one stage (``config`` in JSON form, ``Plan.config``)."""
    explicit = config[role].get("hccl_buffsize_mb")
    window = mc2_window(config, role)
    if isinstance(window, str):
        return HcclBuffer(role, None, explicit, window)
    return HcclBuffer(role, window, explicit)


def stage_buffers(config: Mapping[str, Any]) -> dict[str, HcclBuffer]:
    """Both stages' HCCL_BUFFSIZE, by role."""
    return {role: stage_buffer(config, role) for role in ROLES}


def check_hccl_buffers(config: Mapping[str, Any]) -> list[Problem]:
    """Refuse an explicit ``<stage>.hccl_buffsize_mb`` below the stage's MC2 window, naming the value that fits."""
    problems: list[Problem] = []
    for buf in stage_buffers(config).values():
        if buf.window and buf.explicit_mb is not None and buf.explicit_mb < buf.need_mb:
            problems.append(Problem(
                f"{buf.role}.hccl_buffsize_mb",
                f"HCCL_BUFFSIZE below the {buf.need_mb} MB window the stage's MC2 dispatch/combine needs "
                f"({buf.window.describe()}; torch_npu npu_moe_distribute_dispatch_v2)",
                buf.explicit_mb,
                f"set it to {buf.fitting_mb} (the need + {MARGIN:.0%}) or at least {buf.need_mb}, "
                f"or remove it to render {buf.fitting_mb}",
            ))
    return problems
