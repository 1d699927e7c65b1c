"""One error type for every invalid stack, inventory or plan.

A :class:`ConfigError` names the key path (``decode.tp``), the bad value and
what would be valid, so the CLI can print it and exit 2 and the Pulumi program
can raise before registering any resource.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One invalid value: where it is, what it is, and how to fix it."""

    path: str
    message: str
    value: Any = None
    hint: str = ""

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}"
        if self.value is not None:
            text += f" (got {self.value!r})"
        if self.hint:
            text += f"; {self.hint}"
        return text


class ConfigError(ValueError):
    """A stack, inventory or plan is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"invalid configuration in {source}" if source else "invalid configuration"
        super().__init__(head + ":\n" + "\n".join(f"  - {p}" for p in problems))

    @classmethod
    def single(cls, path: str, message: str, value: Any = None, hint: str = "", source: str = "") -> ConfigError:
        """Build an error with one problem."""
        return cls([Problem(path, message, value, hint)], source)
