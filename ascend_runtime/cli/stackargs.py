"""Shared command-line options and error reporting for commands that read a stack."""

from __future__ import annotations

import argparse
import os
import sys

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner import Plan, load_plan


def add_stack_options(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """Add ``--stack NAME`` and ``--stacks-dir DIR``."""
    parser.add_argument("--stack", required=required, metavar="NAME", help="stack name (stacks/Pulumi.<NAME>.yaml)")
    parser.add_argument(
        "--stacks-dir", metavar="DIR", default=None, help="stacks directory (default: $ASCEND_DEPLOY_STACKS or ./stacks of the project)"
    )


def plan_or_exit(args: argparse.Namespace) -> Plan | None:
    """Build the stack's Plan, or print the configuration problems to stderr and return None (exit 2)."""
    try:
        return load_plan(args.stack, args.stacks_dir)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def input_error(field: str, message: str) -> int:
    """Report invalid input naming the option or field; returns exit code 2."""
    print(f"error: {field}: {message}", file=sys.stderr)
    return 2


def env_secret(flag: str, variable: str | None, what: str = "") -> tuple[str | None, int]:
    """The value of the environment variable an option names (``--token-env VAR``), or exit code 2.

    ``variable`` None (the option not given) gives ``(None, 0)``; a variable that is unset or empty
    is an input error naming ``flag``. ``what`` says what the value is, for the message.
    """
    if not variable:
        return None, 0
    value = os.environ.get(variable)
    if not value:
        return None, input_error(flag, f"variable {variable} is not set or empty{f' ({what})' if what else ''}")
    return value, 0
