"""What the kit refuses in a composed YAML document before constructing it, each naming the key and line.

PyYAML's SafeLoader reads YAML 1.1, where some plain scalars mean something else than in YAML 1.2 (which
Pulumi's own reader and most tools follow) or than the operator meant; it takes them silently. The kit
refuses them (docs/validation.md, files):

- a key given twice in one mapping (YAML would keep the last), the merge key ``<<`` included;
- ``0022``: a YAML 1.1 octal number (18), 22 in YAML 1.2;
- ``2:30:00``, ``1:30.5``: YAML 1.1 base-60 numbers (9000, 90.5), text in YAML 1.2;
- ``0b101`` and ``1_000``: YAML 1.1 binary and digit-grouped numbers, text in YAML 1.2;
- ``yes``, ``no``, ``on``, ``off`` (any case): YAML 1.1 booleans, text in YAML 1.2;
- a whole number of more than :data:`MAX_INT_DIGITS` digits (Python refuses to convert one of more than
  4300 with a ValueError, a traceback at the constructor; no setting of the kit has more than 20, and a
  shorter one too large for its key is refused by the key's own bound, which the error names).

The walk visits every node once (aliases may repeat or nest a node), so its cost is the document's size;
the document's depth is bounded before composing (``loader.too_deep_at``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

#: Most digits a whole number in a YAML file may have (2^64 has 20); below Python's own limit of 4300.
MAX_INT_DIGITS = 1000

_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL_TAG = "tag:yaml.org,2002:bool"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_OCTAL = re.compile(r"[-+]?0[0-7_]+\Z")
_YAML11_BOOLS = {"yes", "no", "on", "off"}
#: Longest scalar an error quotes (a longer one is cut).
_QUOTE_LIMIT = 24


@dataclass(frozen=True)
class NodeProblem:
    """One refused node: its key path (a tuple of keys and list indexes), 1-based line, message (which names
    the line) and fix."""

    path: tuple[Any, ...]
    line: int
    message: str
    hint: str


def _quoted(text: str) -> str:
    return repr(text if len(text) <= _QUOTE_LIMIT else text[: _QUOTE_LIMIT - 3] + "...")


def scalar_problem(node: yaml.ScalarNode) -> tuple[str, str] | None:
    """(message, fix) when a plain scalar is spelled in a way only YAML 1.1 reads as a number or boolean,
    or is a whole number too long to read; None otherwise. Quoted scalars are text and always pass."""
    if node.style:  # quoted or block text: a string, whatever it spells (plain: None, or '' from libyaml)
        return None
    value = node.value
    if node.tag == _INT_TAG:
        if ":" in value:
            return (f"{_quoted(value)} is a YAML 1.1 base-60 number (read as {_sexagesimal(value)}), text in YAML 1.2",
                    "write the plain number, or quote it if it is text")
        if _OCTAL.match(value):
            return (f"{_quoted(value)} is a YAML 1.1 octal number (read as {int(value.replace('_', ''), 8)}), "
                    f"{value.lstrip('+-0') or '0'} in YAML 1.2",
                    "write the number without leading zeros, or quote it if it is text")
        if "_" in value or value.lstrip("+-").startswith("0b"):
            return (f"{_quoted(value)} is a YAML 1.1 number spelling (digit groups or binary), text in YAML 1.2",
                    "write the plain decimal number, or quote it if it is text")
        digits = sum(c.isdigit() for c in value)
        if digits > MAX_INT_DIGITS:
            return (f"a whole number of {digits} digits, more than {MAX_INT_DIGITS}",
                    "write the intended value; no setting takes a number this long")
    elif node.tag == _FLOAT_TAG and (":" in value or "_" in value):
        what = "base-60 number" if ":" in value else "number spelling (digit groups)"
        return (f"{_quoted(value)} is a YAML 1.1 {what}, text in YAML 1.2",
                "write the plain decimal number, or quote it if it is text")
    elif node.tag == _BOOL_TAG and value.lower() in _YAML11_BOOLS:
        return (f"{_quoted(value)} is a YAML 1.1 boolean ({value.lower() in ('yes', 'on')}), text in YAML 1.2",
                "write true or false, or quote it if it is text")
    return None


def _sexagesimal(value: str) -> str:
    """The value YAML 1.1 gives a short base-60 integer (``2:30:00`` -> 9000); '...' when too long to say."""
    sign = -1 if value.startswith("-") else 1
    parts = value.lstrip("+-").replace("_", "").split(":")
    if len(value) > 40 or not all(p.isdigit() for p in parts):
        return "a number"
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return str(sign * total)


def node_problems(root: yaml.Node) -> list[NodeProblem]:
    """Every refused node of a composed document, in document order: keys given twice (the merge key ``<<``
    too) and the scalars :func:`scalar_problem` refuses, keys and values alike."""
    found: list[NodeProblem] = []
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            _add_scalar(found, node, path)
        elif isinstance(node, yaml.MappingNode):
            _walk_mapping(found, node, path, stack)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(node.value))))
    return found


def _add_scalar(found: list[NodeProblem], node: yaml.ScalarNode, path: tuple[Any, ...]) -> None:
    problem = scalar_problem(node)
    if problem is not None:
        line = node.start_mark.line + 1
        found.append(NodeProblem(path, line, f"{problem[0]} (line {line})", problem[1]))


def _walk_mapping(found: list[NodeProblem], node: yaml.MappingNode, path: tuple[Any, ...],
                  stack: list[tuple[yaml.Node, tuple[Any, ...]]]) -> None:
    first_line: dict[Any, int] = {}
    children = []
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        is_merge = key_node.tag == _MERGE_TAG
        key = "<<" if is_merge else key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if key is not None:
            if key in first_line:
                what = "the merge key `<<`" if is_merge else "key"
                fix = "merge several mappings with one `<<: [*a, *b]`" if is_merge else "keep one"
                found.append(NodeProblem((*path, key), line, f"{what} given twice (lines {first_line[key]} and {line}); "
                                         "YAML would keep only the last", fix))
            first_line.setdefault(key, line)
        if isinstance(key_node, yaml.ScalarNode) and not is_merge:
            _add_scalar(found, key_node, (*path, key))
        children.append((value_node, (*path, key)))
    stack.extend(reversed(children))

