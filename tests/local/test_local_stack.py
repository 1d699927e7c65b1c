"""End to end on loopback: `up --detach` of the local stack, smoke, throughput, a killed decode, `down`."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from ascend_runtime.local.processes import is_alive
from ascend_runtime.local.state import StackState

from .conftest import assert_checks_passed, cli, free_port_stacks, kill_recorded

pytestmark = pytest.mark.slow


@pytest.fixture
def local_stack(tmp_path: Path):
    stacks = free_port_stacks(tmp_path)
    state_dir = tmp_path / "state"
    up = cli("up", "--stack", "local", "--stacks-dir", str(stacks), "--detach", "--state-dir", str(state_dir),
             "--num-prompts", "32")
    state = StackState.load(state_dir)
    try:
        yield stacks, state_dir, up, state
    finally:
        cli("down", "--stack", "local", "--state-dir", str(state_dir))
        kill_recorded(state_dir)
        if state:
            for record in state.processes:
                if is_alive(record.pid):
                    os.killpg(record.pid, signal.SIGKILL)


def test_up_checks_kill_and_down(local_stack) -> None:
    stacks, state_dir, up, state = local_stack
    assert_checks_passed(up)
    assert "PASS  proxy GET /health" in up.stdout
    result = json.loads((state_dir / "throughput.json").read_text())
    assert result["completed"] == 32 and result["failed"] == 0
    assert result["mean_ttft_ms"] > 0 and result["mean_tpot_ms"] > 0
    assert result["local_report"]["speedup"] == 10 and result["local_report"]["simulator_lag"] > 0
    assert "tok/s/NPU" in up.stdout and "published figure" in up.stdout and "simulator clock:" in up.stdout
    kinds = sorted(p.kind for p in state.processes)
    assert kinds.count("simulator") == 3 and "proxy" in kinds and "balancer" in kinds

    status = cli("status", "--state-dir", str(state_dir))
    assert status.returncode == 0, status.stdout + status.stderr

    victim = next(p for p in state.processes if p.name == "decode-1")
    os.killpg(victim.pid, signal.SIGKILL)
    time.sleep(0.5)
    smoke = cli("check", "smoke", "--endpoint", state.proxy_url, "--stack", "local", "--stacks-dir", str(stacks), timeout=120)
    assert smoke.returncode != 0
    failed = [line for line in smoke.stdout.splitlines() if line.startswith("FAIL")]
    assert failed and all("decode-1" in line for line in failed), smoke.stdout

    down = cli("down", "--stack", "local", "--state-dir", str(state_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    time.sleep(0.2)
    assert [p.name for p in state.processes if is_alive(p.pid)] == []
    assert StackState.load(state_dir) is None


def test_up_refuses_non_local_target(tmp_path: Path) -> None:
    result = cli("up", "--stack", "a2-staging", "--state-dir", str(tmp_path))
    assert result.returncode == 2
    assert "target is 'kubernetes'" in result.stderr
