"""Command templates: ``{name}`` placeholders filled with shell-quoted values.

The literal text of a template comes from a reviewed playbook file and is
trusted; every value put into it (inventory fields, variables, facts) is passed
through :func:`shlex.quote`, so a value can never add a command, a redirection
or a substitution.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Mapping
from typing import Any

_FORMATTER = string.Formatter()


class TemplateError(KeyError):
    """A template names a value that is not defined."""


def _lookup(values: Mapping[str, Any], field: str) -> Any:
    """Resolve ``a.b`` dotted names through nested mappings."""
    current: Any = values
    for part in field.split("."):
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        else:
            raise TemplateError(f"undefined value {field!r} in template")
    return current


def fields(template: str) -> list[str]:
    """Names of the placeholders used in ``template``."""
    return [f for _, f, _, _ in _FORMATTER.parse(template) if f]


def render(template: str, values: Mapping[str, Any], shell: bool = True) -> str:
    """Fill ``template``; with ``shell`` every value is shell-quoted (lists become quoted words)."""
    out: list[str] = []
    for literal, field, spec, conv in _FORMATTER.parse(template):
        out.append(literal)
        if field is None:
            continue
        if field == "":
            raise TemplateError("positional placeholder {} is not allowed")
        value = _lookup(values, field)
        if spec or conv:
            raise TemplateError(f"format specs are not allowed in placeholder {field!r}")
        if shell:
            if isinstance(value, (list, tuple)):
                out.append(" ".join(shlex.quote(str(v)) for v in value))
            else:
                out.append(shlex.quote("" if value is None else str(value)))
        else:
            out.append("" if value is None else str(value))
    return "".join(out)


def render_value(value: Any, values: Mapping[str, Any]) -> Any:
    """Render a non-shell value: a template string becomes text, a bare ``{name}`` keeps its type."""
    if not isinstance(value, str):
        return value
    names = fields(value)
    if len(names) == 1 and value == "{" + names[0] + "}":
        return _lookup(values, names[0])
    return render(value, values, shell=False)
