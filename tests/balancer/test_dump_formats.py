"""Recorded-load input formats: the engine's expert-map record and the kit's rank dumps, end to end.

What the released engines write (docs/balancer.md, "Input formats"):

- vLLM-Ascend v0.23.0 and v0.11.0 write no expert-load file. The one EPLB file is the expert-map
  record (``expert_map_record_path``; ``vllm_ascend/eplb/adaptor/vllm_adaptor.py``
  ``_export_tensor_to_file``): rank 0 ``json.dump(record, f, indent=4)`` of
  ``{"moe_layer_count", "layer_list": [{"layer_id", "device_count", "device_list": [{"device_id",
  "device_expert"}]}]}``, built from the in-memory ``expert_maps [L, R, E]`` (per logical expert, its
  local slot on that rank or -1). v0.23.0 lists, per slot ``i``, the first expert whose local index is
  ``i``; v0.11.0 scatters through ``global2local`` (slots without an expert stay -1). The writers below
  rebuild that layout from those descriptions, byte for byte (same keys, order, indent).
- vLLM 0.23.0's EPLB saves nothing (``EPLBConfig`` has no save/load key).
- ``DIR/<snapshot>/rank_<r>.json`` is the kit's own dump (``sim.experts.record_dumps``).

No upstream format is torch ``.pt`` or safetensors, so nothing here needs torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from ascend_runtime.balancer.expert_map import map_to_placement, validate_map
from ascend_runtime.balancer.sources import DirLoadSource, DumpFormatError, parse_rank_dump
from ascend_runtime.cli import main
from ascend_runtime.sim.experts import ExpertRouter, record_dumps

LAYERS, EXPERTS, RANKS, SLOTS = 4, 16, 4, 5  # 4 redundant slots


def _expert_maps(placement: np.ndarray) -> np.ndarray:
    """``placement [L, R*S]`` -> the engine's in-memory ``expert_maps [L, R, E]`` (local slot of each expert, or -1)."""
    maps = np.full((LAYERS, RANKS, EXPERTS), -1, dtype=np.int64)
    for layer in range(LAYERS):
        for rank in range(RANKS):
            for slot, expert in enumerate(placement[layer, rank * SLOTS:(rank + 1) * SLOTS]):
                maps[layer, rank, expert] = slot
    return maps


def _record_v0_23(maps: np.ndarray) -> str:
    """The v0.23.0 record layout: per slot, the first expert id mapped to it."""
    local = int(maps.max()) + 1
    layers = []
    for layer_id, layer in enumerate(maps.tolist()):
        devices = [{"device_id": d, "device_expert": [row.index(i) for i in range(local)]} for d, row in enumerate(layer)]
        layers.append({"layer_id": layer_id, "device_count": len(layer), "device_list": devices})
    return json.dumps({"moe_layer_count": len(layers), "layer_list": layers}, indent=4)


def _record_v0_11(maps: np.ndarray) -> str:
    """The v0.11.0 record layout: ``global2local`` scatter (slot -> expert, -1 where empty)."""
    local = int(maps.max()) + 1
    table = np.full(maps.shape[:2] + (local,), -1, dtype=np.int64)
    layer_i, rank_i, expert_i = np.nonzero(maps >= 0)
    table[layer_i, rank_i, maps[layer_i, rank_i, expert_i]] = expert_i
    layers = []
    for layer_id, layer in enumerate(table.tolist()):
        devices = [{"device_id": d, "device_expert": row} for d, row in enumerate(layer)]
        layers.append({"layer_id": layer_id, "device_count": len(layer), "device_list": devices})
    return json.dumps({"moe_layer_count": len(layers), "layer_list": layers}, indent=4)


def _served_placement(seed: int) -> np.ndarray:
    """A valid in-service placement: every expert once, plus one copy per rank of an expert another rank holds."""
    rng = np.random.default_rng(seed)
    out = np.zeros((LAYERS, RANKS * SLOTS), dtype=np.int64)
    for layer in range(LAYERS):
        perm = rng.permutation(EXPERTS).reshape(RANKS, EXPERTS // RANKS)
        pick = rng.integers(0, EXPERTS // RANKS, RANKS)  # each rank copies one expert of the next rank
        out[layer] = np.concatenate([list(perm[r]) + [perm[(r + 1) % RANKS][pick[r]]] for r in range(RANKS)])
    return out


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Path:
    """Six windows of the simulator's writer, 2 DP ranks, split into prefill/ and decode/ (same router for both)."""
    root = tmp_path_factory.mktemp("dumps")
    for stage, seed in (("prefill", 1), ("decode", 2)):
        router = ExpertRouter(LAYERS, EXPERTS, 4, seed=seed, skew=1.3, drift_sigma=0.5, drift_rate=0.05)
        record_dumps(router, root / stage, windows=6, steps_per_window=4, tokens_per_step=256, ranks=2)
    return root


def test_simulator_writer_bytes_are_the_documented_layout(dumps):
    """Each rank file is compact JSON, keys in order, whole-number counts (no ``.0``), cumulative per window."""
    snaps = sorted((dumps / "decode").iterdir())
    assert [s.name for s in snaps] == [f"w{i:04d}" for i in range(6)]
    previous = None
    for seq, snap in enumerate(snaps, start=1):
        assert sorted(p.name for p in snap.iterdir()) == ["rank_0.json", "rank_1.json"]  # temp files renamed away
        raw = (snap / "rank_1.json").read_text()
        doc = json.loads(raw)
        assert list(doc) == ["rank", "seq", "layers", "experts", "expert_load"]
        assert raw == json.dumps({"rank": 1, "seq": seq, "layers": LAYERS, "experts": EXPERTS,
                                  "expert_load": doc["expert_load"]})
        assert all(isinstance(x, int) for row in doc["expert_load"] for x in row)
        rank, got_seq, cum = parse_rank_dump(doc, 1)
        assert (rank, got_seq, cum.shape) == (1, seq, (LAYERS, EXPERTS))
        if previous is not None:
            assert (cum >= previous).all() and cum.sum() > previous.sum()
        previous = cum


def test_history_is_the_per_window_delta_summed_over_ranks(dumps):
    from ascend_runtime.cli.commands.balance import _read_history

    hist, rc = _read_history(str(dumps / "prefill"))
    assert rc == 0 and hist.shape == (6, LAYERS, EXPERTS)
    cum = [sum(np.array(json.loads((s / f"rank_{r}.json").read_text())["expert_load"]) for r in range(2))
           for s in sorted((dumps / "prefill").iterdir())]
    expected = np.stack([cum[0]] + [cum[i] - cum[i - 1] for i in range(1, 6)])
    assert np.array_equal(hist, expected)


@pytest.mark.parametrize("writer", [_record_v0_23, _record_v0_11], ids=["v0.23.0", "v0.11.0"])
def test_engine_map_record_reads_as_the_map_in_service(writer, dumps, tmp_path, capsys):
    """The record the engine writes is accepted by ``balance plan --previous``, unchanged."""
    served = _served_placement(5)
    record = tmp_path / "eplb.json"
    record.write_text(writer(_expert_maps(served)))
    assert record.read_text().startswith('{\n    "moe_layer_count": 4,\n    "layer_list": [\n        {\n'
                                         '            "layer_id": 0,')
    placement, ranks, slots = map_to_placement(json.loads(record.read_text()), EXPERTS)
    assert (ranks, slots) == (RANKS, SLOTS) and np.array_equal(placement, served)
    out = tmp_path / "map.json"
    rc = main(["balance", "plan", "--history", str(dumps / "decode"), "--ranks", str(RANKS), "--slots", str(SLOTS),
               "--previous", str(record), "--min-gain", "0", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "history: 6 window(s) x 4 layers x 16 experts" in text and "balancedness before (previous map)" in text
    assert validate_map(json.loads(out.read_text()), EXPERTS, RANKS, SLOTS) == []
    moved = int(text.split("moved slots: ")[1].split()[0])
    assert 0 <= moved <= LAYERS * RANKS * SLOTS


def test_evaluate_replays_the_split_dump_per_stage(dumps, tmp_path, capsys):
    plot = tmp_path / "replay.png"
    rc = main(["balance", "evaluate", "--load-dir", str(dumps / "decode"), "--ranks", str(RANKS), "--interval", "1",
               "--policy", "none", "--policy", "greedy", "--plot", str(plot)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"6 windows x {LAYERS} layers x {EXPERTS} experts" in out and "recommended for stage:" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_refuses_the_engine_map_record_as_load(tmp_path, capsys):
    """Pointing --load-dir at the engine's record directory names it a map, not load."""
    snap = tmp_path / "engine" / "w0000"
    snap.mkdir(parents=True)
    (snap / "rank_0.json").write_text(_record_v0_23(_expert_maps(_served_placement(1))))
    rc = main(["balance", "evaluate", "--load-dir", str(tmp_path / "engine"), "--ranks", str(RANKS),
               "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err
    assert rc == 2 and "--load-dir" in err and str(snap / "rank_0.json") in err and "expert map" in err


def _good(rank: int, seq: int) -> dict[str, Any]:
    return {"rank": rank, "seq": seq, "layers": LAYERS, "experts": EXPERTS,
            "expert_load": (np.arange(LAYERS * EXPERTS).reshape(LAYERS, EXPERTS) * seq + 1).tolist()}


BadCase = tuple[str, Callable[[dict[str, Any]], Any], str, str]
BAD: list[BadCase] = [
    ("rank-bool", lambda d: {**d, "rank": True}, "rank", "JSON integer"),
    ("seq-text", lambda d: {**d, "seq": "2"}, "seq", "JSON integer"),
    ("seq-negative", lambda d: {**d, "seq": -1}, "seq", ">= 0"),
    ("layers-float", lambda d: {**d, "layers": 4.0}, "layers", "JSON integer"),
    ("experts-zero", lambda d: {**d, "experts": 0}, "experts", ">= 1"),
    ("seq-missing", lambda d: {k: v for k, v in d.items() if k != "seq"}, "seq", "missing"),
    ("load-missing", lambda d: {k: v for k, v in d.items() if k != "expert_load"}, "expert_load", "missing"),
    ("load-fraction", lambda d: {**d, "expert_load": [[0.5] * EXPERTS] * LAYERS}, "expert_load", "whole token count"),
    ("load-ragged", lambda d: {**d, "expert_load": [[1] * EXPERTS, [1]] + [[1] * EXPERTS] * 2}, "expert_load",
     "rectangular"),
    ("load-shape", lambda d: {**d, "experts": EXPERTS + 1}, "expert_load", "does not match the header"),
    ("load-negative", lambda d: {**d, "expert_load": [[-1] * EXPERTS] * LAYERS}, "expert_load", "non-negative"),
    ("load-null", lambda d: {**d, "expert_load": [[None] * EXPERTS] * LAYERS}, "expert_load", "other than numbers"),
    ("rank-vs-name", lambda d: {**d, "rank": 7}, "rank", "file name"),
    ("list-doc", lambda d: [d], "", "JSON object"),
    ("truncated", lambda d: json.dumps(d)[:60], "", "not complete JSON"),
    ("not-utf8", lambda d: b"\xff\xfe" + json.dumps(d).encode(), "", "utf-8"),
]


def test_malformed_rank_dumps_exit_2_naming_file_and_field(tmp_path, capsys):
    """Every field check, through ``balance plan --history`` (offline: refused) and the daemon's source (skipped)."""
    failures = []
    for label, spoil, field, words in BAD:
        root = tmp_path / label
        for seq in (1, 2):
            snap = root / f"w{seq:04d}"
            snap.mkdir(parents=True)
            for rank in (0, 1):
                doc: Any = _good(rank, seq)
                if (seq, rank) == (2, 1):
                    doc = spoil(doc)
                data = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
                (snap / f"rank_{rank}.json").write_bytes(data if isinstance(data, bytes) else data.encode())
        rc = main(["balance", "plan", "--history", str(root), "--ranks", str(RANKS), "--slots", str(SLOTS),
                   "--out", str(root / "map.json")])
        err = capsys.readouterr().err
        bad_file = str(root / "w0002" / "rank_1.json")
        if rc != 2 or bad_file not in err or words not in err or (field and f"{field}:" not in err) \
                or "Traceback" in err or (root / "map.json").exists():
            failures.append(f"{label}: rc={rc} err={err.strip()[:300]}")
        source = DirLoadSource("d", root / "w0002")
        window = source.read()
        if [p.name for p, _ in source.skipped] != ["rank_1.json"] or window is None or source.ranks_read != [0]:
            failures.append(f"{label}: daemon source skipped {source.skipped}")
    assert failures == []


def test_parse_rank_dump_errors_carry_the_field():
    with pytest.raises(DumpFormatError) as exc:
        parse_rank_dump({**_good(0, 1), "layers": "4"}, 0)
    assert exc.value.field == "layers"
    with pytest.raises(DumpFormatError) as exc:
        parse_rank_dump(json.loads(_record_v0_11(_expert_maps(_served_placement(2)))), 0)
    assert exc.value.field == "" and "expert_map_record_path" in str(exc.value)
    rank, seq, cum = parse_rank_dump({**_good(3, 9), "expert_load": [[2.0] * EXPERTS] * LAYERS}, 3)
    assert (rank, seq, float(cum.sum())) == (3, 9, 2.0 * LAYERS * EXPERTS)  # whole floats are counts


def _snapshots(root: Path, ranks_per_snapshot: list[list[int]], shape: dict[tuple[int, int], tuple[int, int]]) -> None:
    for seq, ranks in enumerate(ranks_per_snapshot, start=1):
        snap = root / f"w{seq:04d}"
        snap.mkdir(parents=True)
        for rank in ranks:
            doc = _good(rank, seq)
            if (seq, rank) in shape:
                layers, experts = shape[(seq, rank)]
                doc = {**doc, "layers": layers, "experts": experts, "expert_load": [[1] * experts] * layers}
            (snap / f"rank_{rank}.json").write_text(json.dumps(doc))


def test_snapshot_level_problems_exit_2(tmp_path, capsys):
    """A rank missing from one snapshot, ranks of different shapes in one snapshot, snapshot files given flat."""
    _snapshots(tmp_path / "gap", [[0, 1], [0], [0, 1]], {})
    _snapshots(tmp_path / "mixed", [[0, 1], [0, 1]], {(1, 1): (LAYERS, EXPERTS * 2)})
    _snapshots(tmp_path / "flat", [[0, 1]], {})
    cases = [("gap", tmp_path / "gap", "same rank_<r>.json files"),
             ("mixed", tmp_path / "mixed", "the other ranks of"),
             ("flat", tmp_path / "flat" / "w0001", "give the directory above it")]
    for label, path, words in cases:
        rc = main(["balance", "evaluate", "--load-dir", str(path), "--ranks", str(RANKS), "--plot",
                   str(tmp_path / f"{label}.png")])
        err = capsys.readouterr().err
        assert rc == 2 and "--load-dir" in err and words in err and "Traceback" not in err, (label, err)


def test_map_record_given_as_load_is_named(tmp_path, capsys):
    """The record file itself as --history, or its directory as --load-dir: refused, pointing to --previous."""
    record = tmp_path / "rec" / "eplb.json"
    record.parent.mkdir()
    record.write_text(_record_v0_23(_expert_maps(_served_placement(3))))
    runs = [["balance", "plan", "--history", str(record), "--ranks", str(RANKS), "--slots", str(SLOTS),
             "--out", str(tmp_path / "m.json")],
            ["balance", "evaluate", "--load-dir", str(record.parent), "--ranks", str(RANKS), "--plot",
             str(tmp_path / "p.png")]]
    for argv in runs:
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and "eplb.json is an expert map" in err and "--previous" in err, (argv[1], err)
    assert not (tmp_path / "m.json").exists()
