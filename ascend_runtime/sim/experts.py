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
Where ``T * k * p >= NORMAL_FROM`` the Poisson is drawn as its normal
approximation ``round(lam + sqrt(lam) * z)``, with ``z`` a slice at a random
offset of a table of standard normals drawn once (a step then costs a few
array operations, not 15k Poisson draws); smaller means stay Poisson.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import numpy as np

DRIFT_EVERY = 16
#: Expected loads at or above this use the normal approximation of the Poisson.
NORMAL_FROM = 25.0
NOISE_TABLE = 1 << 18


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
        self._steps = 0
        self._noise = self._rng.standard_normal(max(NOISE_TABLE, 2 * layers * experts))
        self._set_probs(self._softmax())

    def _set_probs(self, probs: np.ndarray) -> None:
        self._probs = probs
        self._sqrt_probs = np.sqrt(probs)
        self._pmax = float(probs.max())

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
        n = float(tokens * self.top_k)
        if n * self._pmax < NORMAL_FROM:
            loads = self._rng.poisson(n * self._probs)
        else:
            size = self._probs.size
            off = int(self._rng.integers(0, self._noise.size - size + 1))
            x = self._noise[off:off + size].reshape(self._probs.shape) * self._sqrt_probs
            x *= np.sqrt(n)
            x += n * self._probs
            x += 0.5
            np.maximum(x, 0.0, out=x)
            loads = x.astype(np.int64)
            small = np.flatnonzero(self._probs.ravel() < NORMAL_FROM / n)
            if small.size:
                loads.ravel()[small] = self._rng.poisson(n * self._probs.ravel()[small])
        self._steps += 1
        if self._steps % DRIFT_EVERY == 0:
            a = min(1.0, self._drift_rate * DRIFT_EVERY)
            self._drift *= 1.0 - a
            self._drift += self._rng.normal(0.0, self._drift_sigma * np.sqrt(a * (2 - a)), size=self._drift.shape)
            self._set_probs(self._softmax())
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
        # replica index of each slot among the copies of its expert (0 for the first copy, in slot order)
        order = np.argsort(flat, axis=1, kind="stable")
        srt = np.take_along_axis(flat, order, axis=1)
        pos = np.broadcast_to(np.arange(flat.shape[1]), flat.shape)
        start = np.where(np.concatenate([np.ones((L, 1), bool), srt[:, 1:] != srt[:, :-1]], axis=1), pos, 0)
        start = np.maximum.accumulate(start, axis=1)
        idx = np.empty_like(flat)
        np.put_along_axis(idx, order, pos - start, axis=1)
        self._replica_index = idx
        self._rows = np.arange(L)[:, None]
        # rank_loads fast path: flat take indices; only slots of replicated experts need the split
        self._lin = (self._rows * experts + flat).ravel()
        c = self._replicas[self._rows, flat].ravel()
        self._multi = np.flatnonzero(c > 1)
        self._multi_c = c[self._multi]
        self._multi_idx = idx.ravel()[self._multi]

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
        s = loads.ravel().take(self._lin)
        if self._multi.size:
            pm = s[self._multi]
            s[self._multi] = pm // self._multi_c + (self._multi_idx < pm % self._multi_c)
        s3 = s.reshape(self.layers, self.ranks, self.slots_per_rank)
        return s3.sum(axis=2), np.count_nonzero(s3, axis=2)

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
    reps = np.ones((L, E), dtype=np.int64)
    w_all = load.astype(float) + 1e-9
    for l in range(L):
        w = w_all[l]
        heap = [(-w[e], e) for e in range(E)]
        heapq.heapify(heap)
        for _ in range(total - E):
            _, e = heapq.heappop(heap)
            reps[l, e] += 1
            heapq.heappush(heap, (-w[e] / reps[l, e], e))
    # replicas heaviest first (ties: higher expert id first), one row per layer; all layers packed at once
    ids = np.repeat(np.tile(np.arange(E), L), reps.ravel()).reshape(L, total)
    share = np.take_along_axis(w_all / reps, ids, axis=1)
    order = np.lexsort((-ids, -share), axis=1)
    ids = np.take_along_axis(ids, order, axis=1)
    share = np.take_along_axis(share, order, axis=1)
    rank_w = np.zeros((L, ranks))
    count = np.zeros((L, ranks), dtype=np.int64)
    held = np.zeros((L, ranks, E), dtype=bool)
    out = np.zeros((L, ranks, slots_per_rank), dtype=np.int64)
    rows = np.arange(L)
    for j in range(total):
        e = ids[:, j]
        room = count < slots_per_rank
        ok = room & ~held[rows, :, e]
        ok = np.where(ok.any(axis=1)[:, None], ok, room)
        pick = np.where(ok, rank_w, np.inf).argmin(axis=1)  # lightest eligible rank, lowest id on ties
        out[rows, pick, count[rows, pick]] = e
        count[rows, pick] += 1
        held[rows, pick, e] = True
        rank_w[rows, pick] += share[:, j]
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


def record_dumps(router: ExpertRouter, directory: Any, windows: int, steps_per_window: int, tokens_per_step: int,
                 ranks: int = 1) -> list[Any]:
    """Record the router's load as dump snapshots the balancer reads (``balance plan --history``,
    ``balance evaluate --load-dir``): ``directory/w<NNNN>/rank_<r>.json`` per window, each the
    cumulative ``[L x E]`` tokens rank ``r`` routed (the ``DirLoadSource`` format; the step's tokens
    split evenly over ``ranks`` DP ranks). Returns the snapshot directories, oldest first.

    The format is the kit's own: vLLM-Ascend v0.23.0/v0.11.0 and vLLM 0.23.0 write no expert-load
    file (``balancer/sources.py`` lists what they keep in memory); counts are JSON integers, keys in
    the order ``rank, seq, layers, experts, expert_load`` (``tests/balancer/test_dump_formats.py``)."""
    import json
    from pathlib import Path

    root = Path(directory)
    total = np.zeros((ranks, router.layers, router.experts))
    out = []
    for w in range(windows):
        for _ in range(steps_per_window):
            for r in range(ranks):
                total[r] += router.route(max(tokens_per_step // ranks, 1))
        snap = root / f"w{w:04d}"
        snap.mkdir(parents=True, exist_ok=True)
        for r in range(ranks):
            doc = {"rank": r, "seq": w + 1, "layers": router.layers, "experts": router.experts,
                   "expert_load": total[r].astype(np.int64).tolist()}
            tmp = snap / f".rank_{r}.json.tmp"
            tmp.write_text(json.dumps(doc))
            tmp.replace(snap / f"rank_{r}.json")
        out.append(snap)
    return out
