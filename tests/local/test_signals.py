"""SIGHUP and SIGTERM to an attached `up` stop every process it started, like Ctrl-C, and say so."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_runtime.local.processes import is_alive
from ascend_runtime.local.state import StackState

from .conftest import free_port_stacks, kill_recorded, processes_mentioning, wait_for

pytestmark = pytest.mark.slow


def _attached_up(stacks: Path, state_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ascend_runtime", "up", "--stack", "local", "--stacks-dir", str(stacks),
                             "--state-dir", str(state_dir), "--no-checks"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _pids(state_dir: Path) -> list[int]:
    state = StackState.load(state_dir)
    return [p.pid for p in state.processes] if state else []


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT], ids=["SIGHUP", "SIGTERM", "SIGINT"])
def test_a_signal_while_serving_stops_everything(sig: signal.Signals, tmp_path: Path) -> None:
    stacks, state_dir = free_port_stacks(tmp_path), tmp_path / "state"
    up = _attached_up(stacks, state_dir)
    try:
        assert up.stdout is not None
        for line in up.stdout:  # until it serves
            if line.startswith("serving until interrupted"):
                break
        else:
            pytest.fail(f"up ended before serving: {up.wait(10)} {up.stderr.read() if up.stderr else ''}")
        pids = _pids(state_dir)
        assert len(pids) == 5 and all(is_alive(p) for p in pids)
        up.send_signal(sig)
        out, err = up.communicate(timeout=60)
        assert up.returncode == 0, (up.returncode, out, err)
        assert f"received {sig.name} while serving: stopped every process this `up` started" in err
        assert [p for p in pids if is_alive(p)] == [] and processes_mentioning(str(tmp_path)) == []
        assert StackState.load(state_dir) is None
        assert f"received {sig.name} while serving" in (state_dir / "logs" / "up.log").read_text()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
        kill_recorded(state_dir)


def test_a_signal_during_start_up_stops_what_was_started(tmp_path: Path) -> None:
    stacks, state_dir = free_port_stacks(tmp_path), tmp_path / "state"
    up = _attached_up(stacks, state_dir)
    try:
        wait_for(lambda: len(_pids(state_dir)) >= 2, 60, "two recorded processes")
        pids = _pids(state_dir)
        up.send_signal(signal.SIGHUP)
        out, err = up.communicate(timeout=60)
        assert up.returncode == 1, (out, err)
        assert "received SIGHUP before the stack was serving: stopped every process" in err
        assert [p for p in pids if is_alive(p)] == []
        assert processes_mentioning(str(tmp_path)) == []  # nor any started after the pids were read
        assert StackState.load(state_dir) is None
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(10)
        kill_recorded(state_dir)
