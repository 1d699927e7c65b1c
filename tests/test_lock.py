"""requirements.lock pins what pyproject.toml asks for, and the tests run on the versions it pins."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def _lock_tool():
    spec = importlib.util.spec_from_file_location("lock_tool", REPO / "tools" / "lock.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("lock_tool", module)
    spec.loader.exec_module(module)
    return module


lock = _lock_tool()


def test_every_line_is_an_exact_pin():
    for line in (REPO / "requirements.lock").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and name.strip() and version.strip() and not set(version) & set("<>=!~*,; "), line


@pytest.mark.parametrize("text", lock.project_requirements())
def test_the_lock_satisfies_pyproject(text):
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate():
        pytest.skip(f"{text}: not for this platform")
    version = lock.read_lock().get(req.name.lower().replace("_", "-"))
    assert version is not None, f"{req.name} is in pyproject.toml but not in requirements.lock: run tools/lock.py"
    assert req.specifier.contains(version, prereleases=True), f"{text}: the lock pins {version}; run tools/lock.py"


def test_the_check_command_finds_a_pin_outside_the_range(tmp_path, monkeypatch):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["pyyaml>=99"]\n', encoding="utf-8")
    monkeypatch.setattr(lock, "PYPROJECT", pyproject)
    monkeypatch.setattr(lock, "project_requirements", lambda path=pyproject: ["pyyaml>=99"])
    assert lock.main(["--check"]) == 1
    monkeypatch.setattr(lock, "project_requirements", lambda path=pyproject: ["pyyaml>=6"])
    assert lock.main(["--check"]) == 0


def _installed_closure(root: str, extras: tuple[str, ...]) -> dict[str, str]:
    """Name -> installed version of ``root[extras]`` and everything it requires, transitively."""
    found: dict[str, str] = {}
    todo = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        key = name.lower().replace("_", "-")
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if key in found and not wanted:
            continue
        found[key] = dist.version
        for text in dist.requires or ():
            req = Requirement(text)
            envs = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, tuple(req.extras)))
    return found


def test_the_installed_versions_are_the_locked_ones():
    """tests/run.sh installs with ``-c requirements.lock``; a package at another version means it did not."""
    pins = lock.read_lock()
    installed = _installed_closure("ascend-deepseek-deploy", ("test",))
    assert len(installed) > 30, installed
    wrong = [f"{name} {version} (lock: {pins.get(name, 'not locked')})" for name, version in sorted(installed.items())
             if name != "ascend-deepseek-deploy" and pins.get(name) != version]
    assert not wrong, "installed without the lock: " + ", ".join(wrong) + "; pip install -c requirements.lock -e '.[test]'"
