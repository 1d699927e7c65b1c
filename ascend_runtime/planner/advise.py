"""Layout advice: candidate per-stage layouts compared with the performance model.

For each stage of a stack, candidates keep the stage's NPUs per instance and hardware and vary
dp x tp and the per-module degrees the release accepts (:mod:`ascend_runtime.planner.modules`
rules; a candidate the rules refuse is not shown). Each is scored with
:mod:`ascend_runtime.perf.model`:

- decode: the largest batch per DP rank with TPOT <= ``slo.tpot_ms`` within ``max_num_seqs`` and KV
  capacity at the workload's mean context (``throughput_check`` input + output / 2); figures at that batch;
- prefill: a full step of ``max_num_batched_tokens`` (prompts of ``throughput_check.input_len``).

Printed per candidate: step time (ms), tokens/s per NPU, HBM headroom per NPU (GiB: budget - weights -
KV at max_num_seqs x context_len - reserve), best first (layouts that fit HBM before those that do not), and the YAML to paste into the stack.
"""

from __future__ import annotations

from dataclasses import dataclass

from ascend_runtime.config.stack import Role, StackConfig, StageConfig
from ascend_runtime.engine.releases import RELEASES
from ascend_runtime.hardware import hardware_spec
from ascend_runtime.perf import model as pm
from ascend_runtime.planner.memory import estimate_memory
from ascend_runtime.planner.engine_rules import runs_micro_batching
from ascend_runtime.planner.modules import ModuleDegrees, check_stage_modules

ROLES: tuple[Role, Role] = ("prefill", "decode")
#: Candidates printed per stage (the stack's own layout is always shown).
SHOWN = 12


@dataclass(frozen=True)
class Candidate:
    """One scored layout of a stage (times in s, HBM in GiB)."""

    role: Role
    dp: int
    tp: int
    modules: ModuleDegrees
    micro_batching: bool
    batch: int
    step_s: float
    tokens_per_s_per_npu: float
    headroom_gib: float
    current: bool = False

    @property
    def label(self) -> str:
        """``DP32 x TP1, mlp TP8`` style description."""
        extra = self.modules.describe()
        text = f"DP{self.dp} x TP{self.tp}" + ("" if extra == "uniform" else f", {extra}")
        return text + (", micro-batching" if self.micro_batching else "")

    def yaml(self) -> str:
        """The stage keys to paste (under ``ascend-deepseek:<role>:``)."""
        lines = [f"  ascend-deepseek:{self.role}:", f"    dp: {self.dp}", f"    tp: {self.tp}"]
        sizes = {k: v for k, v in self.modules.tp_sizes().items() if v > 1}
        if sizes or self.modules.shared_expert_dp:
            lines.append("    modules:")
            lines += [f"      {k}: {v}" for k, v in sizes.items()]
            if self.modules.shared_expert_dp:
                lines.append("      shared_expert_dp: true")
        if self.role == "prefill":
            lines.append(f"    micro_batching: {'true' if self.micro_batching else 'false'}")
        return "\n".join(lines)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _module_options(role: Role, dp: int, tp: int) -> list[ModuleDegrees]:
    """Module degree sets worth comparing on one dp x tp (8: one node of A2 / half a CM384 node)."""
    opts = [ModuleDegrees()]
    sizes = [s for s in (2, 4, 8, 16) if s <= dp and dp % s == 0 and s * tp <= 16]
    for s in sizes:
        opts.append(ModuleDegrees(mlp_tp=s))
        opts.append(ModuleDegrees(mlp_tp=s, lm_head_tp=s))
        if role == "decode" and tp == 1:
            opts.append(ModuleDegrees(o_proj_tp=s))
            opts.append(ModuleDegrees(mlp_tp=s, lm_head_tp=s, embedding_tp=s))
    if tp > 1:
        opts.append(ModuleDegrees(shared_expert_dp=True))
    return opts


def _stage_with(stage: StageConfig, dp: int, tp: int, d: ModuleDegrees, micro: bool) -> StageConfig:
    modules = {"o_proj_tp": d.o_proj_tp, "lm_head_tp": d.lm_head_tp, "embedding_tp": d.embedding_tp,
               "mlp_tp": d.mlp_tp, "shared_expert_dp": d.shared_expert_dp}
    return stage.model_copy(update={"dp": dp, "tp": tp, "ep": dp * tp if stage.ep > 1 else 1,
                                    "modules": stage.modules.model_copy(update=modules), "micro_batching": micro})


def score(config: StackConfig, role: Role, stage: StageConfig, current: bool = False) -> Candidate | None:
    """The performance model's figures for one stage config (None when the shape does not run)."""
    hw = config.hardware
    d = ModuleDegrees.from_stage(stage)
    shape = pm.StageShape(hw, role, stage.dp, stage.tp, stage.redundant_experts, stage.mtp,
                          nodes=stage.nodes_per_instance, max_num_seqs=stage.max_num_seqs,
                          max_num_batched_tokens=stage.max_num_batched_tokens, model=config.model.name,
                          modules=d, micro_batching=stage.micro_batching)
    try:
        shape.sim_config()
    except ValueError:
        return None
    mem = estimate_memory(config.model, stage, hardware_spec(hw))
    headroom = round(mem.budget_gib - mem.total_gib, 2)
    tc = config.throughput_check
    if role == "decode":
        ctx = tc.input_len + tc.output_len / 2
        b = pm.max_decode_batch(shape, ctx, config.slo.tpot_ms / 1e3)
        if b < 1:
            return Candidate(role, stage.dp, stage.tp, d, stage.micro_batching, 0, 0.0, 0.0, headroom, current)
        step = pm.decode_step_s(shape, b, ctx)
        tps = pm.decode_tokens_per_s_per_npu(shape, b, ctx)
    else:
        P = min(tc.input_len, stage.max_num_batched_tokens)
        b = pm.max_prefill_batch(shape, P)
        step = pm.prefill_step_s(shape, P, b)
        tps = pm.prefill_tokens_per_s_per_npu(shape, P, b)
    return Candidate(role, stage.dp, stage.tp, d, stage.micro_batching, b, step, tps, headroom, current)


def honours_micro_batching(version: str) -> bool:
    """Whether the release runs ``--enable-dbo`` (two micro-batches) rather than resetting it on Ascend
    (``EngineRelease.ignored_flags``); candidates with micro-batching are only proposed where it runs."""
    row = RELEASES.get(version)
    return row is not None and runs_micro_batching(row)


def candidates(config: StackConfig, role: Role, version: str, graph: bool, recompute: bool) -> list[Candidate]:
    """Scored candidates of a stage, best tokens/s per NPU first (the stack's own layout marked current)."""
    stage = config.stage(role)
    npus = stage.dp * stage.tp
    per_node = hardware_spec(config.hardware).devices_per_node
    out: list[Candidate] = []
    seen: set[tuple] = set()
    for tp in _divisors(npus):
        if tp > per_node:
            continue
        dp = npus // tp
        for d in _module_options(role, dp, tp):
            for micro in ((False, True) if role == "prefill" and honours_micro_batching(version) else
                          (stage.micro_batching,)):
                cand_stage = _stage_with(stage, dp, tp, d, micro)
                cfg = config.model_copy(update={role: cand_stage})
                if check_stage_modules(cfg, role, version, graph, recompute):
                    continue
                key = (dp, tp, d, micro)
                if key in seen:
                    continue
                seen.add(key)
                c = score(cfg, role, cand_stage, current=(dp, tp, d, micro) == (
                    stage.dp, stage.tp, ModuleDegrees.from_stage(stage), stage.micro_batching))
                if c is not None and c.tokens_per_s_per_npu > 0:
                    out.append(c)
    out.sort(key=lambda c: (c.headroom_gib < 0, -c.tokens_per_s_per_npu, c.step_s))  # layouts that fit HBM first
    return out


def compare(best: Candidate, other: Candidate) -> str:
    """``+x.x% tokens/s per NPU, step -y.y ms`` of ``best`` against ``other``."""
    gain = 100.0 * (best.tokens_per_s_per_npu / other.tokens_per_s_per_npu - 1.0)
    return f"{gain:+.2f}% tokens/s per NPU ({best.tokens_per_s_per_npu:.1f} vs {other.tokens_per_s_per_npu:.1f}), " \
           f"step {1e3 * (best.step_s - other.step_s):+.2f} ms at batch {best.batch} vs {other.batch}"


def seed_decode(config: StackConfig, version: str, graph: bool, recompute: bool) -> tuple[Candidate, Candidate] | None:
    """(Huawei's A2 decode layout: DP x TP1 with dense FFN TP8, uniform DP) of the decode stage, when it applies."""
    stage = config.decode
    npus = stage.dp * stage.tp
    if npus % 8:
        return None
    seed = _stage_with(stage, npus, 1, ModuleDegrees(mlp_tp=8), stage.micro_batching)
    uni = _stage_with(stage, npus, 1, ModuleDegrees(), stage.micro_batching)
    cfg_s = config.model_copy(update={"decode": seed})
    if check_stage_modules(cfg_s, "decode", version, graph, recompute):
        return None
    a = score(cfg_s, "decode", seed)
    b = score(config.model_copy(update={"decode": uni}), "decode", uni)
    return (a, b) if a and b and a.tokens_per_s_per_npu > 0 and b.tokens_per_s_per_npu > 0 else None


def replace_modules(stage: StageConfig, d: ModuleDegrees) -> StageConfig:
    """The stage with other module degrees (helper for tests)."""
    return _stage_with(stage, stage.dp, stage.tp, d, stage.micro_batching)


__all__ = ["Candidate", "candidates", "compare", "score", "seed_decode", "replace_modules"]


def advice_lines(plan: "Plan") -> list[str]:  # noqa: F821  (Plan imported lazily)
    """The advice for a validated Plan as text lines: per stage a table, best first, and its YAML."""
    from ascend_runtime.engine.releases import release  # noqa: PLC0415
    from ascend_runtime.planner.engine_rules import graph_mode_on, recompute_on  # noqa: PLC0415

    config = StackConfig.model_validate(plan.config, strict=False)
    row = release(plan.vllm_ascend_version)
    lines: list[str] = []
    tc = config.throughput_check
    for role in ROLES:
        stage = config.stage(role)
        graph, recompute = graph_mode_on(config, role), recompute_on(config, row, role)
        cands = candidates(config, role, row.version, graph, recompute)
        what = (f"TPOT <= {config.slo.tpot_ms:g} ms, context {tc.input_len + tc.output_len / 2:g}, "
                f"max_num_seqs {stage.max_num_seqs}" if role == "decode"
                else f"prompts of {min(tc.input_len, stage.max_num_batched_tokens)} tokens, "
                     f"max_num_batched_tokens {stage.max_num_batched_tokens}")
        lines.append(f"{role}: {stage.dp * stage.tp} NPUs per instance on {config.hardware}, "
                     f"{'MTP, ' if stage.mtp else ''}{what} (performance model, docs/simulator.md)")
        lines.append(f"  {'#':>2}  {'layout':<52} {'batch':>5} {'step ms':>9} {'tok/s/NPU':>10} {'HBM headroom GiB':>17}")
        shown = [c for i, c in enumerate(cands) if i < SHOWN or c.current]
        for c in shown:
            i = cands.index(c) + 1
            mark = "  (stack)" if c.current else ""
            lines.append(f"  {i:>2}  {c.label:<52} {c.batch:>5} {c.step_s * 1e3:>9.2f} {c.tokens_per_s_per_npu:>10.1f} "
                         f"{c.headroom_gib:>17.2f}{mark}")
        if len(cands) > len(shown):
            lines.append(f"  ({len(cands) - len(shown)} more candidates not shown)")
        if not cands:
            lines.append("  no candidate layout runs this stage's NPUs within its limits")
            continue
        fitting = [c for c in cands if c.headroom_gib >= 0]
        best = fitting[0] if fitting else cands[0]
        lines.append(f"  best{' (fits HBM)' if fitting else ' (none fits HBM)'}: {best.label}; paste:")
        lines += ["    " + y for y in best.yaml().splitlines()]
        if role == "decode":
            pair = seed_decode(config, row.version, graph, recompute)
            if pair:
                seed, uni = pair
                verdict = "above" if seed.tokens_per_s_per_npu > uni.tokens_per_s_per_npu else "below"
                lines.append(f"  seed decode layout (DP{seed.dp} attention, dense FFN TP8 = mlp_tp 8, EP{seed.dp}) ranks "
                             f"{verdict} uniform DP{uni.dp}: {compare(seed, uni)}")
    return lines
