"""Per-module parallelism of a stage: the release's rules, HBM per module and the collectives each adds.

A stage runs ``dp`` x ``tp`` NPUs. vLLM-Ascend 0.23.0 lets single modules use other degrees
(``--additional-config``, read in ``vllm_ascend/ascend_config.py`` ``FinegrainedTPConfig`` and
``AscendConfig.__init__``, tag v0.23.0):

| stack key (``<role>.modules.``) | engine key | what it shards |
|---|---|---|
| ``o_proj_tp`` | ``finegrained_tp_config.oproj_tensor_parallel_size`` | attention output projection, every layer |
| ``lm_head_tp`` | ``finegrained_tp_config.lmhead_tensor_parallel_size`` | LM head (BF16) |
| ``embedding_tp`` | ``finegrained_tp_config.embedding_tensor_parallel_size`` | input embedding (BF16) |
| ``mlp_tp`` | ``finegrained_tp_config.mlp_tensor_parallel_size`` | the dense FFN layers (``not is_moe_layer``) |
| ``shared_expert_dp`` | ``enable_shared_expert_dp`` | shared expert replicated per TP rank |

A module group of size ``n`` is ``n`` consecutive DP ranks at the same TP index
(``vllm_ascend/distributed/parallel_state.py`` ``_create_or_get_group``), so the module's weights
are split ``tp x n`` ways while the rest of the layer keeps ``tp``.

Units: bytes, tokens; a collective's bytes are what one NPU sends.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascend_runtime.config.errors import Problem
from ascend_runtime.config.model import EMBEDDING_BYTES, ModelShape
from ascend_runtime.config.stack import Role, StackConfig, StageConfig

#: Releases whose ``ascend_config.py`` reads ``finegrained_tp_config`` with these four sizes.
FINEGRAINED_RELEASES = frozenset({"0.23.0"})
SRC = "vllm_ascend/ascend_config.py"
#: engine key of each module degree (``finegrained_tp_config`` sub-keys, v0.23.0)
ENGINE_KEYS = {
    "o_proj_tp": "oproj_tensor_parallel_size",
    "lm_head_tp": "lmhead_tensor_parallel_size",
    "embedding_tp": "embedding_tensor_parallel_size",
    "mlp_tp": "mlp_tensor_parallel_size",
}
SECTION = "finegrained_tp_config"
SHARED_EXPERT_DP_KEY = "enable_shared_expert_dp"
#: Activations crossing a module collective are BF16 (the all-gather precedes the W8A8 quantisation:
#: ops/linear_op.py MLPColumnParallelOp.apply_impl, v0.23.0).
ACT_BYTES = 2


@dataclass(frozen=True)
class ModuleDegrees:
    """Module TP degrees over DP ranks (1 = off) and the shared expert's DP switch."""

    o_proj_tp: int = 1
    lm_head_tp: int = 1
    embedding_tp: int = 1
    mlp_tp: int = 1
    shared_expert_dp: bool = False

    @classmethod
    def from_stage(cls, stage: StageConfig) -> "ModuleDegrees":
        """The degrees a stage config asks for."""
        m = stage.modules
        return cls(m.o_proj_tp, m.lm_head_tp, m.embedding_tp, m.mlp_tp, m.shared_expert_dp)

    @classmethod
    def from_json(cls, data: dict | None) -> "ModuleDegrees":
        """The degrees of a Plan's ``config[role]["modules"]`` (absent: all 1)."""
        data = data or {}
        return cls(*(int(data.get(k, 1)) for k in ENGINE_KEYS), bool(data.get("shared_expert_dp", False)))

    @property
    def uniform(self) -> bool:
        """True when no module deviates from the stage's dp x tp layout."""
        return self == ModuleDegrees()

    def tp_sizes(self) -> dict[str, int]:
        """Stack key -> degree for the four module TP sizes."""
        return {k: getattr(self, k) for k in ENGINE_KEYS}

    def describe(self) -> str:
        """Short text such as ``mlp TP8, lm_head TP8`` (``uniform`` when none)."""
        parts = [f"{k.removesuffix('_tp')} TP{v}" for k, v in self.tp_sizes().items() if v > 1]
        if self.shared_expert_dp:
            parts.append("shared expert DP")
        return ", ".join(parts) or "uniform"


# ---------------------------------------------------------------- rules (vLLM-Ascend 0.23.0)

def check_modules(config: StackConfig, version: str, graph_mode: dict[Role, bool],
                  recompute: dict[Role, bool]) -> list[Problem]:
    """Every per-module rule of the release for both stages; ``graph_mode`` / ``recompute`` per role as rendered."""
    problems: list[Problem] = []
    for role in ("prefill", "decode"):
        problems += check_stage_modules(config, role, version, graph_mode[role], recompute[role])
    return problems


def check_stage_modules(config: StackConfig, role: Role, version: str, graph: bool, recompute: bool) -> list[Problem]:
    """The rules for one stage; each Problem names ``<role>.modules.<key>`` and the fix."""
    stage = config.stage(role)
    d = ModuleDegrees.from_stage(stage)
    if d.uniform:
        return []
    at = f"{role}.modules"
    if version not in FINEGRAINED_RELEASES:
        key = next((k for k, v in d.tp_sizes().items() if v > 1), "shared_expert_dp")
        return [Problem(f"{at}.{key}", f"vLLM-Ascend {version} has no finegrained_tp_config with these sizes "
                        f"(it is read from {SRC} of v0.23.0)", getattr(d, key), "use engine.vllm_ascend_version 0.23.0 "
                        "or remove the module degrees")]
    problems: list[Problem] = []
    for key, size in d.tp_sizes().items():
        if size > 1 and stage.dp % size:
            problems.append(Problem(f"{at}.{key}", f"must divide {role}.dp {stage.dp}: module groups are consecutive DP "
                                    f"ranks ({SRC} FinegrainedTPConfig: 'finegrained tp sizes must divide by "
                                    "data_parallel_size', v0.23.0)", size, f"use a divisor of {stage.dp}"))
    if d.o_proj_tp > 1:
        if role != "decode":
            problems.append(Problem(f"{at}.o_proj_tp", f"o_proj TP runs only on a KV consumer (decode) ({SRC} "
                                    "FinegrainedTPConfig, v0.23.0)", d.o_proj_tp, "remove it from prefill"))
        if stage.tp != 1:
            problems.append(Problem(f"{at}.o_proj_tp", f"o_proj TP needs tensor_parallel_size 1 ({SRC} "
                                    f"FinegrainedTPConfig, v0.23.0); {role}.tp is {stage.tp}", d.o_proj_tp,
                                    f"set {role}.tp to 1 (and dp to {stage.dp * stage.tp}) or remove o_proj_tp"))
        if not graph:
            problems.append(Problem(f"{at}.o_proj_tp", f"o_proj TP is only supported in graph mode ({SRC} "
                                    "FinegrainedTPConfig: enforce_eager refused, v0.23.0)", d.o_proj_tp,
                                    f"set {role}.graph_mode true or remove o_proj_tp"))
    for key in ("o_proj_tp", "embedding_tp"):
        if getattr(d, key) > 1 and not recompute:
            problems.append(Problem(f"{at}.{key}", f"{key.removesuffix('_tp')} TP needs recompute_scheduler_enable: its "
                                    f"cross-DP collectives need equal token counts ({SRC} AscendConfig.__init__, v0.23.0); "
                                    "the kit runs the recompute scheduler on decode only", getattr(d, key),
                                    "remove it" if role == "prefill" else "leave decode.recompute_scheduler on (unset or true)"))
    if d.mlp_tp > 1 and config.model.num_dense_layers == 0:
        problems.append(Problem(f"{at}.mlp_tp", "mlp TP shards only dense FFN layers (vllm_ascend/ops/linear_op.py "
                                "_get_column_parallel_op: not is_moe_layer, v0.23.0); the model has none", d.mlp_tp,
                                "remove it"))
    if d.shared_expert_dp and (stage.tp == 1 or stage.ep == 1):
        problems.append(Problem(f"{at}.shared_expert_dp", f"enable_shared_expert_dp counts only with expert parallelism "
                                f"and tensor_parallel_size > 1 ({SRC} AscendConfig.__init__, v0.23.0); {role} has tp "
                                f"{stage.tp}, ep {stage.ep}, so the engine would silently ignore it", True,
                                "remove it, or use it on a stage with tp > 1 and ep > 1"))
    return problems


def additional_config_entries(d: ModuleDegrees) -> dict:
    """The ``--additional-config`` entries of the degrees, spelt as v0.23.0 reads them (empty when uniform)."""
    out: dict = {}
    sizes = {ENGINE_KEYS[k]: v for k, v in d.tp_sizes().items() if v > 1}
    if sizes:
        out[SECTION] = sizes
    if d.shared_expert_dp:
        out[SHARED_EXPERT_DP_KEY] = True
    return out


# ---------------------------------------------------------------- memory per module

def module_weight_bytes(model: ModelShape, tp: int, d: ModuleDegrees, mtp: bool = False) -> dict[str, float]:
    """Non-expert weight bytes per NPU by module under ``tp`` and the module degrees.

    attention (without o_proj) / tp; o_proj / (tp x o_proj_tp); dense FFN / (tp x mlp_tp);
    shared experts / tp (/ 1 with shared_expert_dp); router / tp; embedding and LM head in BF16
    / (tp x their degree). Layers include the MTP layer when ``mtp``.
    """
    w = model.weight_bytes_per_param
    layers = model.num_layers + (model.num_mtp_layers if mtp else 0)
    moe_layers = model.num_moe_layers + (model.num_mtp_layers if mtp else 0)
    o_proj = model.num_attention_heads * model.v_head_dim * model.hidden_size
    attn = model.attention_params_per_layer - o_proj
    dense = model.num_dense_layers * 3 * model.hidden_size * model.dense_intermediate_size
    shared = moe_layers * model.num_shared_experts * model.params_per_expert
    router = moe_layers * model.num_routed_experts * model.hidden_size
    table = model.vocab_size * model.hidden_size * EMBEDDING_BYTES
    return {
        "attention": layers * attn * w / tp,
        "o_proj": layers * o_proj * w / (tp * d.o_proj_tp),
        "dense_ffn": dense * w / (tp * d.mlp_tp),
        "shared_experts": shared * w / (1 if d.shared_expert_dp else tp),
        "router": router * w / tp,
        "embedding": table / (tp * d.embedding_tp),
        "lm_head": table / (tp * d.lm_head_tp),
    }


def weight_bytes_per_npu(model: ModelShape, stage: StageConfig) -> float:
    """All weight bytes per NPU of a stage: :meth:`ModelShape.weight_bytes_per_npu` plus the module degrees' change."""
    base = model.weight_bytes_per_npu(stage.tp, stage.ep, stage.redundant_experts, stage.mtp)
    return base + weight_delta_bytes(model, stage.tp, ModuleDegrees.from_stage(stage), stage.mtp)


def weight_delta_bytes(model: ModelShape, tp: int, d: ModuleDegrees, mtp: bool = False) -> float:
    """Bytes per NPU the module degrees add (negative: save) against the uniform dp x tp layout."""
    if d.uniform:
        return 0.0
    return sum(module_weight_bytes(model, tp, d, mtp).values()) - sum(module_weight_bytes(model, tp, ModuleDegrees(), mtp).values())


# ---------------------------------------------------------------- communication per step

@dataclass(frozen=True)
class Collective:
    """One kind of collective a module adds per step: ``count`` calls, each sending ``bytes_sent`` per NPU in a group of ``group``."""

    module: str
    op: str
    count: int
    bytes_sent: float
    group: int


def module_collectives(model: ModelShape, tp: int, d: ModuleDegrees, tokens: float, sampled_tokens: float,
                       mtp: bool = False) -> list[Collective]:
    """Collectives the module degrees add to one step of a DP rank with ``tokens`` tokens (``sampled_tokens`` reach the LM head).

    Group of ``n``: n ranks of one module group; an all-gather or reduce-scatter of a per-rank
    chunk of C bytes sends (n - 1) x C per NPU (full mesh: each peer's chunk over its own link):
    - mlp TP (ops/linear_op.py MLPColumnParallelOp / MLPRowParallelOp): per dense layer an all-gather of
      the layer input and a reduce-scatter of its output, C = tokens x hidden x 2 B;
    - o_proj TP (OProjRowParallelOp): per layer an all-to-all of the attention output (tokens x heads x
      v_head_dim x 2 B, (n-1)/n of it leaves) and a reduce-scatter of the projection, C = tokens x hidden x 2 B;
    - lm_head TP (ops/vocab_parallel_embedding.py _get_logits_lmheadtp): an all-gather of the sampled
      hidden states and an all-to-all of the logits (sampled x vocab x 2 B, (n-1)/n of it leaves);
    - embedding TP (_forward_embed_tp): an all-gather of token ids (8 B each) and a reduce-scatter of the
      embeddings, C = tokens x hidden x 2 B.
    shared_expert_dp adds none (the shared expert runs on the rank's own tokens).
    """
    h = model.hidden_size
    layers = model.num_layers + (model.num_mtp_layers if mtp else 0)
    act = tokens * h * ACT_BYTES
    out: list[Collective] = []
    n = d.mlp_tp
    if n > 1 and model.num_dense_layers:
        out.append(Collective("mlp", "all_gather", model.num_dense_layers, (n - 1) * act, n))
        out.append(Collective("mlp", "reduce_scatter", model.num_dense_layers, (n - 1) * act, n))
    n = d.o_proj_tp
    if n > 1:
        attn_out = tokens * model.num_attention_heads * model.v_head_dim * ACT_BYTES
        out.append(Collective("o_proj", "all_to_all", layers, (n - 1) / n * attn_out, n))
        out.append(Collective("o_proj", "reduce_scatter", layers, (n - 1) * act, n))
    n = d.lm_head_tp
    if n > 1:
        out.append(Collective("lm_head", "all_gather", 1, (n - 1) * sampled_tokens * h * ACT_BYTES, n))
        out.append(Collective("lm_head", "all_to_all", 1, (n - 1) / n * sampled_tokens * model.vocab_size * ACT_BYTES, n))
    n = d.embedding_tp
    if n > 1:
        out.append(Collective("embedding", "all_gather", 1, (n - 1) * tokens * 8, n))
        out.append(Collective("embedding", "reduce_scatter", 1, (n - 1) * act, n))
    return out


# ---------------------------------------------------------------- the seed's A2 layout, part by part

def seed_layout_notes(config: dict, hardware: str) -> list[tuple[str, str, str, str]]:
    """(stage, part of Huawei's A2 layout, how this stack expresses it or ``-``, why not) for DEPLOYMENT.md.

    ``config`` is a Plan's validated config data. Empty for hardware other than the Atlas 800I A2 the
    layout was published for (facts file, section 1).
    """
    if hardware != "atlas-800i-a2":
        return []
    rows: list[tuple[str, str, str, str]] = []
    d, p = config["decode"], config["prefill"]
    dm = ModuleDegrees.from_json(d.get("modules"))
    dnpus = d["dp"] * d["tp"]
    rows.append(("decode", "attention DP32 with weight absorption",
                 f"dp {d['dp']}, tp {d['tp']}" if d["tp"] == 1 else "-",
                 "absorbed MLA is the engine's decode path at tp 1 (no key)" if d["tp"] == 1 else
                 f"decode.tp is {d['tp']}: attention is TP-sharded"))
    ffn_ok = dm.mlp_tp == 8
    rows.append(("decode", "dense FFN DP4 x TP8", f"modules.mlp_tp 8 ({dnpus // 8 // max(d['tp'], 1)} groups of 8 DP ranks)"
                 if ffn_ok else "-", "" if ffn_ok else "set decode.modules.mlp_tp: 8 (finegrained_tp_config)"))
    rows.append(("decode", "MoE EP32", f"ep {d['ep']}" if d["ep"] == dnpus else "-", ""))
    rows.append(("prefill", "attention pre-processing DP16", "-",
                 "vLLM-Ascend 0.23.0 shards the q/kv down-projections with the stage's tp; no key replicates them per "
                 "rank inside a TP group (FlashComm1, rendered on TP prefill as enable_flashcomm1, only splits the "
                 "tokens around them)"))
    rows.append(("prefill", "attention TP16", f"tp {p['tp']}" if p["tp"] == 16 else "-",
                 "" if p["tp"] == 16 else f"the stage runs TP{p['tp']} inside one node: a TP16 group would span two "
                 "nodes and put every layer's all-reduce on the inter-node network"))
    rows.append(("prefill", "post-processing DP8 + TP2 (o_proj)", "-",
                 "oproj_tensor_parallel_size runs only on decode (KV consumer) with tensor_parallel_size 1 and graph "
                 "mode (vllm_ascend/ascend_config.py FinegrainedTPConfig, v0.23.0)"))
    rows.append(("prefill", "dense FFN fully DP", "-",
                 "mlp_tensor_parallel_size groups DP ranks on top of tp (distributed/parallel_state.py); nothing "
                 "un-shards a dense FFN inside a TP group (ops/linear_op.py get_parallel_op, v0.23.0)"))
    pnpus = p["dp"] * p["tp"]
    rows.append(("prefill", "MoE EP16", f"ep {p['ep']}" if p["ep"] == pnpus else "-", ""))
    rows.append(("prefill", "micro-batching (about 3095 tokens/s per NPU)", "-",
                 "vLLM's two-micro-batch overlap (--enable-dbo) is reset to False on Ascend "
                 "(vllm_ascend/platform.py _fix_incompatible_config, v0.23.0); the stack key micro_batching is refused"))
    return rows
