"""`ascend-deploy render`: write the rendered artifacts of a stack to a directory.

Writes DIR/plan.json, DIR/ranktables/<table>.json, DIR/hccn/<node>.conf,
DIR/launch/<instance>-rank<k>.sh, DIR/DEPLOYMENT.md and DIR/manifests/ (exactly
the Kubernetes objects the Pulumi program registers).
Output is deterministic; no secret is ever read or written. DIR must be new,
empty, or hold a render of the same stack, which is then replaced wholly (files
of the old render the new one does not write are deleted; DIR/.ascend-render.json
lists what was written). Another stack's render, or other files, are refused
(exit 2) unless --force.
"""

from __future__ import annotations

import argparse
import sys

from ascend_runtime.cli.stackargs import add_stack_options, path_arg
from ascend_runtime.config.errors import ConfigError
from ascend_runtime.config.loader import load_stack
from ascend_runtime.planner import build_plan
from ascend_runtime.render.artifacts import (
    RenderDirError,
    extra_files,
    render_artifacts,
    write_artifacts,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `render` command."""
    parser = subparsers.add_parser(
        "render", help="render rank tables, launch scripts, hccn.conf and the deployment sheet", description=__doc__
    )
    add_stack_options(parser)
    parser.add_argument("--out", required=True, metavar="DIR", type=path_arg, help="output directory (created if missing)")
    parser.add_argument("--force", action="store_true",
                        help="replace another stack's render in DIR, or write into a non-empty DIR")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Render the stack's Plan into --out; exit 2 when the stack is invalid."""
    try:
        stack = load_stack(args.stack, args.stacks_dir)
        plan = build_plan(stack)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    files = {**render_artifacts(plan, stack.inventory), **extra_files(plan)}
    try:
        written = write_artifacts(files, args.out, stack=plan.stack, force=args.force)
    except RenderDirError as exc:
        print(f"error: --out: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: --out: cannot write to {args.out}: {exc.strerror or type(exc).__name__}; "
              "name a directory this user can write", file=sys.stderr)
        return 2
    print(f"rendered {len(written)} files of stack {plan.stack} to {args.out}")
    return 0
