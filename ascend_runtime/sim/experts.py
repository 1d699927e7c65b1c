"""Expert routing, expert maps and their validation.

Shapes: ``L`` MoE layers (58), ``E`` logical routed experts (256), ``R`` EP
ranks, ``S`` expert slots per rank (``R * S = E + redundant``). Loads are
token-to-expert assignments (each token counts once for each of its top-k
experts), so one step of ``T`` tokens adds ``T * k`` per layer.

Routing: each layer has logits ``base + drift`` over its experts; the
probability of an expert is ``softmax(logits)``. ``base ~ N(0, skew)`` is
fixed by the seed; ``drift`` is an Ornstein-Uhlenbeck walk (stationary
std ``drift_sigma``, relaxation ``1 / drift_rate`` steps), so hot experts
change slowly; the drift is applied every ``DRIFT_EVERY`` steps (cheaper, same
statistics). A step's loads are ``Poisson(T * k * p_l)`` per (layer, expert),
the large-batch limit of top-k sampling, and much cheaper than a multinomial.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np


DRIFT_EVERY = 16


class ExpertRouter:
    """Skewed, slowly drifting, seeded routing of tokens to logical experts."""

    def __init__(
        self,
        layers: int,
        experts: int,
        top_k: int,
        seed: int = 0,
        skew: float = 1.0,
        drift_sigma: float = 0.3,
        drift_rate: float = 2e-4,
    ) -> None:
        self.layers, self.experts, self.top_k = layers, experts, top_k
        self._rng = np.random.default_rng(seed)
        self._base = self._rng.normal(0.0, skew, size=(layers, experts))
        self._drift = self._rng.normal(0.0, drift_sigma, size=(layers, experts))
        self._drift_sigma, self._drift_rate = drift_sigma, drift_rate
        self._probs = self._softmax()
        self._steps = 0

    def _softmax(self) -> np.ndarray:
        z = self._base + self._drift
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def probabilities(self) -> np.ndarray:
        """Current routing probabilities, shape (L, E), rows sum to 1."""
        return self._probs

    def route(self, tokens: int) -> np.ndarray:
        """Loads of one step of ``tokens`` tokens, shape (L, E) int64; then drift one step."""
        if tokens <= 0:
            return np.zeros((self.layers, self.experts), dtype=np.int64)
        loads = self._rng.poisson(float(tokens * self.top_k) * self._probs)
        self._steps += 1
        if self._steps % DRIFT_EVERY == 0:
            a = min(1.0, self._drift_rate * DRIFT_EVERY)
            self._drift *= 1.0 - a
            self._drift += self._rng.normal(0.0, self._drift_sigma * np.sqrt(a * (2 - a)), size=self._drift.shape)
            self._probs = self._softmax()
        return loads


class ExpertMapError(ValueError):
    """An expert map the engine would reject; the message names the problem."""


@dataclass
class ExpertMap:
    """Placement of logical experts on EP rank slots: ``slots[l, r, s]`` = logical expert id."""

    slots: np.ndarray  # (L, R, S) int64

    def __post_init__(self) -> None:
        L, R, S = self.slots.shape
        self.layers, self.ranks, self.slots_per_rank = L, R, S
        flat = self.slots.reshape(L, R * S)
        experts = int(flat.max()) + 1
        self._flat = flat
        self._replicas = np.stack([np.bincount(row, minlength=experts) for row in flat])  # (L, E)
        # replica index of each slot among the copies of its expert (0 for the first copy)
        idx = np.zeros_like(flat)
        for l in range(L):
            seen: dict[int, int] = {}
            for j, e in enumerate(flat[l].tolist()):
                idx[l, j] = seen.get(e, 0)
                seen[e] = idx[l, j] + 1
        self._replica_index = idx
        self._rows = np.arange(L)[:, None]

    # ---- construction -------------------------------------------------
    @classmethod
    def default(cls, layers: int, experts: int, ranks: int, slots_per_rank: int) -> "ExpertMap":
        """vLLM's initial placement: expert e on rank e // (E/R); redundant slots take experts 0, 1, ..."""
        total = ranks * slots_per_rank
        order = [e for e in range(experts)] + [i % experts for i in range(total - experts)]
        # logical experts contiguous by rank, redundant copies in the trailing slots of each rank
        per = experts // ranks if experts % ranks == 0 else None
        rows = []
        if per is not None:
            extra = slots_per_rank - per
            row = []
            red = iter(range(total - experts))
            for r in range(ranks):
                row += list(range(r * per, (r + 1) * per))
                row += [next(red) % experts for _ in range(extra)]
            rows = [row] * layers
        else:
            rows = [order] * layers
        return cls(np.array(rows, dtype=np.int64).reshape(layers, ranks, slots_per_rank))

    @classmethod
    def from_vllm_json(cls, doc: Any, layers: int, experts: int, ranks: int, slots_per_rank: int) -> "ExpertMap":
        """Parse and validate a vLLM-Ascend expert map as the engine would; raise ExpertMapError."""
        if not isinstance(doc, dict):
            raise ExpertMapError("expert map must be a JSON object")
        if doc.get("moe_layer_count") != layers:
            raise ExpertMapError(f"moe_layer_count is {doc.get('moe_layer_count')!r}, the model has {layers} MoE layers")
        layer_list = doc.get("layer_list")
        if not isinstance(layer_list, list) or len(layer_list) != layers:
            n = len(layer_list) if isinstance(layer_list, list) else None
            raise ExpertMapError(f"layer_list has {n} entries, expected {layers}")
        out = np.full((layers, ranks, slots_per_rank), -1, dtype=np.int64)
        seen_layers: set[int] = set()
        for entry in layer_list:
            lid = entry.get("layer_id") if isinstance(entry, dict) else None
            if not isinstance(lid, int) or not 0 <= lid < layers or lid in seen_layers:
                raise ExpertMapError(f"bad or duplicate layer_id {lid!r} (expected each of 0..{layers - 1} once)")
            seen_layers.add(lid)
            if entry.get("device_count") != ranks:
                raise ExpertMapError(
                    f"layer {lid}: device_count is {entry.get('device_count')!r}, the instance has {ranks} EP ranks"
                )
            devices = entry.get("device_list")
            if not isinstance(devices, list) or len(devices) != ranks:
                raise ExpertMapError(f"layer {lid}: device_list must list {ranks} devices")
            seen_dev: set[int] = set()
            for dev in devices:
                did = dev.get("device_id") if isinstance(dev, dict) else None
                if not isinstance(did, int) or not 0 <= did < ranks or did in seen_dev:
                    raise ExpertMapError(f"layer {lid}: bad or duplicate device_id {did!r}")
                seen_dev.add(did)
                ids = dev.get("device_expert")
                if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
                    raise ExpertMapError(f"layer {lid} device {did}: device_expert must be a list of ints")
                if len(ids) != slots_per_rank:
                    raise ExpertMapError(
                        f"layer {lid} device {did}: {len(ids)} slots, every device must have {slots_per_rank} "
                        f"({experts} experts + redundant over {ranks} ranks)"
                    )
                bad = [x for x in ids if not 0 <= x < experts]
                if bad:
                    raise ExpertMapError(f"layer {lid} device {did}: expert ids out of range 0..{experts - 1}: {bad[:5]}")
                out[lid, did] = ids
            missing = sorted(set(range(experts)) - set(out[lid].ravel().tolist()))
            if missing:
                raise ExpertMapError(f"layer {lid}: logical experts missing from every device: {missing[:10]}")
        return cls(out)

    def to_vllm_json(self) -> dict[str, Any]:
        """The vLLM-Ascend expert map JSON of this placement."""
        return {
            "moe_layer_count": self.layers,
            "layer_list": [
                {
                    "layer_id": l,
                    "device_count": self.ranks,
                    "device_list": [
                        {"device_id": r, "device_expert": self.slots[l, r].tolist()} for r in range(self.ranks)
                    ],
                }
                for l in range(self.layers)
            ],
        }

    # ---- loads ----------------------------------------------------------
    def slot_loads(self, loads: np.ndarray) -> np.ndarray:
        """Split expert loads (L, E) evenly over replicas; returns (L, R, S) ints."""
        per = loads[self._rows, self._flat]
        c = self._replicas[self._rows, self._flat]
        out = per // c + (self._replica_index < per % c)
        return out.reshape(self.layers, self.ranks, self.slots_per_rank)

    def rank_loads(self, loads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rank load (L, R), active slots (L, R)) for expert loads (L, E)."""
        s = self.slot_loads(loads)
        return s.sum(axis=2), (s > 0).sum(axis=2)

    def expected_rank_loads(self, probs: np.ndarray) -> np.ndarray:
        """Expected rank load share (L, R) under routing probabilities (L, E)."""
        per = probs[self._rows, self._flat] / self._replicas[self._rows, self._flat]
        return per.reshape(self.layers, self.ranks, self.slots_per_rank).sum(axis=2)


def balancedness(rank_load: np.ndarray) -> float:
    """vLLM's measure: sum over layers of mean rank load / sum over layers of max rank load (1 = perfect)."""
    mx = float(rank_load.max(axis=-1).sum())
    return float(rank_load.mean(axis=-1).sum()) / mx if mx > 0 else 1.0


def balanced_map(load: np.ndarray, ranks: int, slots_per_rank: int) -> ExpertMap:
    """A greedy EPLB placement for expert loads (L, E) (test and benchmark helper, not the balancer).

    Extra replicas go to the expert with the largest load per replica; replicas
    are packed heaviest first onto the lightest rank with a free slot that does
    not already hold that expert.
    """
    L, E = load.shape
    total = ranks * slots_per_rank
    out = np.zeros((L, ranks, slots_per_rank), dtype=np.int64)
    for l in range(L):
        w = load[l].astype(float) + 1e-9
        reps = np.ones(E, dtype=int)
        heap = [(-w[e], e) for e in range(E)]
        heapq.heapify(heap)
        for _ in range(total - E):
            _, e = heapq.heappop(heap)
            reps[e] += 1
            heapq.heappush(heap, (-w[e] / reps[e], e))
        items = sorted(((w[e] / reps[e], e) for e in range(E) for _ in range(reps[e])), reverse=True)
        rank_w = np.zeros(ranks)
        fill = [[] for _ in range(ranks)]
        for share, e in items:
            order = np.argsort(rank_w, kind="stable")
            pick = next((r for r in order if len(fill[r]) < slots_per_rank and e not in fill[r]), None)
            if pick is None:
                pick = next(r for r in order if len(fill[r]) < slots_per_rank)
            fill[pick].append(e)
            rank_w[pick] += share
        out[l] = np.array(fill)
    return ExpertMap(out)


def skewed_map(load: np.ndarray, ranks: int, slots_per_rank: int) -> ExpertMap:
    """A deliberately bad placement: hottest experts packed together on the first ranks (test helper)."""
    L, E = load.shape
    out = np.zeros((L, ranks, slots_per_rank), dtype=np.int64)
    for l in range(L):
        order = list(np.argsort(-load[l], kind="stable"))
        order += order[: ranks * slots_per_rank - E]
        out[l] = np.array(order).reshape(ranks, slots_per_rank)
    return ExpertMap(out)
