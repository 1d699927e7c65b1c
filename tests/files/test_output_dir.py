"""One writer that never follows a link out of its output directory.

Symbolic links planted in ``render --out DIR`` (a same-stack render, and with ``--force``), in a local stack's
state directory and in ``balance record``'s dump directory: a link where a file goes is replaced by the file and
its target is left as it was; a link where a folder goes is refused naming it, before anything is written; a
stale file is removed as the name it is. Each victim outside the directory is checked byte for byte.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from ascend_runtime.cli import main

MANIFEST = ".ascend-render.json"
VICTIM_TEXT = "outside the output directory; must not change\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file and a folder outside every output directory of the test."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text(VICTIM_TEXT)
    return outside


def _unchanged(outside: Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == VICTIM_TEXT


def _render(out: Path, *extra: str, stack: str = "a2-staging") -> int:
    return main(["render", "--stack", stack, "--out", str(out), *extra])


@pytest.mark.parametrize("force", [False, True])
def test_render_replaces_a_link_where_a_file_goes(tmp_path: Path, victim: Path, force: bool) -> None:
    out = tmp_path / "out"
    assert _render(out) == 0
    for rel in ("plan.json", "DEPLOYMENT.md", "launch/prefill-0-rank0.sh"):
        (out / rel).unlink()
        (out / rel).symlink_to(victim / "victim.txt")
    assert _render(out, *(["--force"] if force else [])) == 0
    _unchanged(victim)
    for rel in ("plan.json", "DEPLOYMENT.md", "launch/prefill-0-rank0.sh"):
        assert not (out / rel).is_symlink() and (out / rel).is_file(), rel
    assert os.stat(out / "launch" / "prefill-0-rank0.sh").st_mode & 0o777 == 0o755
    assert json.loads((out / MANIFEST).read_text())["stack"] == "a2-staging"


@pytest.mark.parametrize("force", [False, True])
def test_render_refuses_a_link_where_a_folder_goes(tmp_path: Path, victim: Path, force: bool,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert _render(out) == 0
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    for p in list((out / "launch").iterdir()):
        p.unlink()
    (out / "launch").rmdir()
    (out / "launch").symlink_to(victim)
    capsys.readouterr()
    assert _render(out, *(["--force"] if force else [])) == 2
    err = capsys.readouterr().err
    assert f"{out / 'launch'} is a symbolic link" in err and "Traceback" not in err, err
    _unchanged(victim)
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == {k: v for k, v in before.items() if not k.startswith("launch/")}  # nothing changed first


def test_a_stale_file_that_is_a_link_is_removed_as_a_link(tmp_path: Path, victim: Path) -> None:
    out = tmp_path / "out"
    assert _render(out) == 0
    manifest = json.loads((out / MANIFEST).read_text())
    (out / "hccn" / "gone-node.conf").symlink_to(victim / "victim.txt")
    manifest["files"].append("hccn/gone-node.conf")
    (out / MANIFEST).write_text(json.dumps(manifest))
    assert _render(out) == 0
    assert not (out / "hccn" / "gone-node.conf").is_symlink()
    _unchanged(victim)


def test_a_manifest_that_is_a_link_is_an_unknown_render(tmp_path: Path, victim: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert _render(out) == 0
    (out / MANIFEST).unlink()
    (out / MANIFEST).symlink_to(victim / "victim.txt")
    assert _render(out) == 2
    assert "manifest is unreadable" in capsys.readouterr().err
    assert _render(out, "--force") == 0
    _unchanged(victim)
    assert not (out / MANIFEST).is_symlink()


def test_a_file_flag_that_is_a_link_is_replaced(tmp_path: Path, victim: Path) -> None:
    from ascend_runtime.cli.stackargs import write_output

    target = tmp_path / "result.json"
    target.symlink_to(victim / "victim.txt")
    assert write_output("--result-json", str(target), "{}\n") is None  # check smoke --json, check throughput ...
    _unchanged(victim)
    assert not target.is_symlink() and target.read_text() == "{}\n"
    from ascend_runtime.balancer.png import Panel, line_chart  # balance evaluate --plot

    plot = tmp_path / "chart.png"
    plot.symlink_to(victim / "victim.txt")
    line_chart(plot, [Panel("balancedness", "ratio", {"ours": [1.0, 0.9]})])
    _unchanged(victim)
    assert not plot.is_symlink() and plot.read_bytes().startswith(b"\x89PNG")


def test_the_state_directory_is_never_written_through_a_link(tmp_path: Path, victim: Path) -> None:
    from ascend_runtime.local.processes import start_process
    from ascend_runtime.local.runner import LocalStackError, start_all, write_secret_file
    from ascend_runtime.local.state import StackState
    from ascend_runtime.planner import load_plan

    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    for rel in ("state.json", "proxy-admin-token", "logs/proxy.log"):
        (state / rel).symlink_to(victim / "victim.txt")
    StackState("local", "http://127.0.0.1:1").save(state)
    write_secret_file(state / "proxy-admin-token", "secret\n")
    start_process(["true"], state / "logs" / "proxy.log")
    _unchanged(victim)
    assert not (state / "state.json").is_symlink() and StackState.load(state).stack == "local"
    assert os.stat(state / "proxy-admin-token").st_mode & 0o777 == 0o600
    assert (state / "logs" / "proxy.log.1").is_symlink() and not (state / "logs" / "proxy.log").is_symlink()
    other = tmp_path / "other"
    other.mkdir()
    (other / "logs").symlink_to(victim)
    with pytest.raises(LocalStackError, match="logs is a symbolic link"):
        start_all(load_plan("local"), other)
    _unchanged(victim)
    assert sorted(p.name for p in other.iterdir()) == ["logs"]  # nothing written, nothing started


def test_balance_record_replaces_a_link_planted_in_the_dump_directory(tmp_path: Path, victim: Path) -> None:
    from ascend_runtime.balancer.record import StageDumps

    dumps = StageDumps(tmp_path / "dumps", ranks=2)
    (tmp_path / "dumps" / "w0000").mkdir(parents=True)
    (tmp_path / "dumps" / "w0000" / "rank_0.json").symlink_to(victim / "victim.txt")
    (tmp_path / "dumps" / "w0001").symlink_to(victim)
    assert dumps.add(np.ones((2, 4))) == tmp_path / "dumps" / "w0000"
    _unchanged(victim)
    assert json.loads((tmp_path / "dumps" / "w0000" / "rank_0.json").read_text())["rank"] == 0
    from ascend_runtime.files.write import OutputRefused

    with pytest.raises(OutputRefused, match="w0001 is a symbolic link"):
        dumps.add(np.ones((2, 4)))
    _unchanged(victim)
