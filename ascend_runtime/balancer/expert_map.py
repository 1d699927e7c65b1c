"""vLLM-Ascend expert map JSON <-> placement array, and the validator.

Map format (``expert_map_path``)::

    {"moe_layer_count": L,
     "layer_list": [{"layer_id": l, "device_count": R,
                     "device_list": [{"device_id": r, "device_expert": [ids in slot order]}]}]}

A placement is ``[L, R*S]`` of logical ids (rank ``r`` owns slots ``r*S..r*S+S-1``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class InvalidExpertMap(ValueError):
    """The map would break an instance; ``problems`` lists every reason found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid expert map: " + "; ".join(problems[:10]) + (" ..." if len(problems) > 10 else ""))


def placement_to_map(placement: np.ndarray, ranks: int) -> dict[str, Any]:
    """``placement [L, R*S]`` -> vLLM-Ascend expert map dict."""
    placement = np.asarray(placement, dtype=np.int64)
    layers = placement.shape[0]
    cells = placement.reshape(layers, ranks, -1).tolist()
    return {
        "moe_layer_count": layers,
        "layer_list": [
            {
                "layer_id": layer,
                "device_count": ranks,
                "device_list": [{"device_id": r, "device_expert": cells[layer][r]} for r in range(ranks)],
            }
            for layer in range(layers)
        ],
    }


def validate_map(
    doc: Any, num_experts: int, ranks: int | None = None, slots: int | None = None, allow_duplicates: bool = False
) -> list[str]:
    """Every problem that makes ``doc`` unsafe to serve; empty when valid.

    Checks: structure and types; layer ids ``0..L-1`` once each; per layer the
    same device count, ids ``0..R-1`` once each; every rank the same slot count
    (and ``ranks``/``slots`` when given); expert ids in ``0..num_experts-1``;
    every logical expert present in every layer; no expert twice on one rank
    (vLLM-Ascend would silently overwrite the earlier slot; ``allow_duplicates``
    relaxes only this, for *reading* a map already in service).
    """
    problems: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("layer_list"), list):
        return ["map must be an object with a 'layer_list' list"]
    layers = doc["layer_list"]
    if doc.get("moe_layer_count") != len(layers):
        problems.append(f"moe_layer_count {doc.get('moe_layer_count')!r} != {len(layers)} layers listed")
    seen_layers: set[int] = set()
    slot_count: int | None = slots
    rank_count: int | None = ranks
    for i, layer in enumerate(layers):
        where = f"layer_list[{i}]"
        if not isinstance(layer, dict) or not isinstance(layer.get("device_list"), list):
            problems.append(f"{where}: needs a 'device_list' list")
            continue
        lid = layer.get("layer_id")
        if not isinstance(lid, int) or lid in seen_layers or not 0 <= lid < len(layers):
            problems.append(f"{where}: layer_id {lid!r} missing, repeated or out of range")
        else:
            seen_layers.add(lid)
        devices = layer["device_list"]
        if layer.get("device_count") != len(devices):
            problems.append(f"{where}: device_count {layer.get('device_count')!r} != {len(devices)} devices")
        if rank_count is None:
            rank_count = len(devices)
        elif len(devices) != rank_count:
            problems.append(f"{where}: {len(devices)} devices, expected {rank_count}")
        dev_ids = [d.get("device_id") if isinstance(d, dict) else None for d in devices]
        if sorted(x for x in dev_ids if isinstance(x, int)) != list(range(len(devices))):
            problems.append(f"{where}: device_ids must be 0..{len(devices) - 1} once each")
        present = np.zeros(num_experts, dtype=bool)
        for d in devices:
            ids = d.get("device_expert") if isinstance(d, dict) else None
            dwhere = f"{where} device {d.get('device_id') if isinstance(d, dict) else '?'}"
            if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
                problems.append(f"{dwhere}: device_expert must be a list of integers")
                continue
            if slot_count is None:
                slot_count = len(ids)
            elif len(ids) != slot_count:
                problems.append(f"{dwhere}: {len(ids)} slots, expected {slot_count} (equal slot counts)")
            bad = [x for x in ids if not 0 <= x < num_experts]
            if bad:
                problems.append(f"{dwhere}: expert ids out of range 0..{num_experts - 1}: {bad[:5]}")
            good = [x for x in ids if 0 <= x < num_experts]
            if len(set(good)) != len(good) and not allow_duplicates:
                problems.append(f"{dwhere}: an expert appears twice on one rank")
            present[good] = True
        missing = np.nonzero(~present)[0]
        if missing.size:
            problems.append(f"{where}: loses logical experts {missing[:8].tolist()}{' ...' if missing.size > 8 else ''}")
    return problems


def require_valid(doc: Any, num_experts: int, ranks: int | None = None, slots: int | None = None) -> None:
    """Raise :class:`InvalidExpertMap` unless ``doc`` validates."""
    problems = validate_map(doc, num_experts, ranks, slots)
    if problems:
        raise InvalidExpertMap(problems)


def map_to_placement(
    doc: dict[str, Any], num_experts: int, allow_duplicates: bool = False
) -> tuple[np.ndarray, int, int]:
    """Validated map -> ``(placement [L, R*S], ranks, slots)``, layers sorted by layer_id."""
    problems = validate_map(doc, num_experts, allow_duplicates=allow_duplicates)
    if problems:
        raise InvalidExpertMap(problems)
    layers = sorted(doc["layer_list"], key=lambda x: x["layer_id"])
    ranks = layers[0]["device_count"]
    rows = []
    for layer in layers:
        devices = sorted(layer["device_list"], key=lambda d: d["device_id"])
        rows.append([x for d in devices for x in d["device_expert"]])
    arr = np.asarray(rows, dtype=np.int64)
    return arr, ranks, arr.shape[1] // ranks
