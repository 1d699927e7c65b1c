"""An attached `up` follows state.json: a process `rollout` replaced is not an exit; a real exit is."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from ascend_runtime.local.runner import wait_while_serving
from ascend_runtime.local.state import ProcessRecord, StackState


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _record(proc: subprocess.Popen, name: str = "prefill-0") -> ProcessRecord:
    return ProcessRecord(name, "sim", proc.pid, ["sim"], "http://127.0.0.1:1/health", "/dev/null")


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _wait_in_thread(state: StackState, state_dir: Path, grace: float) -> tuple[threading.Thread, list[str]]:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(wait_while_serving(state, 0.05, state_dir, grace)), daemon=True)
    t.start()
    return t, out


def test_a_replaced_process_is_followed_not_taken_for_an_exit(tmp_path: Path) -> None:
    old, new = _sleeper(), _sleeper()
    try:
        state = StackState("local", "http://127.0.0.1:1", [_record(old)])
        state.save(tmp_path)
        # a grace far above the replacement's own gap, so no machine load can turn the gap into an exit
        thread, out = _wait_in_thread(StackState.load(tmp_path), tmp_path, grace=600.0)
        # what rollout does: stop the old process, drop its record, start and record the new one
        _stop(old)
        time.sleep(0.3)
        state.processes = []
        state.save(tmp_path)
        state.processes = [_record(new)]
        state.save(tmp_path)
        thread.join(1.0)
        assert thread.is_alive() and not out  # still serving: the replacement is followed
        StackState.clear(tmp_path)  # `down` from another shell ends the wait
        thread.join(60.0)
        assert not thread.is_alive() and len(out) == 1 and "state was removed" in out[0], out
    finally:
        for p in (old, new):
            if p.poll() is None:
                _stop(p)


def test_a_recorded_process_that_stays_dead_is_an_exit(tmp_path: Path) -> None:
    proc = _sleeper()
    StackState("local", "http://127.0.0.1:1", [_record(proc, "decode-0")]).save(tmp_path)
    _stop(proc)
    why = wait_while_serving(StackState.load(tmp_path), 0.05, tmp_path, replace_grace_s=0.3)
    assert why.startswith("decode-0 exited")


def test_state_removed_by_down_ends_the_wait_with_nothing_left_to_stop(tmp_path: Path) -> None:
    proc = _sleeper()
    try:
        StackState("local", "http://127.0.0.1:1", [_record(proc)]).save(tmp_path)
        state = StackState.load(tmp_path)
        StackState.clear(tmp_path)
        why = wait_while_serving(state, 0.05, tmp_path)
        assert "state was removed" in why and state.processes == []
    finally:
        _stop(proc)
