"""Every file of ``ascend-deploy render`` as ``{relative_path: text}``, and writing them.

Layout: ``plan.json``, ``ranktables/<table>.json``, ``hccn/<node>.conf``,
``launch/<instance>-rank<k>.sh``, ``DEPLOYMENT.md``, and ``manifests/`` from the
Pulumi program's object builders (:func:`extra_files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ascend_runtime.config.inventory import Inventory
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.launch import deployment_sheet, hccn_conf, launch_script, leader_watch_script
from ascend_runtime.render.paths import LEADER_WATCH
from ascend_runtime.render.ranktables import rank_tables

def render_artifacts(plan: Plan, inventory: Inventory | None = None) -> dict[str, str]:
    """The render output of a Plan, sorted by path; pure and deterministic.

    ``inventory`` adds netmask / gateway / netdetect and unused devices to ``hccn/*.conf``.
    """
    files: dict[str, str] = {"plan.json": plan.to_json(), "DEPLOYMENT.md": deployment_sheet(plan)}
    for name, table in rank_tables(plan).items():
        files[f"ranktables/{name}.json"] = json.dumps(table, indent=2) + "\n"
    for node in plan.nodes:
        files[f"hccn/{node.name}.conf"] = hccn_conf(plan, node.name, inventory)
    for rank in plan.ranks:
        files[f"launch/{rank.name}.sh"] = launch_script(plan, rank)
    files[f"launch/{LEADER_WATCH}"] = leader_watch_script()
    return dict(sorted(files.items()))


def extra_files(plan: Plan) -> dict[str, str]:
    """``manifests/``: exactly the Kubernetes objects the Pulumi program registers (empty for local stacks)."""
    from ascend_runtime.deploy.manifests import manifest_files  # noqa: PLC0415 - deploy imports render

    return {f"manifests/{path}": text for path, text in sorted(manifest_files(plan).items())}


def write_artifacts(files: dict[str, str], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write files under ``out_dir`` (scripts executable); returns the paths written. Never deletes."""
    base = Path(out_dir)
    written = []
    for rel, text in sorted(files.items()):
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise ValueError(f"refusing to write outside {base}: {rel}")
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if rel.endswith(".sh") else 0o644)
        written.append(path)
    return written
