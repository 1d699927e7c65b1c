"""End to end on loopback with rank serving: `up --detach` of the local-rank stack (one API server per DP rank,
the proxy routing to ranks), `check smoke` and `check throughput` through the CLI, requests on more than one
rank of an instance (each rank's own /metrics), `down`."""

from __future__ import annotations

import os
import signal
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ascend_runtime.local.processes import is_alive
from ascend_runtime.local.state import StackState
from ascend_runtime.local.topology import listen_ports
from ascend_runtime.planner import load_plan

from .conftest import assert_checks_passed, bindable, cli, free_port_stacks, kill_recorded

pytestmark = pytest.mark.slow
STACK = "local-rank"


def requests_by_engine(url: str) -> dict[str, float]:
    """Finished requests per ``engine`` label on one rank server's /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:request_success_total":
                out[s.labels["engine"]] = out.get(s.labels["engine"], 0.0) + s.value
    return out


def test_rank_stack_up_checks_and_down(tmp_path: Path) -> None:
    stacks = free_port_stacks(tmp_path, STACK)
    state_dir = tmp_path / "state"
    plan = load_plan(STACK, stacks)
    try:
        up = cli("up", "--stack", STACK, "--stacks-dir", str(stacks), "--detach", "--state-dir", str(state_dir),
                 "--num-prompts", "32")
        assert_checks_passed(up)
        state = StackState.load(state_dir)
        assert state is not None
        assert sorted(p.kind for p in state.processes).count("simulator") == 3  # one simulator per instance

        smoke = cli("check", "smoke", "--endpoint", plan.proxy_url, "--stack", STACK, "--stacks-dir", str(stacks),
                    timeout=120)
        assert smoke.returncode == 0, smoke.stdout + smoke.stderr
        endpoints = plan.endpoints()
        for ep in endpoints:  # every rank's own server was probed
            assert f"PASS  rank {ep['name']} of {ep['instance']} ({ep['role']}) GET /health" in smoke.stdout

        tc = plan.config["throughput_check"]
        tp = cli("check", "throughput", "--endpoint", plan.proxy_url, "--input-len", str(tc["input_len"]),
                 "--output-len", str(tc["output_len"]), "--concurrency", "32", "--num-prompts", "64",
                 "--no-progress", timeout=180)
        assert tp.returncode == 0, tp.stdout + tp.stderr

        # each rank server reports its own engine only, and the proxy spread requests over an instance's ranks
        served: dict[str, int] = {}
        for ep in endpoints:
            rank = ep["name"].rsplit("-dp", 1)[1]
            by_engine = requests_by_engine(ep["url"])
            assert list(by_engine) == [rank], (ep, by_engine)
            if by_engine[rank] > 0:
                served[ep["instance"]] = served.get(ep["instance"], 0) + 1
        assert any(n > 1 for n in served.values()), served
        assert served.get("decode-0", 0) > 1 or served.get("decode-1", 0) > 1, served

        down = cli("down", "--stack", STACK, "--state-dir", str(state_dir))
        assert down.returncode == 0, down.stdout + down.stderr
        assert [p.name for p in state.processes if is_alive(p.pid)] == []
        assert all(bindable(lp.host, lp.port) for lp in listen_ports(plan))
    finally:
        cli("down", "--stack", STACK, "--state-dir", str(state_dir))
        kill_recorded(state_dir)
        state = StackState.load(state_dir)
        for record in state.processes if state else []:
            if is_alive(record.pid):
                os.killpg(record.pid, signal.SIGKILL)
