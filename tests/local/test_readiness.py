"""Readiness is proven for our own process; taken ports are refused before start; each run has its own log."""

from __future__ import annotations

import asyncio
import io
import os
import socket
import sys
from pathlib import Path

import pytest
from rich.console import Console

from ascend_runtime.cli import main
from ascend_runtime.local.processes import start_process
from ascend_runtime.local.runner import LocalStackError, log_tail, wait_ready
from ascend_runtime.local.state import ProcessRecord, StackState

from .conftest import free_port_stacks, http_server, sleeper


def _state(pid: int, port: int, log: Path) -> StackState:
    return StackState("demo", f"http://127.0.0.1:{port}",
                      [ProcessRecord("proxy", "proxy", pid, ["x"], f"http://127.0.0.1:{port}/health", str(log))])


def test_the_socket_table_names_the_listening_process(procs, tmp_path: Path) -> None:
    from ascend_runtime.local.processes import listener_owner, owns_listener, port_taken

    server, port = http_server(procs)
    other = sleeper(procs)
    assert owns_listener(server.pid, "127.0.0.1", port) is True
    assert owns_listener(other.pid, "127.0.0.1", port) is False
    assert listener_owner("127.0.0.1", port) == server.pid
    assert port_taken("127.0.0.1", port)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        free_port = free.getsockname()[1]
    assert not port_taken("127.0.0.1", free_port)
    assert owns_listener(server.pid, "127.0.0.1", free_port) is False


def test_a_health_url_answered_by_another_process_is_not_ready(procs, tmp_path: Path) -> None:
    """Another copy holds the port and answers 200; our process is alive but listens nowhere: not ready."""
    _, port = http_server(procs)
    ours = sleeper(procs)
    with pytest.raises(LocalStackError) as err:
        asyncio.run(wait_ready(_state(ours.pid, port, tmp_path / "proxy.log"), 20, Console(file=io.StringIO())))
    message = str(err.value)
    assert "belongs to pid" in message and f"not to our proxy (pid {ours.pid})" in message


def test_our_own_listener_is_ready(procs, tmp_path: Path) -> None:
    server, port = http_server(procs)
    asyncio.run(wait_ready(_state(server.pid, port, tmp_path / "proxy.log"), 20, Console(file=io.StringIO())))


def test_each_run_logs_to_a_fresh_file_and_keeps_the_previous_one(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "decode-0.log"
    for run in (1, 2):
        pid = start_process([sys.executable, "-c", f"print('line of run {run}')"], log)
        os.waitpid(pid, 0)
    assert log_tail(str(log)) == "line of run 2"
    assert (tmp_path / "logs" / "decode-0.log.1").read_text().strip() == "line of run 1"


def test_a_process_that_dies_at_start_is_named_with_this_runs_log_only(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "decode-0.log"
    log.parent.mkdir()
    log.write_text("an older run's line\n" * 50)
    code = "import sys; print('OSError: [Errno 98] address already in use'); sys.exit(1)"
    pid = start_process([sys.executable, "-c", code], log)
    os.waitpid(pid, 0)
    state = StackState("demo", "http://127.0.0.1:9",
                       [ProcessRecord("decode-0", "simulator", pid, ["x"], "http://127.0.0.1:9/health", str(log))])
    with pytest.raises(LocalStackError) as err:
        asyncio.run(wait_ready(state, 20, Console(file=io.StringIO())))
    message = str(err.value)
    assert "decode-0 exited during start-up" in message and "[Errno 98] address already in use" in message
    assert "an older run's line" not in message


def test_a_taken_port_is_refused_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stacks = free_port_stacks(tmp_path)
    from ascend_runtime.planner import load_plan

    plan = load_plan("local", stacks)
    state_dir = tmp_path / "state"
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((plan.proxy_host, plan.proxy_port))
        holder.listen()
        rc = main(["up", "--stack", "local", "--stacks-dir", str(stacks), "--state-dir", str(state_dir), "--no-checks"])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert f"port {plan.proxy_port} on {plan.proxy_host} (ports.proxy, proxy) is held by pid" in err, err
    assert "nothing was started" in err
    assert StackState.load(state_dir) is None and not (state_dir / "logs").exists()


def test_every_local_listen_port_lies_in_the_planner_range_of_its_key() -> None:
    from ascend_runtime.config.loader import load_stack
    from ascend_runtime.hardware import hardware_spec
    from ascend_runtime.local.topology import listen_ports
    from ascend_runtime.planner import build_plan
    from ascend_runtime.planner.validation import port_ranges

    stack = load_stack("local")
    plan = build_plan(stack)
    ranges = port_ranges(stack.config, hardware_spec(plan.hardware), plan.kv_connector, len(plan.instances))
    ports = listen_ports(plan)
    assert {p.key for p in ports} == {"ports.api_base", "ports.kv_base", "ports.proxy", "ports.balancer_metrics"}
    for p in ports:
        assert p.port in ranges[p.key], p
