"""The text renderers the engine objects use (thin re-export of ``ascend_runtime.render``).

Rank tables, rank environment, launch scripts and hccn.conf come from
``ascend_runtime.render`` so that ``render`` and the Pulumi program share
one source; container paths come from ``ascend_runtime.render.paths``.
"""

from __future__ import annotations

from ascend_runtime.render.engine_args import engine_command
from ascend_runtime.render.environment import rank_env
from ascend_runtime.render.launch import hccn_conf, launch_script, leader_watch_script
from ascend_runtime.render.paths import (
    HCCN_CONF,
    LAUNCH_DIR,
    LEADER_WATCH,
    RANKTABLE_DIR,
)
from ascend_runtime.render.ranktables import rank_tables, ranktables_for_rank

__all__ = [
    "HCCN_CONF", "LAUNCH_DIR", "LEADER_WATCH", "RANKTABLE_DIR", "engine_command", "hccn_conf", "launch_script",
    "leader_watch_script",
    "rank_env", "rank_tables", "ranktable_file", "ranktables_for_rank",
]


def ranktable_file(name: str) -> str:
    """File name of a rank table inside :data:`RANKTABLE_DIR` (the ConfigMap key)."""
    return f"{name}.json"
