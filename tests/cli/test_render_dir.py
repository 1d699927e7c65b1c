"""`render --out DIR`: one stack's render per folder, replaced wholly; mixing stacks is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_runtime.cli import main

MANIFEST = ".ascend-render.json"


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def _render(stack: str, out: Path, *extra: str) -> int:
    return main(["render", "--stack", stack, "--out", str(out), *extra])


def test_another_stacks_render_is_refused_and_left_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert _render("a2-staging", out) == 0
    before = {rel: (out / rel).read_bytes() for rel in _files(out)}
    capsys.readouterr()
    assert _render("kind", out) == 2
    err = capsys.readouterr().err
    assert f"{out} holds the render of stack a2-staging" in err and "--force" in err and "another folder" in err
    assert "Traceback" not in err
    assert {rel: (out / rel).read_bytes() for rel in _files(out)} == before


def test_force_replaces_the_other_render_wholly(tmp_path: Path) -> None:
    out, alone = tmp_path / "out", tmp_path / "alone"
    assert _render("a2-staging", out) == 0
    (out / "notes.txt").write_text("mine")  # not written by any render: kept
    assert _render("kind", out, "--force") == 0
    assert _render("kind", alone) == 0
    assert _files(out) == _files(alone) | {"notes.txt"}
    assert json.loads((out / MANIFEST).read_text())["stack"] == "kind"
    assert not (out / "hccn" / "a2-node-01.conf").exists()


def test_the_same_stack_is_replaced_wholly(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _render("a2-staging", out) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["stack"] == "a2-staging" and set(manifest["files"]) == _files(out) - {MANIFEST}
    # a file an earlier render wrote that this one no longer does
    (out / "launch" / "decode-9-rank0.sh").write_text("old")
    manifest["files"].append("launch/decode-9-rank0.sh")
    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "launch" / "my-wrapper.sh").write_text("mine")  # never listed: kept
    assert _render("a2-staging", out) == 0
    assert not (out / "launch" / "decode-9-rank0.sh").exists()
    assert (out / "launch" / "my-wrapper.sh").read_text() == "mine"


def test_a_render_from_before_manifests_is_recognised_by_its_plan_json(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert _render("a2-staging", out) == 0
    (out / MANIFEST).unlink()
    (out / "hccn" / "gone-node.conf").write_text("old")
    assert _render("kind", out) == 2
    assert _render("a2-staging", out) == 0
    assert not (out / "hccn" / "gone-node.conf").exists() and (out / MANIFEST).exists()


def test_a_folder_with_other_files_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.pdf").write_text("x")
    assert _render("kind", out) == 2
    assert "is not empty and holds no render" in capsys.readouterr().err
    assert _files(out) == {"report.pdf"}
    (tmp_path / "empty").mkdir()
    assert _render("kind", tmp_path / "empty") == 0


def test_a_manifest_cannot_make_render_delete_outside_the_folder(tmp_path: Path) -> None:
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    victim.write_text("keep")
    assert _render("kind", out) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    manifest["files"] += ["../victim.txt", str(victim)]
    (out / MANIFEST).write_text(json.dumps(manifest))
    assert _render("kind", out) == 0
    assert victim.read_text() == "keep"
