"""JSON parsing with a nesting bound, for every JSON text the proxy reads: client requests, engine answers,
admin bodies.

Python's ``json.loads`` nests as deep as the interpreter's recursion limit allows (about 1000 levels)
and then raises ``RecursionError``, which is no ``ValueError``: a handler that catches ``ValueError`` for
"not JSON" lets it through as an internal error. :func:`load_json` turns every failure into
:class:`JsonError` (a ``ValueError``) and refuses a text nested deeper than :data:`MAX_DEPTH`, because the
proxy copies and walks what it parses (pd.py, migrate.py, affinity.py) and must be able to.
"""

from __future__ import annotations

import json
from typing import Any

#: Deepest nesting of JSON containers (objects and arrays; the outermost value is 1) the proxy accepts.
#: vLLM 0.23.0 has no limit of its own: a body past Python's recursion limit (about 1000 levels) fails
#: to parse there (400).
MAX_DEPTH = 128


class JsonError(ValueError):
    """A JSON text the proxy does not take: not JSON (or not UTF-8/16/32), or nested too deep."""


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` (parsed JSON) nests more than ``limit`` containers deep; iterative (no recursion)."""
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if type(node) is not dict and type(node) is not list:
            continue
        if depth > limit:
            return True
        for v in (node.values() if type(node) is dict else node):
            t = type(v)
            if t is dict or t is list:
                stack.append((v, depth + 1))
    return False


def load_json(data: bytes | str, limit: int = MAX_DEPTH) -> Any:
    """``json.loads(data)`` nested at most ``limit`` containers deep; :class:`JsonError` for anything else.

    ``data``: JSON text as bytes (UTF-8, UTF-8 with a byte-order mark, UTF-16 or UTF-32, as ``json.loads``
    reads bytes) or str. ``NaN`` and ``Infinity`` are numbers, as ``json.loads`` reads them.
    """
    try:
        obj = json.loads(data)
    except RecursionError:
        raise JsonError(f"nested deeper than {limit} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of too many digits
        raise JsonError(str(exc)) from None
    opening = data.count(b"[") + data.count(b"{") if isinstance(data, bytes) else data.count("[") + data.count("{")
    # a text with at most ``limit`` opening brackets cannot nest deeper: no walk for nearly every text
    if opening > limit and too_deep(obj, limit):
        raise JsonError(f"nested deeper than {limit} levels")
    return obj
