import json

from ascend_runtime.balancer.expert_map import validate_map
from ascend_runtime.balancer.trace import synthetic_trace
from ascend_runtime.cli import main


def write_load(tmp_path):
    load = synthetic_trace(1, layers=4, experts=32, seed=5)[0]
    path = tmp_path / "load.json"
    path.write_text(json.dumps({"expert_load": load.tolist()}))
    return path


def test_plan_writes_valid_map_and_reports(tmp_path, capsys):
    load = write_load(tmp_path)
    out = tmp_path / "map.json"
    assert main(["balance", "plan", "--load", str(load), "--ranks", "4", "--slots", "9", "--out", str(out)]) == 0
    assert validate_map(json.loads(out.read_text()), 32, 4, 9) == []
    text = capsys.readouterr().out
    assert "balancedness before" in text and "balancedness after" in text and "moved slots" in text
    out2 = tmp_path / "map2.json"
    rc = main(["balance", "plan", "--load", str(load), "--ranks", "4", "--slots", "9", "--groups", "8", "--nodes", "2",
               "--previous", str(out), "--out", str(out2)])
    assert rc == 0 and "moved slots:" in capsys.readouterr().out


def test_plan_bad_input_exits_2_naming_the_field(tmp_path, capsys):
    load = write_load(tmp_path)
    assert main(["balance", "plan", "--load", str(load), "--ranks", "4", "--slots", "7", "--out", str(tmp_path / "m")]) == 2
    assert "--slots" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"load": []}')
    assert main(["balance", "plan", "--load", str(tmp_path / "bad.json"), "--ranks", "4", "--slots", "9", "--out", "x"]) == 2
    assert "--load" in capsys.readouterr().err
    assert main(["balance", "plan", "--load", str(load), "--ranks", "4", "--slots", "9", "--groups", "8", "--out", "x"]) == 2
    assert main(["balance", "serve", "--ranks", "4", "--slots", "9"]) == 2
    assert "--instance" in capsys.readouterr().err


def test_plan_greedy_on_heavy_skew_writes_a_map_the_engine_accepts(tmp_path, capsys):
    """DeepSeek's greedy puts two replicas of a hot expert on one rank; the map written must have none."""
    import numpy as np

    history = tmp_path / "history.npy"
    np.save(history, synthetic_trace(4, layers=4, experts=256, seed=1))
    out = tmp_path / "map.json"
    rc = main(["balance", "plan", "--history", str(history), "--ranks", "64", "--slots", "5", "--policy", "greedy",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert validate_map(json.loads(out.read_text()), 256, 64, 5) == []


def test_plan_greedy_that_cannot_fit_says_why_naming_the_flag(tmp_path, capsys):
    """One expert hotter than all others together: greedy gives it more replicas than there are ranks."""
    import numpy as np

    load = np.ones((2, 8))
    load[:, 0] = 1e6
    path = tmp_path / "load.json"
    path.write_text(json.dumps({"expert_load": load.tolist()}))
    rc = main(["balance", "plan", "--load", str(path), "--ranks", "4", "--slots", "4", "--policy", "greedy",
               "--out", str(tmp_path / "m.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "--policy greedy" in err and "--policy ours" in err
    assert main(["balance", "plan", "--load", str(path), "--ranks", "4", "--slots", "4", "--policy", "ours",
                 "--out", str(tmp_path / "m.json")]) == 0
