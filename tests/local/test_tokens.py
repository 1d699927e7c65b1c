"""The local stack's admin tokens: files created 0600 from the start, each process given only its own token."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.local import runner
from ascend_runtime.local.topology import PROXY_TOKEN_ENV, SIM_TOKEN_ENV, TOKEN_FILES
from ascend_runtime.planner import load_plan


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, str]]]:
    """Record the processes start_all would start instead of starting them."""
    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_start(argv: Any, log_path: Path, env: dict[str, str] | None = None, unset: Any = ()) -> int:
        assert set(unset) >= {PROXY_TOKEN_ENV, SIM_TOKEN_ENV}  # nothing inherited from the caller
        calls.append((list(argv), dict(env or {})))
        return 999_999_000 + len(calls)

    monkeypatch.setattr(runner, "start_process", fake_start)
    return calls


@pytest.fixture
def file_ops(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, list[Any]]:
    """Spy on os.open (and the mode each file has right after it) and refuse any chmod under tmp_path."""
    seen: dict[str, list[Any]] = {"open": [], "chmod": []}
    real_open = os.open

    def spy_open(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, flags, mode, *args, **kwargs)
        dir_fd = kwargs.get("dir_fd")  # files are opened relative to their open directory (files/write.py)
        full = Path(os.readlink(f"/proc/self/fd/{dir_fd}")) / path if dir_fd is not None else Path(path)
        seen["open"].append((full, flags, mode, stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    real_chmod = os.chmod

    def spy_chmod(path: Any, mode: int, *args: Any, **kwargs: Any) -> None:
        if str(tmp_path) in str(path):
            seen["chmod"].append((Path(path), mode))
        real_chmod(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "chmod", spy_chmod)
    return seen


def test_token_files_are_created_0600_never_wider(tmp_path: Path, started: list[Any], file_ops: dict[str, list[Any]]) -> None:
    state_dir = tmp_path / "state"
    old_umask = os.umask(0)  # the creation itself must restrict the mode, not the caller's umask
    try:
        runner.start_all(load_plan("local"), state_dir)
    finally:
        os.umask(old_umask)
    assert set(TOKEN_FILES.values()) == {"proxy-admin-token", "sim-admin-token"}
    for name in TOKEN_FILES.values():
        path = state_dir / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, name
        opens = [o for o in file_ops["open"] if o[0] == path]
        assert len(opens) == 1, (name, file_ops["open"])
        _, flags, mode, mode_at_creation = opens[0]
        assert flags & os.O_CREAT and flags & os.O_EXCL and mode == 0o600, name
        assert mode_at_creation == 0o600, name
        assert len(path.read_text().strip()) >= 32
    assert not [c for c in file_ops["chmod"] if c[0].name in TOKEN_FILES.values()]
    assert (state_dir / TOKEN_FILES[PROXY_TOKEN_ENV]).read_text() != (state_dir / TOKEN_FILES[SIM_TOKEN_ENV]).read_text()


def test_a_token_file_left_with_a_wider_mode_is_replaced(tmp_path: Path, started: list[Any]) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    for name in TOKEN_FILES.values():
        (state_dir / name).write_text("old-token-readable-by-all")
        (state_dir / name).chmod(0o644)
    runner.start_all(load_plan("local"), state_dir)
    for name in TOKEN_FILES.values():
        assert (state_dir / name).read_text() != "old-token-readable-by-all"
        assert stat.S_IMODE((state_dir / name).stat().st_mode) == 0o600


def test_each_process_gets_only_the_token_it_uses(tmp_path: Path, started: list[Any]) -> None:
    state_dir = tmp_path / "state"
    runner.start_all(load_plan("local"), state_dir)
    proxy_token = (state_dir / TOKEN_FILES[PROXY_TOKEN_ENV]).read_text().strip()
    sim_token = (state_dir / TOKEN_FILES[SIM_TOKEN_ENV]).read_text().strip()
    kinds = []
    for argv, env in started:
        sub = argv[argv.index("ascend_runtime") + 1]
        kinds.append(sub)
        if sub == "sim":
            assert env == {SIM_TOKEN_ENV: sim_token}
            assert argv[argv.index("--admin-token-env") + 1] == SIM_TOKEN_ENV
        elif sub == "proxy":
            assert env == {PROXY_TOKEN_ENV: proxy_token}
            assert argv[argv.index("--admin-token-env") + 1] == PROXY_TOKEN_ENV
        elif sub == "balance":  # it applies maps to the simulators; it never calls the proxy's admin API
            assert env == {SIM_TOKEN_ENV: sim_token}
            assert argv[argv.index("--sim-token-env") + 1] == SIM_TOKEN_ENV
        else:
            raise AssertionError(argv)
        assert proxy_token not in " ".join(argv) and sim_token not in " ".join(argv)
    assert kinds.count("sim") == len(load_plan("local").instances) and "proxy" in kinds and "balance" in kinds
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
