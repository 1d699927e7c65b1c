"""Paths inside the engine container and of the project's templates, in one place.

The Pulumi program mounts the rank tables at :data:`RANKTABLE_DIR` and the
launch scripts at :data:`LAUNCH_DIR`; the rendered files refer to these paths.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Rank table JSON files (``<table>.json``), mounted read-only.
RANKTABLE_DIR = "/etc/ascend-deploy/ranktables"
#: Per-rank entrypoint scripts (``<instance>-rank<k>.sh``), mounted read-only.
LAUNCH_DIR = "/etc/ascend-deploy/launch"
#: The host's NPU network configuration, mounted from the node.
HCCN_CONF = "/etc/hccn.conf"

#: Project templates (Jinja2); ``$ASCEND_DEPLOY_TEMPLATES`` overrides.
DEFAULT_TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"


def templates_dir() -> Path:
    """The Jinja2 templates directory."""
    env = os.environ.get("ASCEND_DEPLOY_TEMPLATES")
    return Path(env) if env else DEFAULT_TEMPLATES_DIR


def ranktable_path(table: str) -> str:
    """Container path of a rank table by name."""
    return f"{RANKTABLE_DIR}/{table}.json"


#: The shell library every headless rank sources from beside its own script (templates/, copied as is).
LEADER_WATCH = "leader-watch.sh"


def launch_path(rank_name: str) -> str:
    """Container path of a rank's entrypoint script."""
    return f"{LAUNCH_DIR}/{rank_name}.sh"
