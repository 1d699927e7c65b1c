#!/usr/bin/env python3
"""Write ``requirements.lock``: the exact version of every package the kit and its extras install.

The lock is a pip constraints file (``name==version`` lines, one per distribution, sorted), resolved by
pip's own resolver as a fresh environment would resolve ``pyproject.toml`` today (``pip install --dry-run
--ignore-installed --report``). pip is what CI (``tests/run.sh``), the README and the Dockerfile install with,
so the lock needs no second tool to read or refresh, and ``pip install -c requirements.lock -e '.[test]'``
installs the same versions on every machine. ``tests/test_lock.py`` checks that the lock satisfies
``pyproject.toml`` and that the environment the tests run in was installed from it.

Usage::

    python tools/lock.py            # re-resolve and rewrite requirements.lock
    python tools/lock.py --check    # exit 1 if pyproject.toml asks for something the lock does not pin

The resolution is for Linux and Python 3.11, the platform the kit ships on (the runtime image is
python:3.11-slim). Exit codes: 0 written / consistent, 1 ``--check`` found a difference, 2 pip failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK_FILE = REPO_ROOT / "requirements.lock"
PYPROJECT = REPO_ROOT / "pyproject.toml"
#: Extras resolved into the lock: everything pyproject.toml offers but the real engine, which installs into a
#: virtual environment of its own (``ascend-deploy engine install``) with its own lock.
LOCKED_EXTRAS = ("test",)
HEADER = """\
# Exact versions of every package the kit installs (pip constraints format), resolved from pyproject.toml
# for Linux and Python 3.11 by pip's own resolver. Refresh: python tools/lock.py. Install:
#   pip install -c requirements.lock -e '.[test]'
"""


def resolve(extras: tuple[str, ...] = LOCKED_EXTRAS) -> dict[str, str]:
    """Distribution name (lower case) -> version, as pip resolves ``.[extras]`` into an empty environment."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        target = f".[{','.join(extras)}]" if extras else "."
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), target]
        done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit(2)
        installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    pins = {}
    for item in installs:
        meta = item["metadata"]
        name = meta["name"].lower().replace("_", "-")
        if name == "ascend-deepseek-deploy":
            continue
        pins[name] = meta["version"]
    return dict(sorted(pins.items()))


def render(pins: dict[str, str]) -> str:
    return HEADER + "".join(f"{name}=={version}\n" for name, version in pins.items())


def read_lock(path: Path = LOCK_FILE) -> dict[str, str]:
    """The lock's pins: name (lower case, dashes) -> version."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def project_requirements(path: Path = PYPROJECT) -> list[str]:
    """Every requirement string of pyproject.toml: the dependencies and the locked extras."""
    project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {})
    return [*project["dependencies"], *(r for extra in LOCKED_EXTRAS for r in extras.get(extra, ()))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        from packaging.requirements import Requirement  # noqa: PLC0415 (pip's own dependency, present wherever pip is)

        pins = read_lock()
        problems = []
        for text in project_requirements():
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate():
                continue
            version = pins.get(req.name.lower().replace("_", "-"))
            if version is None or not req.specifier.contains(version, prereleases=True):
                problems.append(f"{text}: the lock has {version or 'nothing'}")
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    pins = resolve()
    LOCK_FILE.write_text(render(pins), encoding="utf-8")
    print(f"wrote {LOCK_FILE.relative_to(REPO_ROOT)}: {len(pins)} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
