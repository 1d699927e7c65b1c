"""One file-reading door: regular files only, a size cap per kind before reading, bounded parse.

A FIFO, ``/dev/zero``, a directory and a socket are refused naming the path, at once (a FIFO's ``open`` would
wait for a writer; ``/dev/zero`` never ends), for every kind of file the kit reads: the state file, a playbook,
an inventory and a stack file, ``known_hosts``, an expert-load dump and a ``.npy`` load history, JSON inputs.
A ``.npy`` whose header claims gigabytes is refused before anything is allocated. The CLI cases run as real
processes with a deadline, so a regression hangs no test run: it fails it.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest


ROOT = Path(__file__).resolve().parents[2]
#: Seconds a refused file may take: far less than any read of a device or wait on a FIFO.
DEADLINE_S = 30
#: Address space of a child process here (bytes): the kit needs under 1 GiB; reading /dev/zero needs it all.
MEMORY_LIMIT = 3 << 30


def _planted(kind: str, path: Path) -> None:
    """Put a non-regular file of ``kind`` at ``path``."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))  # left bound: the test process keeps it until exit
        _SOCKETS.append(sock)


_SOCKETS: list[socket.socket] = []
KINDS = ("fifo", "dev-zero", "directory", "socket")
WORDS = {"fifo": "FIFO", "dev-zero": "character device", "directory": "directory", "socket": "socket"}


@pytest.fixture
def unblock() -> Iterator[list[Path]]:
    """FIFOs to open for writing after the test, so a reader a regression left blocked on one gets EOF."""
    fifos: list[Path] = []
    yield fifos
    for fifo in fifos:
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass


def _within(call: Callable[[], Any], fifos: list[Path], path: Path) -> Any:
    """``call()``'s result (or its exception, raised here); fails the test when it has not returned within the
    deadline (a blocked read)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    if thread.is_alive():
        fifos.append(path)
        pytest.fail(f"reading {path} did not return: it blocked or read without end")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def _limited() -> None:
    """In the child: at most :data:`MEMORY_LIMIT` bytes of address space, so a regression that reads
    ``/dev/zero`` fails with MemoryError instead of taking the machine's memory."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _python(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` with this checkout importable, a deadline and a memory limit."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=DEADLINE_S, preexec_fn=_limited)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python {' '.join(argv)[:200]} did not finish in {DEADLINE_S} s: it blocked on a file")


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return _python("-m", "ascend_runtime", *argv, cwd=cwd)


@pytest.mark.parametrize("kind", KINDS)
def test_the_door_refuses_every_non_regular_file_naming_it(tmp_path: Path, kind: str, unblock: list[Path]) -> None:
    from ascend_runtime.files.read import STATE_FILE, FileRefused, read_bytes

    path = tmp_path / "state.json"
    _planted(kind, path)
    unblock.append(path)
    with pytest.raises(FileRefused) as err:
        _within(lambda: read_bytes(path, STATE_FILE), [], path)
    assert str(path) in str(err.value) and WORDS[kind] in str(err.value) and "regular file" in str(err.value)


def test_the_size_is_capped_before_reading_and_while_reading(tmp_path: Path) -> None:
    from ascend_runtime.files.read import TOKEN, FileKind, FileRefused, read_bytes

    big = tmp_path / "token"
    with open(big, "wb") as fh:
        fh.truncate(1 << 40)  # a sparse terabyte: refused by its size, never read
    with pytest.raises(FileRefused, match="1099511627776 bytes, more than the 4096"):
        read_bytes(big, TOKEN)
    with pytest.raises(FileRefused, match="holds more than the 10 bytes"):  # /proc reports size 0
        read_bytes("/proc/self/status", FileKind("status", 10, ""))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", ["status", "down"])
def test_status_and_down_refuse_a_state_file_that_is_no_regular_file(tmp_path: Path, kind: str, command: str,
                                                                      unblock: list[Path]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    _planted(kind, state / "state.json")
    unblock.append(state / "state.json")
    done = _cli(command, "--state-dir", str(state), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--state-dir" in done.stderr and "state.json" in done.stderr and WORDS[kind] in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_playbook_stack_and_inventory_that_are_no_regular_file_are_refused(tmp_path: Path, kind: str,
                                                                             unblock: list[Path]) -> None:
    book = tmp_path / "book.yaml"
    _planted(kind, book)
    unblock.append(book)
    done = _cli("playbook", "run", str(book), "--stack", "local", "--check", cwd=tmp_path)
    assert done.returncode == 2 and "playbook" in done.stderr + done.stdout and WORDS[kind] in done.stderr + done.stdout
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    _planted(kind, stacks / "Pulumi.local.yaml")
    unblock.append(stacks / "Pulumi.local.yaml")
    done = _cli("plan", "--stack", "local", "--stacks-dir", str(stacks), cwd=tmp_path)
    assert done.returncode == 2 and "  - stack: " in done.stderr and WORDS[kind] in done.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_json_inputs_that_are_no_regular_file_are_refused(tmp_path: Path, kind: str, unblock: list[Path]) -> None:
    plan = tmp_path / "plan.json"
    _planted(kind, plan)
    unblock.append(plan)
    done = _cli("pd-planner", "--plan-file", str(plan), "--dry-run", "--max-cycles", "1", cwd=tmp_path)
    assert done.returncode == 2 and "--plan-file" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_json_number_of_thousands_of_digits_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    load = tmp_path / "load.json"
    load.write_text('{"expert_load": [[' + "9" * 5000 + "]]}")
    done = _cli("balance", "plan", "--load", str(load), "--ranks", "4", "--slots", "4", "--out",
                str(tmp_path / "map.json"), cwd=tmp_path)
    assert done.returncode == 2 and "--load" in done.stderr and "5000 digits" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr) < 1000


KNOWN_HOSTS = """
import sys
from ascend_runtime.hosts.ssh import KnownHosts
print(KnownHosts.load(sys.argv[1]).error)
"""
DUMPS = """
import sys
from pathlib import Path
from ascend_runtime.balancer.sources import DirLoadSource
source = DirLoadSource("decode", Path(sys.argv[1]))
window = source.read()
print(window is not None, source.ranks_read, [(p.name, why) for p, why in source.skipped])
"""


@pytest.mark.parametrize("kind", KINDS)
def test_known_hosts_that_is_no_regular_file_is_an_error_naming_it(tmp_path: Path, kind: str,
                                                                  unblock: list[Path]) -> None:
    path = tmp_path / "known_hosts"
    _planted(kind, path)
    unblock.append(path)
    done = _python("-c", KNOWN_HOSTS, str(path), cwd=tmp_path)
    assert done.returncode == 0 and str(path) in done.stdout and WORDS[kind] in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_an_expert_load_dump_that_is_no_regular_file_is_skipped_naming_it(tmp_path: Path, kind: str,
                                                                         unblock: list[Path]) -> None:
    snapshot = tmp_path / "w0000"
    snapshot.mkdir()
    good = {"rank": 1, "seq": 1, "layers": 1, "experts": 2, "expert_load": [[3, 4]]}
    (snapshot / "rank_1.json").write_text(json.dumps(good))
    _planted(kind, snapshot / "rank_0.json")
    unblock.append(snapshot / "rank_0.json")
    done = _python("-c", DUMPS, str(snapshot), cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("True [1] [('rank_0.json'"), done.stdout + done.stderr
    assert WORDS[kind] in done.stdout


def _npy_claiming(path: Path, shape: tuple[int, ...], dtype: str = "<f8", data: bytes = b"\0" * 64) -> Path:
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(data)
    return path


def test_an_npy_header_claiming_gigabytes_is_refused_before_allocating(tmp_path: Path) -> None:
    from ascend_runtime.files.npy import load_npy
    from ascend_runtime.files.read import FileRefused

    lie = _npy_claiming(tmp_path / "lie.npy", (100_000, 58, 100_000))  # 4.6 TB of float64 claimed, 64 B held
    with pytest.raises(FileRefused, match=r"claims shape \(100000, 58, 100000\).*holds 64 bytes"):
        load_npy(lie)
    done = _cli("balance", "plan", "--history", str(lie), "--ranks", "4", "--slots", "4", "--out",
                str(tmp_path / "map.json"), cwd=tmp_path)
    assert done.returncode == 2 and "--history" in done.stderr and "claims shape" in done.stderr, done.stderr
    good = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    np.save(tmp_path / "good.npy", good)
    assert (load_npy(tmp_path / "good.npy") == good).all()
    np.save(tmp_path / "fortran.npy", np.asfortranarray(good[0]))
    assert (load_npy(tmp_path / "fortran.npy") == good[0]).all()
    with pytest.raises(FileRefused, match="object"):
        load_npy(_npy_claiming(tmp_path / "objects.npy", (1,), "|O", b"\0" * 8))
    np.savez(tmp_path / "archive.npz", a=good)
    with pytest.raises(FileRefused, match="npz archive"):
        load_npy(tmp_path / "archive.npz")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "socket"])
def test_an_npy_history_that_is_no_regular_file_is_refused(tmp_path: Path, kind: str, unblock: list[Path]) -> None:
    path = tmp_path / "load.npy"
    _planted(kind, path)
    unblock.append(path)
    done = _cli("balance", "plan", "--history", str(path), "--ranks", "4", "--slots", "4", "--out",
                str(tmp_path / "map.json"), cwd=tmp_path)
    assert done.returncode == 2 and "--history" in done.stderr and "Traceback" not in done.stderr, done.stderr
