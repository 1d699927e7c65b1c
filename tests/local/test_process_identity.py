"""Process identity before any signal: `down` signals a recorded process group only while its pid is still the
process `up` started (start time and command line from /proc, recorded at start).

A state file naming an unrelated process leaves it running; a forged start time too; a recorded pid that is
gone while its port still answers is reported as serving (exit 1), not "stopped"; a missing or empty state file
while the stack's ports answer is "state lost" (exit 1), not "not running".
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from ascend_runtime.cli import main
from ascend_runtime.local.state import ProcessRecord, StackState
from ascend_runtime.planner import load_plan

from .conftest import free_port_stacks, http_server, sleeper, wait_for


@pytest.fixture
def stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state root of its own and a copy of the stacks whose local stack is on free ports."""
    monkeypatch.setenv("ASCEND_DEPLOY_STATE_DIR", str(tmp_path / "state-root"))
    copy = free_port_stacks(tmp_path)
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(copy))
    return copy


def _save(state_dir: Path, *records: ProcessRecord) -> None:
    StackState("local", "http://127.0.0.1:9", list(records)).save(state_dir)


def _alive(proc) -> bool:  # type: ignore[no-untyped-def]
    return proc.popen.poll() is None


def test_identity_tells_the_started_process_from_a_reused_pid(procs) -> None:  # type: ignore[no-untyped-def]
    from ascend_runtime.local.identity import Verdict, identify, identity_after_start

    proc = sleeper(procs)
    now = identity_after_start(proc.pid)
    assert now is not None and now.cmdline[-1] == "import time; time.sleep(120)" and now.start_time > 0
    assert identify(proc.pid, now.start_time, now.cmdline)[0] is Verdict.SAME
    assert identify(proc.pid, now.start_time + 1, now.cmdline)[0] is Verdict.OTHER  # another start: a reused pid
    assert identify(proc.pid, now.start_time, ["python", "-m", "ascend_runtime", "sim"])[0] is Verdict.OTHER
    assert identify(proc.pid, None, list(now.cmdline))[0] is Verdict.SAME  # an older state file: argv alone
    proc.kill()
    assert identify(proc.pid, now.start_time, now.cmdline)[0] is Verdict.GONE


def test_down_never_signals_an_unrelated_process_a_state_file_names(tmp_path: Path, stacks: Path, procs,  # type: ignore[no-untyped-def]
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    bystander = sleeper(procs)
    state = tmp_path / "state"
    _save(state, ProcessRecord("proxy", "proxy", bystander.pid, ["python", "-m", "ascend_runtime", "proxy"],
                               "http://127.0.0.1:9/health", str(tmp_path / "p.log")))
    assert main(["down", "--stack", "local", "--state-dir", str(state)]) == 0
    out = capsys.readouterr()
    assert _alive(bystander), "down signalled a process the state file named but `up` never started"
    assert f"recorded pid {bystander.pid} is now another process" in out.out + out.err and "not signalled" in out.out


def test_down_never_signals_a_pid_whose_start_time_differs(tmp_path: Path, stacks: Path, procs,  # type: ignore[no-untyped-def]
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from ascend_runtime.local.identity import identity_after_start

    proc = sleeper(procs)
    now = identity_after_start(proc.pid)
    assert now is not None
    state = tmp_path / "state"
    _save(state, ProcessRecord("decode-0", "simulator", proc.pid, list(now.cmdline), "http://127.0.0.1:9/health",
                               str(tmp_path / "d.log"), now.start_time - 1, list(now.cmdline)))
    assert main(["down", "--stack", "local", "--state-dir", str(state)]) == 0
    assert _alive(proc) and "not signalled" in capsys.readouterr().out
    _save(state, ProcessRecord("decode-0", "simulator", proc.pid, list(now.cmdline), "http://127.0.0.1:9/health",
                               str(tmp_path / "d.log"), now.start_time, list(now.cmdline)))
    assert main(["down", "--stack", "local", "--state-dir", str(state)]) == 0  # the very process: stopped
    assert "stack local is down (1 processes stopped)" in capsys.readouterr().out
    wait_for(lambda: not _alive(proc), 10, "the recorded process to stop")


def test_a_gone_pid_whose_port_still_answers_is_reported_serving(tmp_path: Path, stacks: Path, procs,  # type: ignore[no-untyped-def]
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    server, port = http_server(procs)  # the stack's proxy, restarted by hand: its pid is not the recorded one
    gone = sleeper(procs)
    gone.kill()
    state = tmp_path / "state"
    _save(state, ProcessRecord("proxy", "proxy", gone.pid, ["python", "-m", "ascend_runtime", "proxy"],
                               f"http://127.0.0.1:{port}/health", str(tmp_path / "p.log"), 1, ["python"]))
    assert main(["down", "--stack", "local", "--state-dir", str(state)]) == 1
    err = capsys.readouterr().err
    assert f"recorded pid {gone.pid} is gone, but its port 127.0.0.1:{port} still answers" in err, err
    assert f"pid {server.pid}" in err and "is not down" in err and "stopped" not in err.replace("not down", "")
    assert _alive(server) and [p.name for p in StackState.load(state).processes] == ["proxy"]  # kept to look at


@pytest.fixture
def proxy_port_answers(stacks: Path) -> Iterator[tuple[str, int]]:
    """The free-port local stack's proxy address, answered by a socket this test holds."""
    plan = load_plan("local", stacks)
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((plan.proxy_host, plan.proxy_port))
        listener.listen(8)
        yield plan.proxy_host, plan.proxy_port


@pytest.mark.parametrize("state_file", ["missing", "empty"])
@pytest.mark.parametrize("command", ["down", "status"])
def test_a_lost_state_while_the_stacks_ports_answer_is_said(tmp_path: Path, stacks: Path,
                                                            proxy_port_answers: tuple[str, int], state_file: str,
                                                            command: str, capsys: pytest.CaptureFixture[str]) -> None:
    host, port = proxy_port_answers
    state = tmp_path / "state"
    if state_file == "empty":
        state.mkdir()
        (state / "state.json").write_text("")
    assert main([command, "--stack", "local", "--state-dir", str(state)]) == 1
    text = capsys.readouterr()
    said = text.out + text.err
    assert "state lost" in said and "processes may still run on ports" in said, said
    assert f"port {port} on {host} (ports.proxy, proxy)" in said and "not running" not in said


def test_a_lost_state_with_the_ports_free_is_not_running(tmp_path: Path, stacks: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["down", "--stack", "local", "--state-dir", str(tmp_path / "state")]) == 0
    assert "stack local is not running" in capsys.readouterr().out
