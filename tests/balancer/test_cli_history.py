"""`balance plan --history`: .npy and dump-snapshot directories, several policies compared."""

import json

import numpy as np

from ascend_runtime.balancer.expert_map import map_to_placement, validate_map
from ascend_runtime.balancer.measure import balancedness
from ascend_runtime.balancer.trace import synthetic_trace
from ascend_runtime.cli import main


def _policy_lines(text):
    return {line.split()[1].rstrip(":"): float(line.split()[3]) for line in text.splitlines() if line.startswith("policy ")}


def test_plan_history_npy_compares_policies(tmp_path, capsys):
    hist = synthetic_trace(6, layers=3, experts=16, seed=2)
    path = tmp_path / "hist.npy"
    np.save(path, hist)
    out = tmp_path / "map.json"
    args = ["balance", "plan", "--history", str(path), "--ranks", "4", "--slots", "5", "--out", str(out)]
    for p in ("flashlb", "ours", "greedy", "swift_balancer"):
        args += ["--policy", p]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "6 window(s) x 3 layers x 16 experts" in text
    got = _policy_lines(text)
    assert set(got) == {"ours", "greedy", "swift_balancer", "flashlb"}
    doc = json.loads(out.read_text())
    assert validate_map(doc, 16, 4, 5) == []
    placement, _, _ = map_to_placement(doc, 16)
    # the map written is the first policy's, and its printed balancedness is on the last window
    assert abs(balancedness(placement, hist[-1], 4) - got["flashlb"]) < 1e-4
    assert f"wrote {out} (flashlb)" in text
    assert all(0.25 <= b <= 1.0 for b in got.values())


def test_plan_history_dump_dirs_match_npy(tmp_path, capsys):
    hist = synthetic_trace(3, layers=2, experts=8, seed=4)
    ranks = 2
    cum = np.zeros((ranks, *hist.shape[1:]))
    for t, window in enumerate(hist):
        snap = tmp_path / "dumps" / f"{t:03d}"
        snap.mkdir(parents=True)
        for r in range(ranks):  # each rank routed part of the window; dumps are cumulative
            share = np.floor(window / ranks) if r == 0 else window - np.floor(window / ranks)
            cum[r] += share
            (snap / f"rank_{r}.json").write_text(json.dumps(
                {"rank": r, "seq": t + 1, "layers": 2, "experts": 8, "expert_load": cum[r].tolist()}))
    np.save(tmp_path / "h.npy", hist)
    common = ["--ranks", "4", "--slots", "3", "--policy", "greedy", "--policy", "flashlb"]
    assert main(["balance", "plan", "--history", str(tmp_path / "dumps"), "--out", str(tmp_path / "a.json"), *common]) == 0
    from_dirs = capsys.readouterr().out
    assert main(["balance", "plan", "--history", str(tmp_path / "h.npy"), "--out", str(tmp_path / "b.json"), *common]) == 0
    from_npy = capsys.readouterr().out
    assert "3 window(s)" in from_dirs and _policy_lines(from_dirs) == _policy_lines(from_npy)
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads((tmp_path / "b.json").read_text())


def test_plan_history_bad_input(tmp_path, capsys):
    assert main(["balance", "plan", "--history", str(tmp_path / "none.npy"), "--ranks", "4", "--slots", "5",
                 "--out", str(tmp_path / "m.json")]) == 2
    assert "--history" in capsys.readouterr().err
    np.save(tmp_path / "neg.npy", -np.ones((2, 2, 8)))
    assert main(["balance", "plan", "--history", str(tmp_path / "neg.npy"), "--ranks", "4", "--slots", "5",
                 "--out", str(tmp_path / "m.json")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["balance", "plan", "--history", str(tmp_path / "empty"), "--ranks", "4", "--slots", "5",
                 "--out", str(tmp_path / "m.json")]) == 2
    assert "rank_<r>.json" in capsys.readouterr().err
