"""State of a running local stack: one JSON file and a logs/ directory per stack.

Default location: ``$ASCEND_DEPLOY_STATE_DIR/<stack>`` or
``~/.local/state/ascend-deploy/<stack>``. The file records, per process, its
name, kind, pid (also its process group id), argv, health URL and log path.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


def default_state_root() -> Path:
    """Where stacks keep their state unless --state-dir says otherwise."""
    env = os.environ.get("ASCEND_DEPLOY_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ascend-deploy"


@dataclass
class ProcessRecord:
    """One started process."""

    name: str
    kind: str
    pid: int
    argv: list[str]
    health_url: str
    log: str


@dataclass
class StackState:
    """Everything `status` and `down` need about a running local stack."""

    stack: str
    proxy_url: str
    processes: list[ProcessRecord] = field(default_factory=list)
    started_at: float = 0.0
    speedup: float = 1.0

    def save(self, directory: Path) -> None:
        """Write state.json atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        os.replace(tmp, directory / "state.json")

    @classmethod
    def load(cls, directory: Path) -> StackState | None:
        """Read state.json, or None when the stack is not running from this directory."""
        path = directory / "state.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["processes"] = [ProcessRecord(**p) for p in data.get("processes", [])]
        return cls(**data)

    @staticmethod
    def clear(directory: Path) -> None:
        """Forget the stack (logs are kept for post-mortems)."""
        (directory / "state.json").unlink(missing_ok=True)
