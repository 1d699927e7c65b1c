"""`status` and `down` find the running stack without --stack; unknown stacks exit 2 listing the stacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascend_runtime.cli import main
from ascend_runtime.local.identity import identity_after_start
from ascend_runtime.local.state import ProcessRecord, StackState

from .conftest import free_port_stacks, http_server, sleeper


@pytest.fixture
def state_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty state root, and stacks whose local stack is on free ports (a stack running on this machine on
    the standard ports would otherwise answer for ours: `down` reports such ports as a lost state)."""
    root = tmp_path / "state-root"
    root.mkdir()
    monkeypatch.setenv("ASCEND_DEPLOY_STATE_DIR", str(root))
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(free_port_stacks(tmp_path)))
    return root


def _record(root: Path, stack: str, pid: int, port: int) -> None:
    """A state file as `up` writes it: the process's start time and command line read from /proc."""
    now = identity_after_start(pid)
    assert now is not None
    StackState(stack, f"http://127.0.0.1:{port}",
               [ProcessRecord("proxy", "proxy", pid, ["x"], f"http://127.0.0.1:{port}/health", str(root / "p.log"),
                              now.start_time, list(now.cmdline))]
               ).save(root / stack)


def test_bare_status_shows_the_one_running_stack(state_root: Path, procs, capsys: pytest.CaptureFixture[str]) -> None:
    server, port = http_server(procs)
    _record(state_root, "local", server.pid, port)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "local stack local" in out and str(server.pid) in out and "200" in out


def test_a_health_url_answered_by_another_process_is_not_healthy(state_root: Path, procs,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    server, port = http_server(procs)
    ours = sleeper(procs)
    _record(state_root, "local", ours.pid, port)
    assert main(["status", "--stack", "local"]) == 1
    out = capsys.readouterr().out
    assert "NOT OURS" in out and f"pid {server.pid}" in out


def test_an_unknown_stack_exits_2_listing_the_stacks(state_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--stack", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "--stack nosuch: no such stack" in err and "local" in err and "a2-staging" in err
    assert main(["down", "--stack", "nosuch"]) == 2


def test_nothing_running(state_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status"]) == 1
    assert "no local stack is running" in capsys.readouterr().out
    assert main(["status", "--stack", "local"]) == 1
    assert "stack local is not running" in capsys.readouterr().out
    assert main(["down"]) == 0


def test_several_running_need_stack(state_root: Path, procs, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("local", "other"):
        _record(state_root, name, sleeper(procs).pid, 9)
    assert main(["status"]) == 2
    assert "several local stacks are running: local, other; give --stack" in capsys.readouterr().err
    assert main(["down"]) == 2


def test_bare_down_stops_the_one_running_stack(state_root: Path, procs, capsys: pytest.CaptureFixture[str]) -> None:
    victim = sleeper(procs)
    _record(state_root, "local", victim.pid, 9)
    assert main(["down"]) == 0
    assert "stack local is down (1 processes stopped)" in capsys.readouterr().out
    assert victim.popen.wait(10) is not None
    assert StackState.load(state_root / "local") is None


def test_a_kubernetes_stack_is_not_brought_down_here_and_says_how(state_root: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["down", "--stack", "a2-staging"]) == 0
    out = capsys.readouterr().out
    assert "not running" in out and "pulumi destroy -s a2-staging" in out and "kubernetes" in out
    assert main(["status", "--stack", "kind"]) == 1
    assert "pulumi destroy -s kind" not in capsys.readouterr().out  # status does not suggest destroying
    assert main(["down", "--stack", "local"]) == 0
    assert "pulumi" not in capsys.readouterr().out
