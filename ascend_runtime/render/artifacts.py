"""Every file of ``ascend-deploy render`` as ``{relative_path: text}``, and writing them.

Layout: ``plan.json``, ``ranktables/<table>.json``, ``hccn/<node>.conf``,
``launch/<instance>-rank<k>.sh``, ``DEPLOYMENT.md``; the Pulumi program adds
``manifests/`` through :func:`extra_files` (see docs/rendering.md).
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

from ascend_runtime.config.inventory import Inventory
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.launch import deployment_sheet, hccn_conf, launch_script
from ascend_runtime.render.ranktables import rank_tables

#: Optional providers of more files: (module, function, directory prefix). Each function
#: takes the Plan and returns {path relative to the prefix: text}.
HOOKS: tuple[tuple[str, str, str], ...] = (("ascend_runtime.deploy.manifests", "manifest_files", "manifests/"),)


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
    return dict(sorted(files.items()))


def extra_files(plan: Plan) -> dict[str, str]:
    """Files of the optional hooks; a hook whose module does not exist yet is skipped."""
    files: dict[str, str] = {}
    for module_name, function, prefix in HOOKS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        for path, text in getattr(module, function)(plan).items():
            rel = path if path.startswith(prefix) else prefix + path
            files[rel] = text
    return dict(sorted(files.items()))


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
