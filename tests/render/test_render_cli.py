"""`ascend-deploy render`: golden files of a2-staging, determinism, hooks, no secrets.

Regenerate the goldens after an intended change:

    UPDATE_GOLDEN=1 python -m pytest tests/render/test_render_cli.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ascend_runtime.cli import main
from ascend_runtime.config.loader import load_stack
from ascend_runtime.planner import Plan
from ascend_runtime.render.artifacts import extra_files, render_artifacts

GOLDEN = Path(__file__).parent / "golden" / "a2-staging"


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_render_a2_staging_matches_golden(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["render", "--stack", "a2-staging", "--out", str(out)]) == 0
    got = {k: v for k, v in _tree(out).items() if not k.startswith("manifests/")}
    if os.environ.get("UPDATE_GOLDEN") == "1":
        for old in GOLDEN.rglob("*"):
            if old.is_file():
                old.unlink()
        for rel, text in got.items():
            (GOLDEN / rel).parent.mkdir(parents=True, exist_ok=True)
            (GOLDEN / rel).write_text(text)
    want = _tree(GOLDEN)
    assert sorted(got) == sorted(want), "file set differs; regenerate with UPDATE_GOLDEN=1 if intended"
    for rel in want:
        assert got[rel] == want[rel], f"{rel} differs from the golden file; UPDATE_GOLDEN=1 to accept"
    assert os.access(out / "launch" / "prefill-0-rank0.sh", os.X_OK)


def test_layout_and_determinism(plans: dict[str, Plan]) -> None:
    plan = plans["cm384-prod"]
    inventory = load_stack("cm384-prod").inventory
    first, second = render_artifacts(plan, inventory), render_artifacts(plan, inventory)
    assert first == second
    assert first["plan.json"] == plan.to_json()
    assert {f"launch/{r.name}.sh" for r in plan.ranks} <= set(first)
    assert {f"hccn/{n.name}.conf" for n in plan.nodes} <= set(first)
    assert "ranktables/global.json" in first and "DEPLOYMENT.md" in first
    json.loads(first["ranktables/hccl-decode-3.json"])


def test_no_secret_is_written(plans: dict[str, Plan]) -> None:
    for name in ("a2-staging", "cm384-prod"):
        blob = "\n".join(render_artifacts(plans[name]).values())
        for word in ("secure:", "image_pull_credentials", "model_source_credentials", "password", "token="):
            assert word not in blob, (name, word)


def test_manifests_are_prefixed_and_absent_for_local(plans: dict[str, Plan]) -> None:
    kind = extra_files(plans["kind"])
    assert kind and all(path.startswith("manifests/") and path.endswith(".yaml") for path in kind)
    assert extra_files(plans["local"]) == {}


def test_invalid_stack_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--stack", "no-such-stack", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()
