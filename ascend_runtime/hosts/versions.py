"""Ascend version strings and the supported-version matrix.

Ascend releases run ``24.1.rc1 < 24.1.rc2 < 24.1.rc3 < 24.1.0 < 24.1.1``:
a release candidate sorts before the final release of the same number.
Comparison is case-insensitive (``8.1.RC1`` = ``8.1.rc1``); missing trailing
parts count as 0 (``7.1`` = ``7.1.0``).
"""

from __future__ import annotations

import re
from functools import total_ordering


@total_ordering
class Version:
    """A comparable Ascend version."""

    def __init__(self, text: str) -> None:
        self.text = str(text).strip()
        if not self.text or not re.match(r"^[0-9A-Za-z]+(\.[0-9A-Za-z]+)*\.?$", self.text):
            raise ValueError(f"not a version: {text!r}")
        self.key = tuple(self._part(p) for p in self.text.rstrip(".").split("."))

    @staticmethod
    def _part(part: str) -> tuple[int, int, str]:
        p = part.lower()
        if p.isdigit():
            return (2, int(p), "")
        m = re.fullmatch(r"rc(\d*)", p)
        if m:
            return (1, int(m.group(1) or 0), "")
        m = re.fullmatch(r"(\d+)(.*)", p)
        if m:
            return (2, int(m.group(1)), m.group(2))
        return (0, 0, p)

    def _padded(self, n: int) -> tuple[tuple[int, int, str], ...]:
        return self.key + ((2, 0, ""),) * (n - len(self.key))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        n = max(len(self.key), len(other.key))
        return self._padded(n) == other._padded(n)

    def __lt__(self, other: Version) -> bool:
        n = max(len(self.key), len(other.key))
        return self._padded(n) < other._padded(n)

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Version({self.text!r})"


def check_range(value: str | None, minimum: str | None = None, maximum: str | None = None) -> str | None:
    """None when ``minimum <= value <= maximum``; otherwise the reason, for a report."""
    if value is None or str(value).strip() == "":
        return "version not found"
    try:
        v = Version(value)
    except ValueError as exc:
        return str(exc)
    if minimum is not None and v < Version(minimum):
        return f"{value} is below the supported minimum {minimum}"
    if maximum is not None and v > Version(maximum):
        return f"{value} is above the supported maximum {maximum}"
    return None
