"""The `ascend-deploy` command line.

Each sub-command lives in its own module under `ascend_runtime/cli/commands/`
and exposes ``register(subparsers)``; the module adds its parser(s) and sets
``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an
exit code). Commands are discovered, so adding a command never edits this file.

Exit codes: 0 success, 1 a check or operation failed, 2 invalid input
(stack, inventory or arguments).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from ascend_runtime import __version__
from ascend_runtime.cli import commands


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every discovered sub-command."""
    parser = argparse.ArgumentParser(
        prog="ascend-deploy",
        description="Plan, render, run and check PD-separated DeepSeek-V3/R1 serving on Ascend NPUs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{module_info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `ascend-deploy`; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args) or 0)
