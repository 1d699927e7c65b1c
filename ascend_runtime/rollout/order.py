"""Which instances a rollout replaces, in which order, and whether the rest can carry the load.

The order is the Plan's: prefill instances by ordinal, then decode instances by
ordinal. The Pulumi program uses the same order (:func:`predecessors`): each
instance's objects wait for the previous instance of its role, so an image change
replaces the instances of a role one after another (docs/rollout.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ROLE_ORDER = ("prefill", "decode")


class RolloutInputError(ValueError):
    """Invalid rollout input; the message names the option or field and the fix (exit 2)."""


@dataclass(frozen=True)
class Target:
    """One instance to replace: its name, role and leader API base URL (for the post-checks)."""

    name: str
    role: str
    url: str


def sort_key(role: str, ordinal: int) -> tuple[int, int]:
    """Sort key of an instance: prefill before decode, then by ordinal."""
    return (ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER), ordinal)


def ordered(instances: Iterable[tuple[str, str, int, str]]) -> list[Target]:
    """Targets from (name, role, ordinal, url) tuples, in rollout order."""
    rows = sorted(instances, key=lambda r: (*sort_key(r[1], r[2]), r[0]))
    return [Target(name, role, url) for name, role, _, url in rows]


def predecessors(instances: Iterable[tuple[str, str, int]]) -> dict[str, str | None]:
    """For (name, role, ordinal) tuples: each instance's previous instance of the same role (None: first)."""
    previous: dict[str, str] = {}
    out: dict[str, str | None] = {}
    for name, role, _ in sorted(instances, key=lambda r: (*sort_key(r[1], r[2]), r[0])):
        out[name] = previous.get(role)
        previous[role] = name
    return out


def select(targets: Sequence[Target], only: Sequence[str] = (), start: str | None = None) -> list[Target]:
    """The targets to roll: ``only`` (``--instance``, repeatable) keeps those, ``start`` (``--from``) skips
    the ones before it. Raises RolloutInputError naming the option and the known instances."""
    known = [t.name for t in targets]
    unknown = [n for n in only if n not in known]
    if unknown:
        raise RolloutInputError(f"--instance: unknown instance(s) {', '.join(unknown)}; instances: {', '.join(known)}")
    if start is not None and start not in known:
        raise RolloutInputError(f"--from: unknown instance {start}; instances: {', '.join(known)}")
    chosen = [t for t in targets if not only or t.name in only]
    if start is not None:
        index = known.index(start)
        chosen = [t for t in chosen if known.index(t.name) >= index]
    if not chosen:
        raise RolloutInputError("--instance/--from: no instance left to roll out")
    return chosen


def capacity_problems(serving: Sequence[Target], chosen: Sequence[Target]) -> list[str]:
    """Roles where draining one chosen instance leaves no other instance of that role to serve.

    ``serving``: every instance the proxies route to; ``chosen``: the ones to roll.
    """
    problems = []
    for role in sorted({t.role for t in chosen}, key=lambda r: sort_key(r, 0)):
        count = sum(1 for t in serving if t.role == role)
        if count < 2:
            problems.append(f"role {role} has {count} instance(s): while it is replaced no {role} instance serves, "
                            "so requests fail; add an instance of that role, or pass --allow-downtime")
    return problems
