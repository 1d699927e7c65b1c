"""The CLI starts without importing what only commands need: `--version` and `--help` stay fast.

Guarded structurally, not by timing (the 2-core box's load would decide a timing
test): the real entry point (`python -m ascend_runtime`) is run under
``-X importtime`` and the modules it imported are checked against the heavy
ones. Start-up time itself is measured by benchmarks/cli_startup.py.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from ascend_runtime import __version__
from ascend_runtime.cli import build_parser, command_modules, main, registered_commands

#: Top-level packages no command-free invocation may import (each costs tens to hundreds of ms).
HEAVY = ("pulumi", "pulumi_kubernetes", "kubernetes", "aiohttp", "numpy", "jinja2", "pydantic", "paramiko",
         "rich", "yaml", "jsonschema", "prometheus_client", "uvloop", "asyncio")
#: Our own packages that pull those in (the config models, the planner, every command module).
HEAVY_OURS = ("ascend_runtime.config", "ascend_runtime.planner", "ascend_runtime.cli.commands",
              "ascend_runtime.cli.stackargs", "ascend_runtime.local", "ascend_runtime.render")


def imported_by(*args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `python -X importtime -m ascend_runtime ARGS`; the result and every module it imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "ascend_runtime", *args],
                          capture_output=True, text=True, timeout=60)
    modules = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return proc, modules


def heavy_among(modules: set[str]) -> list[str]:
    return sorted(m for m in modules
                  if m.split(".")[0] in HEAVY or any(m == h or m.startswith(h + ".") for h in HEAVY_OURS))


@pytest.mark.parametrize("args", [("--version",), ("--help",), ()], ids=["version", "help", "no-args"])
def test_command_free_invocations_import_nothing_heavy(args: tuple[str, ...]) -> None:
    proc, modules = imported_by(*args)
    assert proc.returncode == (2 if not args else 0), proc.stderr[-2000:]
    assert "ascend_runtime.cli" in modules  # the entry point really ran
    assert heavy_among(modules) == []
    if args == ("--version",):
        assert proc.stdout.strip() == f"ascend-deploy {__version__}"


def test_the_guard_can_fail() -> None:
    """A command that needs the planner imports it, and the guard sees that."""
    proc, modules = imported_by("plan", "--stack", "local", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ascend_runtime.planner" in heavy_among(modules) and "pydantic" in heavy_among(modules)


def _really_registered(module: str) -> list[tuple[str, str | None]]:
    import importlib

    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    importlib.import_module(f"ascend_runtime.cli.commands.{module}").register(subparsers)
    return [(a.dest, a.help) for a in subparsers._choices_actions]  # noqa: SLF001


@pytest.mark.parametrize("module", command_modules())
def test_the_command_index_read_from_source_is_what_register_adds(module: str) -> None:
    """Every command module's commands can be read without importing it (else --help would import it)."""
    listed = registered_commands(module)
    assert listed is not None, f"{module}.register: use literal add_parser('name', help='...') calls"
    assert listed == _really_registered(module)


def test_help_is_the_same_as_with_every_command_imported(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == build_parser().format_help()


def test_a_command_gets_its_real_parser_and_others_stay_listed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["status", "--help"])
    assert exit_.value.code == 0
    assert "--state-dir" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["nosuch"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nosuch'" in err and "'render'" in err and "'up'" in err
