"""A newcomer's first minutes: a fresh copy of the project, a fresh venv, the README's first command.

The copy holds what a clone of this working tree would (``git ls-files``:
tracked files as they are now, plus untracked files that are not ignored), so
a file the project needs but git would not carry breaks this test. The venv is
new (``python -m venv``); the project is installed into it with ``pip install
-e .`` as the README says. Its dependencies are made visible from the
interpreter running the tests (a path entry, so that interpreter's own install
of this project is not), so pip fetches at most the small build requirements
from PyPI while still installing this copy's package, entry point and data.

Then, on the standard ports as the README runs it: ``ascend-deploy up --stack
local --detach`` comes up and passes its checks; a second ``up`` on the same
ports is refused, naming a port and its stack key, while the first keeps
serving; bare ``status`` finds it; bare ``down`` stops it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from .conftest import (
    ROOT,
    assert_checks_passed,
    bindable,
    kill_recorded,
    plan_addresses,
)

pytestmark = pytest.mark.slow


def copy_of_the_tree(dest: Path) -> Path:
    """The files a clone of this working tree would have, copied to ``dest``."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tree to copy is unknown")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():  # listed but deleted in the working tree: a clone would not need it
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def fresh_venv(where: Path) -> Path:
    """A new venv that sees the test interpreter's installed dependencies (not its .pth hooks); its python."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, capture_output=True, timeout=300)
    python = where / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    Path(site, "outer-dependencies.pth").write_text("".join(f"{p}\n" for p in paths))
    return python


def install_project(python: Path, clone: Path) -> None:
    """`pip install -e .` in the copy, as the README says; offline without build isolation if that fails.

    The dependencies are already visible, so pip downloads at most the build requirements
    (setuptools, wheel) from PyPI; without network the offline install needs them installed.
    """
    attempts = [["-e", "."], ["--no-index", "--no-build-isolation", "-e", "."]]
    outputs = []
    for extra in attempts:
        run = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *extra],
                             cwd=clone, capture_output=True, text=True, timeout=600)
        if run.returncode == 0:
            return
        outputs.append(f"$ pip install {' '.join(extra)}\n{run.stdout}{run.stderr}"[-3000:])
    pytest.fail("pip install -e . failed in the fresh venv:\n" + "\n".join(outputs))


def test_readme_first_command_from_a_fresh_copy(tmp_path: Path) -> None:
    taken = [f"{host}:{port}" for host, port in plan_addresses(ROOT / "stacks") if not bindable(host, port)]
    if taken:
        pytest.skip("the standard local ports are in use on this machine: " + ", ".join(taken))
    clone = copy_of_the_tree(tmp_path / "clone")
    python = fresh_venv(tmp_path / "venv")
    install_project(python, clone)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ASCEND_DEPLOY_STACKS", "VIRTUAL_ENV", "PYTHONHOME")}
    root = tmp_path / "state-root"
    env.update(ASCEND_DEPLOY_STATE_DIR=str(root), PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}")
    where = subprocess.run([str(python), "-c", "import ascend_runtime; print(ascend_runtime.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    assert Path(where.strip()).is_relative_to(clone), f"the venv imports {where.strip()}, not the fresh copy"

    def deploy(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python.parent / "ascend-deploy"), *args], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=timeout)

    second_state = tmp_path / "second"
    try:
        first = deploy("up", "--stack", "local", "--detach")
        assert_checks_passed(first)
        assert f"state in {root / 'local'}" in first.stdout

        second = deploy("up", "--stack", "local", "--detach", "--state-dir", str(second_state))
        assert second.returncode == 1, second.stdout + second.stderr
        assert "ports are taken, nothing was started" in second.stderr, second.stderr
        assert "port 19000 on 127.0.0.1 (ports.proxy, proxy) is held by pid" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr and not (second_state / "state.json").exists()

        status = deploy("status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "local stack local" in status.stdout and "NOT OURS" not in status.stdout

        down = deploy("down")
        assert down.returncode == 0 and "stack local is down (5 processes stopped)" in down.stdout, down.stdout + down.stderr
        assert deploy("status").returncode == 1
    finally:
        kill_recorded(root / "local")
        kill_recorded(second_state)
