"""Recovery onto a spare on the local stack, real processes: a decode instance's node killed under load.

The stack (benchmarks/spare_recovery.py: one prefill instance, two decode instances, four spare nodes, the
first kept for decode) runs with ``up --detach`` and ``ascend-deploy faults watch --stack local`` beside it;
12 clients stream completions through the proxy while every process on decode-0's leader node address is
killed. The watcher drains decode-0, re-places it on the spare by the planner's rule, starts it there, checks
it (``/health`` and a PD round trip) and undrains it; no request fails (the streams the kill broke continue
on decode-1). The benchmark of the same scenario records the times in docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ascend_runtime.local.processes import is_alive
from ascend_runtime.local.state import StackState
from ascend_runtime.planner import load_plan
from benchmarks.spare_recovery import SPARE_NODE, VICTIM, one_round, spare_stack
from tests.local.conftest import cli, kill_recorded


@pytest.fixture
def running(tmp_path: Path):  # type: ignore[no-untyped-def]
    stacks = spare_stack(tmp_path)
    state_dir = tmp_path / "state"
    up = cli("up", "--stack", "local", "--stacks-dir", str(stacks), "--state-dir", str(state_dir), "--detach",
             "--no-checks")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield stacks, state_dir
    finally:
        cli("down", "--stack", "local", "--state-dir", str(state_dir))
        kill_recorded(state_dir)


def test_a_killed_decode_node_is_drained_moved_to_the_spare_checked_and_undrained_without_a_failed_request(
        running: tuple[Path, Path]) -> None:
    stacks, state_dir = running
    plan = load_plan("local", stacks)
    spare_ip = next(n.host_ip for n in plan.nodes if n.name == SPARE_NODE)
    said: list[str] = []
    result = asyncio.run(one_round(stacks, state_dir, workers=12, max_tokens=48, timeout_s=180, say=said.append))
    assert result.killed == [VICTIM]
    assert result.drained_s is not None, "decode-0 was never seen draining"
    assert result.serving_s is not None, "\n".join(said)
    assert urlsplit(result.spare_url).hostname == spare_ip
    assert result.failed == [], result.failed[:3]
    assert result.requests > 50
    assert result.taken_out == [plan.instance(VICTIM).nodes[0]]
    assert result.watcher["spares"] == [SPARE_NODE] and result.watcher["fault_to_serving_s"] > 0
    state = StackState.load(state_dir)
    assert state is not None
    record = next(p for p in state.processes if p.name == VICTIM)
    assert urlsplit(record.health_url).hostname == spare_ip and is_alive(record.pid)
    routed = {i["name"]: i["url"] for i in json.loads((state_dir / "instances.json").read_text())["instances"]}
    assert urlsplit(routed[VICTIM]).hostname == spare_ip, "the proxy's file names the spare once decode-0 serves"
