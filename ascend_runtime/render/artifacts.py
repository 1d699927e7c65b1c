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
from ascend_runtime.files.jsondoc import read_json
from ascend_runtime.files.read import RENDER_OUTPUT, FileRefused
from ascend_runtime.files.write import OutputDir, OutputRefused
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


def _manifest_doc(base: Path, name: str) -> object | None:
    """The JSON document of the regular file ``base/name`` (through the kit's reading door), None when it is
    missing, a link (a render writes none), not a regular file, or not JSON."""
    path = base / name
    if path.is_symlink() or not path.is_file():
        return None
    try:
        return read_json(path, RENDER_OUTPUT, name)
    except FileRefused:
        return None


def _previous_render(base: Path) -> tuple[str | None, list[str]] | None:
    """(stack, files) of the render already in ``base``; None when ``base`` holds no render.

    From the manifest; for a render written before manifests, the stack named by its plan.json
    and the files of the render layout. A manifest that cannot be read (or is a link) is a render of
    an unknown stack: replacing it needs ``--force``.
    """
    if (base / MANIFEST).is_symlink() or (base / MANIFEST).exists():
        doc = _manifest_doc(base, MANIFEST)
        try:
            return str(doc["stack"]), [str(f) for f in doc["files"] if _safe_rel(str(f))]  # type: ignore[index]
        except (KeyError, TypeError):
            return None, []
    doc = _manifest_doc(base, "plan.json")
    if not isinstance(doc, dict) or "stack" not in doc:
        return None
    stack = str(doc["stack"])
    files = [p.relative_to(base).as_posix() for p in sorted(base.rglob("*")) if p.is_file() or p.is_symlink()]
    return stack, [f for f in files if f in RENDER_LAYOUT or any(f.startswith(d) for d in RENDER_LAYOUT if d.endswith("/"))]


def write_artifacts(files: dict[str, str], out_dir: str | os.PathLike[str], stack: str | None = None,
                    force: bool = False) -> list[Path]:
    """Write one stack's render under ``out_dir`` (scripts executable); returns the paths written.

    ``out_dir`` must be missing, empty, or hold a render of the same stack (``stack``, default the
    one plan.json names); that render is then replaced wholly: its files the new render does not
    write are deleted. Another stack's render, or other files, raise :class:`RenderDirError`
    unless ``force`` (then another stack's render is replaced the same way; files no render
    wrote are never deleted). ``MANIFEST`` records the stack and the files written.

    Every file is written through :class:`~ascend_runtime.files.write.OutputDir`, with or without
    ``force``: a symbolic link planted where a file goes is replaced by the file (temporary file and
    rename, never written through), one where a folder goes is refused (RenderDirError naming it), and a
    stale file is removed as the name it is, never through a link.
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
    try:
        with OutputDir(base) as out:
            for folder in sorted({str(Path(rel).parent) for rel in files} - {"."}):
                out.ensure_dir(folder)  # a link where a folder goes is refused before anything changes
            for rel in sorted(stale, reverse=True):
                out.remove(rel)
            written = [out.write(rel, text, 0o755 if rel.endswith(".sh") else 0o644)
                       for rel, text in sorted(files.items())]
            out.write(MANIFEST, json.dumps({"stack": stack, "files": sorted(files)}, indent=2) + "\n")
    except OutputRefused as exc:
        raise RenderDirError(str(exc)) from None
    return written
