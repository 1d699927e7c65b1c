"""Write one benchmark's section of docs/benchmarks.md without touching the others.

Each benchmark owns the text between ``<!-- BEGIN name -->`` and
``<!-- END name -->``; a file lock keeps concurrent writers from clobbering
each other.
"""

from __future__ import annotations

import fcntl
import platform
import sys
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by the script it names; re-run the command to refresh it.\n"
    "Times are medians from runs on the shared 2-core development machine; compare\n"
    "ratios measured side by side in one run, not absolute times across runs.\n"
)


def machine_line() -> str:
    """A short description of where the numbers were measured."""
    return f"Python {sys.version.split()[0]} on {platform.machine()}, {platform.system()}"


def write_section(name: str, markdown: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the section ``name`` of ``path`` with ``markdown``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.rstrip()}\n{end}\n"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else HEADER
        if begin in text and end in text:
            head, rest = text.split(begin, 1)
            _, tail = rest.split(end, 1)
            text = head + block + tail.lstrip("\n")
        else:
            text = text.rstrip() + "\n\n" + block
        path.write_text(text)
