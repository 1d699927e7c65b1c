"""pd_ratio in a stack: valid pools plan both shapes; bad values exit 2 naming the key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner import load_plan
from tests.deploy.harness import ROOT
from tests.local.conftest import NAMESPACE, cli


def stack_with(tmp_path: Path, pd_ratio: object, decode_instances: int = 1) -> Path:
    stacks = tmp_path / "stacks"
    if stacks.exists():
        shutil.rmtree(stacks)
    shutil.copytree(ROOT / "stacks", stacks)
    f = stacks / "Pulumi.local.yaml"
    doc = yaml.safe_load(f.read_text())
    doc["config"][NAMESPACE + "decode"]["instances"] = decode_instances
    doc["config"][NAMESPACE + "pd_ratio"] = pd_ratio
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return stacks


def test_a_pool_plans_both_shapes_of_each_group(tmp_path: Path) -> None:
    plan = load_plan("local", stack_with(tmp_path, {"mode": "auto", "groups": 1, "initial_prefill_groups": 1}))
    (g,) = plan.flex_groups
    assert g.initial == "prefill" and len(g.nodes) == 4
    assert [i.name for i in plan.instances] == ["prefill-0", "prefill-1", "prefill-2", "decode-0"]
    assert [i.name for i in plan.standby] == ["decode-1"]
    ports = [i.api_port for i in plan.all_instances]
    assert len(set(ports)) == len(ports)
    assert {r.node for i in plan.standby for r in i.ranks} == set(g.nodes)
    assert plan.instance("decode-1").role == "decode"


def test_fixed_stacks_keep_their_plan_json(tmp_path: Path) -> None:
    assert "flex_groups" not in load_plan("local").to_json()


@pytest.mark.parametrize("pd_ratio, key", [
    ({"mode": "fixed", "groups": 1}, "pd_ratio.groups"),
    ({"mode": "auto"}, "pd_ratio.groups"),
    ({"mode": "auto", "groups": 2}, "pd_ratio.groups"),  # 8 nodes, 4 left
    ({"mode": "auto", "groups": 1, "initial_prefill_groups": 2}, "pd_ratio.initial_prefill_groups"),
    ({"mode": "auto", "groups": 1, "min_prefill": 4}, "pd_ratio.min_prefill"),
    ({"mode": "auto", "groups": 1, "min_decode": 3}, "pd_ratio.min_decode"),
    ({"mode": "auto", "groups": 1, "min_prefill": 3, "min_decode": 2}, "pd_ratio.min_prefill"),
    ({"mode": "sometimes", "groups": 1}, "pd_ratio.mode"),
    ({"mode": "auto", "groups": -1}, "pd_ratio.groups"),
    ({"mode": "auto", "groups": 1, "drain_timeout_s": 0}, "pd_ratio.drain_timeout_s"),
    ({"mode": "auto", "groups": 1, "margin": "high"}, "pd_ratio.margin"),
    ({"mode": "auto", "groups": 1, "grups": 1}, "pd_ratio.grups"),
])
def test_bad_pools_name_the_key(tmp_path: Path, pd_ratio: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_plan("local", stack_with(tmp_path, pd_ratio))
    assert key in str(err.value), str(err.value)


def test_the_cli_exits_2_naming_the_key(tmp_path: Path) -> None:
    stacks = stack_with(tmp_path, {"mode": "auto", "groups": 1, "min_decode": 5})
    out = cli("plan", "--stack", "local", "--stacks-dir", str(stacks))
    assert out.returncode == 2 and "pd_ratio.min_decode" in out.stderr and "Traceback" not in out.stderr
