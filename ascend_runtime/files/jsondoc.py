"""JSON documents parsed within bounds: the text of a file read through :mod:`ascend_runtime.files.read`.

:func:`parse_json` refuses, each as :class:`~ascend_runtime.files.read.FileRefused` naming the file and the
fix: a syntax error (line and column), a key given twice in one object (``json`` would keep the last), nesting
too deep for the decoder's recursion, and a whole number of more than :data:`MAX_INT_DIGITS` digits (Python's
``int`` refuses more than 4300 with a ValueError the decoder lets through; no count the kit reads needs more
than 20, and a shorter one too large is refused by the reader's own bound).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ascend_runtime.files.read import FileKind, FileRefused, decode_utf8, read_bytes

#: Most digits a whole number in a JSON file may have.
MAX_INT_DIGITS = 1000


class _DuplicateKey(ValueError):
    """A JSON object gives one key twice."""


class _LongNumber(ValueError):
    """A whole number with more digits than :data:`MAX_INT_DIGITS`."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for key, value in pairs:
        if key in doc:
            raise _DuplicateKey(key)
        doc[key] = value
    return doc


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongNumber(str(len(text.lstrip("-"))))
    return int(text)


def parse_json(text: str, path: Path | str, what: str = "JSON") -> Any:
    """The document ``text`` (read from ``path``); :class:`FileRefused` for what the module docstring lists.
    ``what`` names the document in the fix (``give the plan.json file``)."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_int=_bounded_int)
    except _DuplicateKey as exc:
        raise FileRefused(f"{path}: key {str(exc)[:60]!r} is given twice in one object (JSON would keep the last)",
                          "keep one") from None
    except _LongNumber as exc:
        raise FileRefused(f"{path} holds a whole number of {exc} digits, more than {MAX_INT_DIGITS}",
                          f"give the {what} file") from None
    except json.JSONDecodeError as exc:
        raise FileRefused(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
                          f"give the {what} file") from None
    except RecursionError:
        raise FileRefused(f"{path} is nested too deeply to be the {what} file", f"give the {what} file") from None


def read_json(path: Path | str, kind: FileKind, what: str = "JSON") -> Any:
    """The JSON document of the regular file ``path`` (UTF-8, a leading byte-order mark accepted), at most
    ``kind.max_bytes``; :class:`FileRefused` for any file or document the module refuses."""
    return parse_json(decode_utf8(read_bytes(path, kind), path, bom=True), path, what)
