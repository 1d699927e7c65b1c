"""Where the recorded fixtures live and how they are written and read.

``<dir>/responses.json``: ``{case name: answer shape}`` of every case but ``/metrics``;
``<dir>/metrics.json``: the ``/metrics`` answer's shape; ``<dir>/intentional.json``: the differences
the simulator and the proxy keep on purpose, each with its reason (docs/simulator.md lists them).
Written with sorted keys and one key per line, so a refresh is a reviewable diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The fixtures of the supported release.
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm-0.23.0"
METRICS_CASE = "metrics"


def _dump(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def write_fixtures(out: Path, shapes: dict[str, dict[str, Any]], release: str) -> list[Path]:
    """Write one recording; returns the files written (``intentional.json`` is maintained by hand)."""
    out.mkdir(parents=True, exist_ok=True)
    responses = {name: shape for name, shape in shapes.items() if name != METRICS_CASE}
    files = [(out / "responses.json", {"release": release, "cases": responses})]
    if METRICS_CASE in shapes:
        files.append((out / "metrics.json", {"release": release, "case": shapes[METRICS_CASE]}))
    for path, data in files:
        _dump(path, data)
    return [path for path, _ in files]


def load_recording(directory: Path = DEFAULT_DIR) -> dict[str, dict[str, Any]]:
    """``{case name: answer shape}`` as recorded (``metrics`` included)."""
    shapes = dict(json.loads((directory / "responses.json").read_text())["cases"])
    metrics = directory / "metrics.json"
    if metrics.exists():
        shapes[METRICS_CASE] = json.loads(metrics.read_text())["case"]
    return shapes


def load_intentional(directory: Path = DEFAULT_DIR) -> list[dict[str, str]]:
    """The intentional differences: ``{"target", "case", "where", "reason"}`` each (globs in case/where)."""
    return list(json.loads((directory / "intentional.json").read_text())["differences"])
