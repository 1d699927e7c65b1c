"""Replay recorded expert load through balancing policies: modelled MoE time, moves, balancedness.

Input: ``history [W, L, E]`` (tokens routed per window, oldest first) and a :class:`StageModel`
per stage. For each policy x redundant-expert count x rebalance interval (windows), the replay
starts from the engine's initial map (no redundant replicas balanced); before window ``t``
(every ``interval`` windows from ``t = 1``) the policy plans on the windows before ``t`` with
the map in service as ``previous``; window ``t`` is measured under the map in service.

Per window: vLLM balancedness, and the modelled MoE time per engine step (seconds):

    moe_step = sum over MoE layers (+ the MTP layer as the mean layer) of
               max over ranks (slots * c_slot + rank tokens per step * c_token)
             + move_time / steps until the next rebalance

with ``c_slot`` the time to read one expert's weights from HBM, ``c_token`` one token-expert
assignment's FLOPs at the device's rate, rank tokens per step the window's rank load scaled to
the stage's batch (the window's routing shares times ``tokens_per_step`` token-expert
assignments per step), a window ``window_steps`` engine steps long, and ``move_time`` the
largest number of expert-weight bytes any rank must receive at a rebalance over its link
bandwidth (the EP group's mix of intra- and inter-node links, ``ascend_runtime.hardware``).
Moving is charged as if it did not overlap compute (vLLM-Ascend transfers layer by layer
between steps: ``vllm_ascend/eplb/core/eplb_device_transfer_loader.py``, v0.23.0), an upper bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ascend_runtime.balancer.eplb_greedy import eplb_greedy, trivial_placement
from ascend_runtime.balancer.measure import balancedness, rank_loads

#: policies the replay knows; ``ENGINE_POLICY`` names those vLLM-Ascend 0.23.0 runs in-engine
#: (``eplb_policy_type``: default = DeepSeek's EPLB greedy, swift_balancer, flashlb)
POLICIES = ("none", "greedy", "swift_balancer", "flashlb", "ours")
ENGINE_POLICY = {"greedy": "default", "swift_balancer": "swift_balancer", "flashlb": "flashlb"}
#: windows of history a policy is given at most (FlashLB's sample buffer is 64 windows upstream)
MAX_HISTORY = 16


@dataclass(frozen=True)
class StageModel:
    """One stage's instance shape and costs. Times in seconds, sizes in bytes."""

    role: str
    ranks: int  # EP size
    experts: int
    layers: int  # MoE layers in the load
    mtp: bool
    tokens_per_step: float  # token-expert assignments per engine step of one instance
    c_slot: float  # s to read one expert's weights (per resident slot, per layer, per step)
    c_token: float  # s per token-expert assignment on a rank
    bytes_per_expert: float
    link_bytes_per_s: float  # per device, the EP group's mix of intra/inter-node links
    redundant: int  # the stack's current redundant_experts
    eplb_allowed: bool = True  # False where the release's EPLB guide advises against EPLB
    eplb_refusal: str = ""

    def slots(self, redundant: int) -> int | None:
        """Slots per rank for ``redundant`` extra experts, or None if they do not divide evenly."""
        total = self.experts + redundant
        return total // self.ranks if total % self.ranks == 0 else None


@dataclass
class Replay:
    """One replay's series (per measured window) and totals."""

    policy: str
    redundant: int
    interval: int
    balancedness: list[float] = field(default_factory=list)
    moe_ms: list[float] = field(default_factory=list)  # per step, moving included
    moved_slots: int = 0
    rebalances: int = 0

    @property
    def mean_moe_ms(self) -> float:
        return float(np.mean(self.moe_ms)) if self.moe_ms else float("nan")

    @property
    def mean_balancedness(self) -> float:
        return float(np.mean(self.balancedness)) if self.balancedness else float("nan")


def stage_models(config) -> dict[str, StageModel]:
    """Both stages of a ``StackConfig`` as replay models (model shape, hardware catalogue, guide rules)."""
    from ascend_runtime.hardware import hardware_spec
    from ascend_runtime.planner.engine_rules import EPLB_MAX_DECODE_EXPERTS_PER_DIE, EPLB_MIN_PREFILL_PROMPT
    from ascend_runtime.perf.profiles import HARDWARE

    m = config.model
    spec, prof = hardware_spec(config.hardware), HARDWARE[config.hardware]
    out = {}
    for role in ("prefill", "decode"):
        st = config.stage(role)
        per_node = st.devices_per_node or spec.devices_per_node
        out[role] = _model(role, st.ep, m, st.mtp, _tokens_per_step(role, st, m), prof.hbm_bandwidth, prof.flops,
                           spec.intra_node_gbps * 1e9, spec.inter_node_gbps * 1e9, per_node, st.redundant_experts)
        if role == "prefill" and config.throughput_check.input_len < EPLB_MIN_PREFILL_PROMPT:
            out[role] = _refused(out[role], f"prefill prompts under {EPLB_MIN_PREFILL_PROMPT} tokens")
        if role == "decode" and m.num_routed_experts / st.ep <= EPLB_MAX_DECODE_EXPERTS_PER_DIE:
            out[role] = _refused(out[role], f"{m.num_routed_experts / st.ep:g} routed experts per die "
                                            f"(<= {EPLB_MAX_DECODE_EXPERTS_PER_DIE})")
    return out


def _refused(model: StageModel, why: str) -> StageModel:
    from dataclasses import replace

    return replace(model, eplb_allowed=False, eplb_refusal=f"the vLLM-Ascend EPLB guide advises against EPLB with {why}")


def _tokens_per_step(role: str, stage, shape) -> float:
    """Token-expert assignments one instance routes per step: a full batch (decode with MTP: 2 tokens a sequence)."""
    if role == "decode":
        return stage.dp * stage.max_num_seqs * (2 if stage.mtp else 1) * shape.experts_per_token
    return stage.dp * stage.max_num_batched_tokens * shape.experts_per_token


def _model(role, ranks, shape, mtp, tokens_per_step, hbm, flops, intra, inter, per_node, redundant) -> StageModel:
    bpe = shape.params_per_expert * shape.weight_bytes_per_param
    local = min(per_node, ranks) - 1
    remote = ranks - 1 - local
    link = (ranks - 1) / (local / intra + remote / inter) if ranks > 1 else intra
    return StageModel(role, ranks, shape.num_routed_experts, shape.num_moe_layers, mtp, float(tokens_per_step),
                      bpe / hbm, 2.0 * shape.params_per_expert / flops, bpe, link, redundant)


def plan(policy: str, past: np.ndarray, ranks: int, slots: int, previous: np.ndarray, since: int = 1) -> np.ndarray:
    """Placement ``[L, R*S]`` of ``policy`` from ``past [W, L, E]`` with ``previous`` in service;
    ``since``: windows since the last rebalance (SwiftBalancer's heat is what was collected since)."""
    from ascend_runtime.balancer.baselines import flashlb, swift_balancer
    from ascend_runtime.balancer.forecast import LoadForecaster
    from ascend_runtime.balancer.placement import plan_placement

    past = past[-MAX_HISTORY:]
    if policy == "none":
        return previous
    if policy == "greedy":
        return eplb_greedy(past[-1], ranks, slots)
    if policy == "swift_balancer":
        return swift_balancer.place(past[-since:], ranks, slots, previous)
    if policy == "flashlb":
        return flashlb.place(past, ranks, slots, previous)
    if policy == "ours":
        fc = LoadForecaster()
        for w in past:
            fc.update(w)
        f = fc.forecast()
        return plan_placement(f.mean, ranks, slots, previous=previous, std=f.std, holdout=f.holdout, last=f.last,
                              history=f.history).placement
    raise ValueError(f"unknown policy {policy!r}; choose from {', '.join(POLICIES)}")


def moved_bytes_peak(previous: np.ndarray, new: np.ndarray, ranks: int, experts: int, bytes_per_expert: float) -> tuple[int, float]:
    """(slots newly loaded in total, largest bytes one rank receives) going from ``previous`` to ``new``."""
    layers, total = new.shape
    slots = total // ranks

    def counts(p: np.ndarray) -> np.ndarray:  # [L, R, E] replicas of each expert on each rank
        cell = (np.arange(layers)[:, None] * ranks + np.repeat(np.arange(ranks), slots)[None, :]) * experts + p
        return np.bincount(cell.ravel(), minlength=layers * ranks * experts).reshape(layers, ranks, experts)

    gained = np.maximum(counts(new) - counts(previous), 0)
    per_rank = gained.sum(axis=(0, 2))
    return int(gained.sum()), float(per_rank.max()) * bytes_per_expert


def replay(history: np.ndarray, model: StageModel, policy: str, redundant: int, interval: int,
           window_steps: int = 600) -> Replay:
    """Replay ``history [W, L, E]`` through one setting; see the module docstring."""
    slots = model.slots(redundant)
    if slots is None or slots * model.ranks < model.experts:
        raise ValueError(f"{model.experts} experts + {redundant} redundant do not fill {model.ranks} ranks evenly")
    w, layers, experts = history.shape
    out = Replay(policy, redundant, interval)
    service = trivial_placement(layers, experts, model.ranks, slots)
    move_s = 0.0
    extra = (1 + 1 / layers) if model.mtp else 1.0  # the MTP layer counted as the mean MoE layer
    for t in range(1, w):
        if (t - 1) % interval == 0 and policy != "none":
            new = plan(policy, history[:t], model.ranks, slots, service, interval)
            moved, peak_bytes = moved_bytes_peak(service, new, model.ranks, experts, model.bytes_per_expert)
            out.moved_slots += moved
            out.rebalances += 1
            move_s = peak_bytes / model.link_bytes_per_s
            service = new
        window = history[t]
        # the window's routing shares at the stage's batch: token-expert assignments per rank per step [L, R]
        scale = model.tokens_per_step / np.maximum(window.sum(axis=1, keepdims=True), 1e-9)
        per_step = rank_loads(service, window * scale, model.ranks)
        layer_s = (slots * model.c_slot + per_step * model.c_token).max(axis=1).sum() * extra
        amortised = move_s / (window_steps * interval)
        out.moe_ms.append((layer_s + amortised) * 1e3)
        out.balancedness.append(balancedness(service, window, model.ranks))
    return out


def redundancy_options(model: StageModel) -> list[int]:
    """Redundant-expert counts tried: 0, the stack's, one and two per rank (those that fill ranks evenly)."""
    opts = {0, model.redundant, model.ranks, 2 * model.ranks}
    return sorted(r for r in opts if model.slots(r) is not None)


def evaluate(history: np.ndarray, model: StageModel, policies: list[str], intervals: list[int],
             progress=None, window_steps: int = 600) -> list[Replay]:
    """Every policy x redundancy x interval for one stage (``none`` once per redundancy, interval 1)."""
    out = []
    for red in redundancy_options(model):
        for policy in policies:
            for k in ([1] if policy == "none" else intervals):
                if progress:
                    progress(f"{model.role}: {policy} redundant={red} interval={k}")
                out.append(replay(history, model, policy, red, k, window_steps))
    return out


def recommend(model: StageModel, replays: list[Replay], window_steps: int) -> dict:
    """The engine setting with the lowest mean MoE time per step (ours reported beside it).

    Returns ``{"role", "redundant_experts", "eplb": {...} | None, "moe_ms", "replay", "ours", "note"}``."""
    engine = [r for r in replays if r.policy in ENGINE_POLICY or r.policy == "none"]
    if not model.eplb_allowed:
        engine = [r for r in engine if r.policy == "none" and r.redundant == 0]
    best = min(engine, key=lambda r: r.mean_moe_ms)
    ours = [r for r in replays if r.policy == "ours"]
    best_ours = min(ours, key=lambda r: r.mean_moe_ms) if ours else None
    eplb = None
    if best.policy != "none":
        eplb = {"mode": "dynamic", "policy": ENGINE_POLICY[best.policy],
                "heat_collection_interval": int(best.interval * window_steps)}
    note = model.eplb_refusal if not model.eplb_allowed else ""
    return {"role": model.role, "redundant_experts": best.redundant if best.policy != "none" else 0, "eplb": eplb,
            "moe_ms": best.mean_moe_ms, "replay": best, "ours": best_ours, "note": note}


def recommendation_yaml(recs: list[dict]) -> str:
    """The stack settings to paste (``ascend-deepseek:<stage>`` keys of a Pulumi stack file)."""
    lines = ["config:"]
    for rec in recs:
        lines.append(f"  ascend-deepseek:{rec['role']}:")
        if rec["note"]:
            lines.append(f"    # {rec['note']}")
        lines.append(f"    redundant_experts: {rec['redundant_experts']}")
        if rec["eplb"] is None:
            lines.append("    # no eplb key (remove it if present)")
        else:
            lines.append("    eplb:")
            lines += [f"      {k}: {v}" for k, v in rec["eplb"].items()]
    return "\n".join(lines) + "\n"


def moves_per_hour(r: Replay, windows: int, window_seconds: float) -> float:
    """Expert slots newly loaded per hour of service (replayed windows of ``window_seconds``)."""
    return r.moved_slots / max(windows * window_seconds, 1e-9) * 3600.0 if not math.isnan(window_seconds) else float("nan")
