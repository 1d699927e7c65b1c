"""The JSON patch (RFC 6902) that turns one rendering of an object into another.

Used to change a live Kubernetes object exactly where the kit's own rendering changed (an instance moved to
other nodes: its pod templates' node pins, environment and annotations, its ConfigMaps' data), leaving every
field the renderings agree on as the cluster has it (an image a rollout set, a ``restartedAt`` annotation).
Objects (dicts) are compared key by key (``add`` / ``remove`` / recursion); lists of the same length item by
item; anything else that differs is replaced whole. A changed list item that is an object with a ``name``
(a container, an env entry, a volume) is preceded by a ``test`` of that name, so a patch computed from the
renderings fails (422) rather than changes another item when the live list is ordered otherwise.
"""

from __future__ import annotations

from typing import Any

Op = dict[str, Any]


def escape(key: str) -> str:
    """``key`` as one JSON pointer token (RFC 6901: ``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")


def diff(old: Any, new: Any, path: str = "") -> list[Op]:
    """The ops that turn ``old`` into ``new``, at JSON pointer ``path``; [] when they are equal."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[Op] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{escape(key)}"})
        for key, value in new.items():
            if key not in old:
                ops.append({"op": "add", "path": f"{path}/{escape(key)}", "value": value})
            else:
                ops += diff(old[key], value, f"{path}/{escape(key)}")
        return ops
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        ops = []
        for k, (a, b) in enumerate(zip(old, new)):
            item = diff(a, b, f"{path}/{k}")
            named = isinstance(a, dict) and isinstance(b, dict) and "name" in a and a.get("name") == b.get("name")
            if item and named and item[0]["path"] != f"{path}/{k}":
                ops.append({"op": "test", "path": f"{path}/{k}/name", "value": a["name"]})
            ops += item
        return ops
    return [{"op": "replace", "path": path, "value": new}]
