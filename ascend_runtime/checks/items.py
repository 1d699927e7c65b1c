"""The vocabulary of a check run: items, their context, results and the report.

Shared by the smoke items (``checks.smoke``) and the plan-file items
(``checks.plan_files``), so neither imports the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp


#: Response headers in which the proxy names the instances of the PD pair that served a request.
PREFILL_HEADER = "x-prefill-instance"
DECODE_HEADER = "x-decode-instance"


class CheckFailed(Exception):
    """An item failed; the message says what failed."""


@dataclass(frozen=True)
class Instance:
    """One API endpoint the proxy routes to: plan name, API base URL, role (prefill/decode) if known, and with
    rank serving (one API server per DP rank) the engine instance it is a DP rank of (``instance``; None: the
    endpoint is a whole instance, its leader's server)."""

    name: str
    url: str
    role: str | None = None
    instance: str | None = None

    @property
    def group(self) -> str:
        """The engine instance the endpoint serves: ``instance``, or its own name."""
        return self.instance or self.name


@dataclass
class SmokeContext:
    """State shared by the items of one run."""

    session: aiohttp.ClientSession
    base: str
    timeout_s: float
    model: str | None = None
    instances: list[Instance] = field(default_factory=list)
    require_pd: bool = True
    pd_seen: list[tuple[str, str]] = field(default_factory=list)


CheckFn = Callable[[SmokeContext], Awaitable[str]]


@dataclass(frozen=True)
class CheckItem:
    """A named check; ``fn`` returns a detail string or raises on failure."""

    name: str
    fn: CheckFn


@dataclass(frozen=True)
class ItemResult:
    """Outcome of one item; ``duration_s`` in seconds."""

    name: str
    passed: bool
    detail: str
    duration_s: float

    def line(self) -> str:
        """One human-readable PASS/FAIL line."""
        tag = "PASS" if self.passed else "FAIL"
        return f"{tag}  {self.name}  ({self.duration_s * 1000:.0f} ms)  {self.detail}"


@dataclass
class SmokeReport:
    """All item results of one smoke run."""

    endpoint: str
    items: list[ItemResult]

    @property
    def passed(self) -> bool:
        """True when every item passed (and there was at least one)."""
        return bool(self.items) and all(i.passed for i in self.items)

    @property
    def failures(self) -> list[ItemResult]:
        """The failed items."""
        return [i for i in self.items if not i.passed]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: endpoint, passed, items[]."""
        return {"endpoint": self.endpoint, "passed": self.passed, "items": [asdict(i) for i in self.items]}
