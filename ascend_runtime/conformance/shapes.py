"""An HTTP answer reduced to what a client can rely on: its shape, never its varying values.

The shape of an answer is a JSON-ready dict:

- ``status`` and ``headers``: the content type (``content-type``, parameters as sent), the body's
  framing (``length`` or ``chunked``) and which of :data:`PRESENCE_HEADERS` are present;
- ``body``: ``{"kind": "empty" | "text" | "json" | "sse" | "metrics", ...}``:
  ``json``: ``paths`` (every key path, ``[]`` for list items and ``{*}`` for the keys of a
  token-keyed map, with the sorted JSON types seen there), ``values`` (the values of
  :data:`VALUE_PATHS`, which do not vary between runs) and, for an error, ``message_class``;
  ``sse``: ``framing`` (data prefix, event separator, ``[DONE]`` last, no other lines), ``events``
  (the event kinds in order, repeats collapsed, ``choice`` for an event of one choice), ``per_choice`` (the distinct collapsed kind sequences of
  the choices), ``paths`` and ``values`` per event kind;
  ``metrics``: per family (counters without ``_total``) its ``type``, ``labels`` (names, without
  ``le``/``quantile``) and ``samples`` (suffixes of its series names, ``_created`` included).
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Headers whose presence (not value) is part of the shape.
PRESENCE_HEADERS = ("allow", "cache-control", "x-request-id", "www-authenticate")
#: Key paths whose values are recorded (they are the same from run to run).
VALUE_PATHS = ("object", "error.type", "error.code", "error.param", "detail", "choices[].finish_reason",
               "choices[].message.role", "choices[].delta.role", "version")
#: Paths of objects keyed by token text or id (their keys vary, their values have one shape).
MAP_PATHS = ("choices[].logprobs.top_logprobs[]", "choices[].prompt_logprobs[]", "prompt_logprobs[]")
#: Label names that are the series' bucket or quantile, not a label of the family.
_SERIES_LABELS = {"le", "quantile"}


def json_type(value: Any) -> str:
    """The JSON type name of a parsed value (``int`` and ``float`` told apart)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "object"


def _walk(value: Any, path: str, paths: dict[str, set[str]], values: dict[str, set[str]]) -> None:
    paths.setdefault(path or ".", set()).add(json_type(value))
    if path in VALUE_PATHS and not isinstance(value, (dict, list)):
        values.setdefault(path, set()).add(json.dumps(value))
    if isinstance(value, dict):
        keyed = path in MAP_PATHS
        for key, item in value.items():
            sub = "{*}" if keyed else str(key)
            _walk(item, f"{path}.{sub}" if path else sub, paths, values)
    elif isinstance(value, list):
        for item in value:
            _walk(item, f"{path}[]", paths, values)


def json_shape(doc: Any) -> dict[str, Any]:
    """``paths``, ``values`` (and an error's ``message_class``) of one JSON document."""
    paths: dict[str, set[str]] = {}
    values: dict[str, set[str]] = {}
    _walk(doc, "", paths, values)
    shape: dict[str, Any] = {"paths": {p: sorted(t) for p, t in sorted(paths.items())},
                             "values": {p: sorted(v) for p, v in sorted(values.items())}}
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        shape["message_class"] = message_class(doc["error"].get("message"))
    return shape


_VALIDATION_ERRORS = re.compile(r"^\d+ validation errors?:\n  ")


def message_class(message: Any) -> str:
    """How an error message is written: ``validation-errors`` (FastAPI's ``RequestValidationError`` text,
    ``N validation error(s):`` then one line per error), ``validation-list`` (the bare list of errors),
    ``text``, or the JSON type of a message that is no string."""
    if not isinstance(message, str):
        return json_type(message)
    if _VALIDATION_ERRORS.match(message):
        return "validation-errors"
    return "validation-list" if message.startswith("[") else "text"


def _merge(into: dict[str, Any], shape: dict[str, Any]) -> None:
    for key in ("paths", "values"):
        target = into.setdefault(key, {})
        for path, kinds in shape[key].items():
            target[path] = sorted(set(target.get(path, [])) | set(kinds))


def _event_kind(event: Any) -> tuple[str, int | None]:
    """(kind, choice index) of one SSE event's JSON."""
    if not isinstance(event, dict):
        return "other", None
    if "error" in event:
        return "error", None
    choices = event.get("choices")
    if choices == []:
        return "usage", None
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return "multi", None
    choice = choices[0]
    index = choice.get("index") if isinstance(choice.get("index"), int) else None
    if choice.get("finish_reason") is not None:
        return "finish", index
    delta = choice.get("delta")
    if isinstance(delta, dict) and "role" in delta:
        return "role", index
    return "content", index


_CHOICE_KINDS = ("role", "content", "finish")


def _collapse(kinds: list[str]) -> list[str]:
    out: list[str] = []
    for kind in kinds:
        if not out or out[-1] != kind:
            out.append(kind)
    return out


def sse_shape(raw: bytes) -> dict[str, Any]:
    """The framing and event shapes of a ``text/event-stream`` body."""
    text = raw.decode("utf-8", errors="replace")
    separator = "\r\n\r\n" if "\r\n\r\n" in text else "\n\n"
    blocks = text.split(separator)
    trailing = blocks.pop() if blocks else ""
    data = [b[len("data: "):] for b in blocks if b.startswith("data: ")]
    framing = {"separator": json.dumps(separator), "all_data_prefixed": len(data) == len(blocks),
               "done_last": bool(data) and data[-1] == "[DONE]", "done_count": data.count("[DONE]"),
               "trailing": json.dumps(trailing), "multiline_events": any("\n" in d for d in data)}
    kinds: list[str] = []
    per_choice: dict[int, list[str]] = {}
    by_kind: dict[str, dict[str, Any]] = {}
    for item in data:
        if item == "[DONE]":
            kinds.append("[DONE]")
            continue
        try:
            event = json.loads(item)
        except ValueError:
            kinds.append("not-json")
            continue
        kind, index = _event_kind(event)
        # the choices of n > 1 interleave as the engine happens to step them: in the overall order a
        # choice's event is only "choice", its own order is in per_choice
        kinds.append("choice" if kind in _CHOICE_KINDS else kind)
        if index is not None:
            per_choice.setdefault(index, []).append(kind)
        _merge(by_kind.setdefault(kind, {}), json_shape(event))
    return {"kind": "sse", "framing": framing, "events": _collapse(kinds),
            "per_choice": sorted({" ".join(_collapse(seq)) for seq in per_choice.values()}),
            "by_kind": {k: by_kind[k] for k in sorted(by_kind)}}


_TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)\s*$")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


def _family_name(name: str, kind: str) -> str:
    return name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name


def metrics_shape(text: str) -> dict[str, Any]:
    """Prometheus text reduced to its families: type, label names and series name suffixes.

    A ``<family>_created`` gauge family (how vLLM's registry writes the creation time of counters and
    histograms) is folded into its family as the ``_created`` suffix.
    """
    declared: dict[str, str] = {}
    for line in text.splitlines():
        m = _TYPE_LINE.match(line)
        if m:
            declared[m.group(1)] = m.group(2)
    families: dict[str, dict[str, Any]] = {}
    alias: dict[str, str] = {}
    for name, kind in declared.items():
        base = _family_name(name, kind)
        families[base] = {"type": kind, "labels": set(), "samples": set()}
        alias[name] = base
    for name, kind in declared.items():
        if kind == "gauge" and name.endswith("_created") and name[: -len("_created")] in families:
            families.pop(name, None)
            alias[name] = name[: -len("_created")]
    bases = sorted(families, key=len, reverse=True)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        series = m.group(1)
        base = alias.get(series) or next((b for b in bases if series.startswith(b)), None)
        if base is None:
            families.setdefault(series, {"type": "untyped", "labels": set(), "samples": set()})
            base = series
        family = families[base]
        family["samples"].add(series[len(base):] or "-")
        family["labels"] |= {label for label in _LABEL.findall(m.group(3) or "") if label not in _SERIES_LABELS}
    return {"kind": "metrics",
            "families": {name: {"type": f["type"], "labels": sorted(f["labels"]), "samples": sorted(f["samples"])}
                         for name, f in sorted(families.items())}}


def headers_shape(headers: dict[str, str]) -> dict[str, Any]:
    """The headers a client sees that belong to the shape (names compared case-insensitively)."""
    lower = {k.lower(): v for k, v in headers.items()}
    return {"content-type": lower.get("content-type"),
            "framing": "chunked" if "chunked" in lower.get("transfer-encoding", "").lower()
            else ("length" if "content-length" in lower else "none"),
            "present": sorted(h for h in PRESENCE_HEADERS if h in lower)}


def body_shape(raw: bytes, content_type: str | None, metrics: bool = False) -> dict[str, Any]:
    """The body's shape by its content type (``metrics``: parse it as Prometheus text)."""
    ctype = (content_type or "").split(";", 1)[0].strip().lower()
    if metrics and raw:
        return metrics_shape(raw.decode("utf-8", errors="replace"))
    if ctype == "text/event-stream":
        return sse_shape(raw)
    if not raw:
        return {"kind": "empty"}
    if ctype == "application/json":
        try:
            return {"kind": "json", **json_shape(json.loads(raw))}
        except ValueError:
            return {"kind": "text", "note": "declared JSON, not JSON"}
    return {"kind": "text"}


def answer_shape(status: int, headers: dict[str, str], raw: bytes, metrics: bool = False) -> dict[str, Any]:
    """The whole shape of one answer."""
    hs = headers_shape(headers)
    return {"status": status, "headers": hs, "body": body_shape(raw, hs["content-type"], metrics)}
