"""The `ascend-deploy` command line.

Each sub-command lives in its own module under `ascend_runtime/cli/commands/`
and exposes ``register(subparsers)``; the module adds its parser(s) and sets
``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an
exit code). Commands are discovered, so adding a command never edits this file.

Start-up is lazy: :func:`main` reads which commands each module registers from
the module's source (the literal ``subparsers.add_parser("NAME", help="...")``
calls of its ``register``) without importing it, then imports only the module
of the command being run. ``--version`` and ``--help`` therefore import no
command module at all (tests/cli guard this). A module whose ``register`` does
not use literal names is imported, which is correct, only slower.

Exit codes: 0 success, 1 a check or operation failed, 2 invalid input
(stack, inventory or arguments). A ``ConfigError`` that escapes a command is
printed by :func:`main` (exit 2), so invalid input never ends in a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

from ascend_runtime import __version__
from ascend_runtime.cli.parser import SuggestingParser

COMMANDS_PACKAGE = "ascend_runtime.cli.commands"
COMMANDS_DIR = Path(__file__).resolve().parent / "commands"
DESCRIPTION = "Plan, render, run and check PD-separated DeepSeek-V3/R1 serving on Ascend NPUs."


def command_modules() -> list[str]:
    """Names of the modules under cli/commands/, sorted (the order of the help listing)."""
    return sorted(p.stem for p in COMMANDS_DIR.glob("*.py") if not p.stem.startswith("_"))


def registered_commands(module: str) -> list[tuple[str, str | None]] | None:
    """(command, help) pairs ``module``'s ``register`` adds, read from its source; None if not literal."""
    import ast  # noqa: PLC0415 - only on this path

    try:
        tree = ast.parse((COMMANDS_DIR / f"{module}.py").read_text())
    except (OSError, SyntaxError):
        return None
    register = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "register"), None)
    if register is None or not register.args.args:
        return None
    subparsers = register.args.args[0].arg
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(register):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_parser"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == subparsers):
            continue
        if not node.args or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
            return None
        help_text: str | None = None
        for kw in node.keywords:
            if kw.arg == "help":
                if not isinstance(kw.value, ast.Constant):
                    return None
                help_text = kw.value.value
            elif kw.arg == "aliases":
                return None
        found.append((node.args[0].value, help_text))
    return found or None


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = SuggestingParser(prog="ascend-deploy", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser, subparsers


def _register(module: str, subparsers: argparse._SubParsersAction) -> None:
    importlib.import_module(f"{COMMANDS_PACKAGE}.{module}").register(subparsers)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; every command fully registered, or only ``command``'s module.

    With ``command``, the other commands are placeholders carrying their name and help
    (enough for the listing and for argparse's "invalid choice" message); modules whose
    commands cannot be read from source are always imported.
    """
    parser, subparsers = _top_parser()
    for module in command_modules():
        listed = registered_commands(module) if command is not None else None
        if listed is None or command in {name for name, _ in listed}:
            _register(module, subparsers)
        else:
            for name, help_text in listed:
                subparsers.add_parser(name, help=help_text, add_help=False)
    return parser


def _command_word(argv: Sequence[str]) -> str:
    """The first argument that is not an option ('' when there is none: --help, --version, nothing)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `ascend-deploy`; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_word(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except Exception as exc:
        # invalid input a command did not report itself: the message, exit 2, never a traceback
        from ascend_runtime.config.errors import ConfigError  # noqa: PLC0415 - keeps start-up lazy

        if not isinstance(exc, ConfigError):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
