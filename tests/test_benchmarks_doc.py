"""docs/benchmarks.md: every section is owned by one benchmark, between its own markers.

Each benchmark rewrites only the text between ``<!-- BEGIN name -->`` and ``<!-- END name -->``
(benchmarks/report.py); a section outside markers, or a marker lost, makes the next run append a
second copy instead of replacing the first.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
MARKER = re.compile(r"<!-- (BEGIN|END) ([a-z0-9_]+) -->")


def sections(text: str) -> list[tuple[str, int, int]]:
    """(name, begin line, end line) of every marked section; raises AssertionError if unbalanced."""
    out, open_name, open_line = [], None, 0
    for i, line in enumerate(text.splitlines()):
        m = MARKER.fullmatch(line.strip())
        if not m:
            continue
        kind, name = m.groups()
        if kind == "BEGIN":
            assert open_name is None, f"line {i + 1}: BEGIN {name} inside section {open_name}"
            open_name, open_line = name, i
        else:
            assert open_name == name, f"line {i + 1}: END {name} closes {open_name}"
            out.append((name, open_line, i))
            open_name = None
    assert open_name is None, f"section {open_name} never ends"
    return out


def test_every_heading_is_inside_exactly_one_section_and_names_are_unique() -> None:
    text = DOC.read_text()
    spans = sections(text)
    names = [n for n, _, _ in spans]
    assert len(names) == len(set(names)), names
    for i, line in enumerate(text.splitlines()):
        if line.startswith("## "):
            owners = [n for n, b, e in spans if b < i < e]
            assert len(owners) == 1, f"line {i + 1} {line!r} is in sections {owners}"


def test_every_benchmark_that_writes_the_doc_uses_the_marker_writer() -> None:
    writers = 0
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if script.name in ("report.py", "__init__.py"):
            continue
        src = script.read_text()
        if "benchmarks.md" in src or "write_section" in src:
            writers += 1
            assert "report" in src and "write_section(" in src, script.name
            assert not re.search(r"benchmarks\.md\"?\)?\.write_text", src), script.name
    assert writers >= 5


def test_the_checker_catches_a_lost_marker() -> None:
    import pytest

    with pytest.raises(AssertionError):
        sections("<!-- BEGIN a -->\n## A\n<!-- BEGIN b -->\n## B\n<!-- END b -->\n")
