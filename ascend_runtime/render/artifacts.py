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
from ascend_runtime.engine.conformance import require_conformance
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.launch import (
    deployment_sheet,
    hccn_conf,
    launch_script,
    leader_watch_script,
)
from ascend_runtime.render.manifests import manifest_files
from ascend_runtime.render.paths import LEADER_WATCH
from ascend_runtime.render.ranktables import rank_tables


def render_artifacts(plan: Plan, inventory: Inventory | None = None) -> dict[str, str]:
    """The render output of a Plan, sorted by path; pure and deterministic.

    ``inventory`` adds netmask / gateway / netdetect and unused devices to ``hccn/*.conf``.
    """
    require_conformance(plan)
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
    return {f"manifests/{path}": text for path, text in sorted(manifest_files(plan).items())}


#: The render manifest in an output directory: which stack rendered it and every file it wrote.
MANIFEST = ".ascend-render.json"
#: What a render writes, for output directories rendered before the manifest existed.
RENDER_LAYOUT = ("plan.json", "DEPLOYMENT.md", "ranktables/", "hccn/", "launch/", "manifests/")


class RenderDirError(ValueError):
    """The output directory holds something a render must not mix with (the message says what and how to go on)."""


def _safe_rel(rel: str) -> bool:
    return bool(rel) and not rel.startswith("/") and ".." not in Path(rel).parts


def _previous_render(base: Path) -> tuple[str | None, list[str]] | None:
    """(stack, files) of the render already in ``base``; None when ``base`` holds no render.

    From the manifest; for a render written before manifests, the stack named by its plan.json
    and the files of the render layout.
    """
    manifest = base / MANIFEST
    if manifest.is_file():
        try:
            doc = json.loads(manifest.read_text())
            return str(doc["stack"]), [str(f) for f in doc["files"] if _safe_rel(str(f))]
        except (OSError, ValueError, KeyError, TypeError):
            return None, []
    plan_json = base / "plan.json"
    if not plan_json.is_file():
        return None
    try:
        stack = str(json.loads(plan_json.read_text())["stack"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    files = [p.relative_to(base).as_posix() for p in sorted(base.rglob("*")) if p.is_file() or p.is_symlink()]
    return stack, [f for f in files if f in RENDER_LAYOUT or any(f.startswith(d) for d in RENDER_LAYOUT if d.endswith("/"))]


def _remove_stale(base: Path, stale: list[str]) -> None:
    """Delete files of an earlier render (never outside ``base``) and the directories they leave empty."""
    root = base.resolve()
    for rel in sorted(stale, reverse=True):
        path = base / rel
        if not path.parent.resolve().is_relative_to(root) or not (path.is_file() or path.is_symlink()):
            continue
        path.unlink()
        parent = path.parent
        while parent != base and parent.resolve().is_relative_to(root):
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


def write_artifacts(files: dict[str, str], out_dir: str | os.PathLike[str], stack: str | None = None,
                    force: bool = False) -> list[Path]:
    """Write one stack's render under ``out_dir`` (scripts executable); returns the paths written.

    ``out_dir`` must be missing, empty, or hold a render of the same stack (``stack``, default the
    one plan.json names); that render is then replaced wholly: its files the new render does not
    write are deleted. Another stack's render, or other files, raise :class:`RenderDirError`
    unless ``force`` (then another stack's render is replaced the same way; files no render
    wrote are never deleted). ``MANIFEST`` records the stack and the files written.
    """
    base = Path(out_dir)
    for rel in files:
        if not _safe_rel(rel) or rel == MANIFEST:
            raise ValueError(f"refusing to write outside {base}: {rel}")
    if stack is None:
        stack = str(json.loads(files["plan.json"])["stack"]) if "plan.json" in files else None
    if stack is None:
        raise ValueError("write_artifacts needs the stack name (or a plan.json among the files)")
    stale: list[str] = []
    if base.exists():
        if not base.is_dir():
            raise RenderDirError(f"{base} is not a directory; give a new or empty folder with --out")
        previous = _previous_render(base)
        if previous is None:
            if any(base.iterdir()) and not force:
                raise RenderDirError(
                    f"{base} is not empty and holds no render ({MANIFEST} or plan.json); give a new or empty "
                    "folder, or --force to write into it (files the render does not write are left alone)")
        else:
            old_stack, old_files = previous
            if old_stack != stack and not force:
                other = f"stack {old_stack}" if old_stack else "another render (its manifest is unreadable)"
                raise RenderDirError(
                    f"{base} holds the render of {other}; writing {stack} there would mix the two. "
                    f"Give another folder, or --force to replace that render with {stack}'s")
            stale = [rel for rel in old_files if rel not in files]
    _remove_stale(base, stale)
    written = []
    for rel, text in sorted(files.items()):
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if rel.endswith(".sh") else 0o644)
        written.append(path)
    manifest = {"stack": stack, "files": sorted(files)}
    (base / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return written
