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
