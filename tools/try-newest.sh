#!/usr/bin/env bash
# Install the newest versions pyproject.toml allows (ignoring requirements.lock) into a fresh virtual
# environment and run the test suite there, so a new release of a dependency that breaks the kit is seen
# before a user's fresh install sees it. Prints the versions that differ from the lock, then pytest's verdict.
#   bash tools/try-newest.sh [VENV_DIR] [pytest args...]     (default VENV_DIR: a new temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-$(mktemp -d)/venv}"
shift || true
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q --upgrade --upgrade-strategy eager -e '.[test]'
echo "newer than requirements.lock:"
"$venv/bin/python" - <<'PY'
import importlib.metadata as md
pins = {}
for line in open("requirements.lock", encoding="utf-8"):
    line = line.split("#", 1)[0].strip()
    if line:
        name, _, version = line.partition("==")
        pins[name.lower()] = version
for name, version in sorted(pins.items()):
    try:
        now = md.version(name)
    except md.PackageNotFoundError:
        continue
    if now != version:
        print(f"  {name}: {version} -> {now}")
PY
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider --deselect tests/test_lock.py::test_the_installed_versions_are_the_locked_ones "$@"
