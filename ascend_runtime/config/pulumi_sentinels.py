"""Plaintext values spelled like the markers Pulumi uses for hidden or not-yet-known values.

Pulumi's Python SDK (pulumi 3.272.0) gives three spellings a meaning of their own:

- ``[secret]``: what Pulumi shows instead of a secret's value (``_SECRET_SENTINEL`` in
  ``pulumi/automation/_config.py``; ``pulumi config`` and stack outputs print it). A stack value spelled so was
  copied from that output: the real value never reached the file.
- ``04da6b54-80e4-46f7-96ec-b56ff0331ba9``: ``UNKNOWN`` in ``pulumi/runtime/rpc.py``, the string a property
  is sent as when its value is not known yet; the engine takes a resource input of that value for unknown.
- ``4dabf18193072939515e22adb298388d``: ``_special_sig_key`` in ``pulumi/runtime/rpc.py``; a mapping with this
  key is decoded as a secret, asset, archive or resource reference rather than as data.

Such a value passes the stack's types (it is text), so the kit refuses it at load time, naming the key:
``plan`` exits 2 and the Pulumi program raises before registering anything (docs/validation.md, secrets).
"""

from __future__ import annotations

from typing import Any

from ascend_runtime.config.errors import Problem

#: pulumi/automation/_config.py ``_SECRET_SENTINEL``.
SECRET_SENTINEL = "[secret]"
#: pulumi/runtime/rpc.py ``UNKNOWN``.
UNKNOWN_SENTINEL = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"
#: pulumi/runtime/rpc.py ``_special_sig_key``.
SIGNATURE_KEY = "4dabf18193072939515e22adb298388d"


def sentinel_meaning(text: str) -> str | None:
    """What Pulumi makes of a string spelled ``text`` (compared without surrounding blanks, case ignored),
    or None when it is plain text to Pulumi."""
    spelled = text.strip().lower()
    if spelled == SECRET_SENTINEL:
        return "Pulumi's placeholder for a hidden secret (`pulumi config` prints it), not the secret's value"
    if spelled == UNKNOWN_SENTINEL:
        return "Pulumi's marker of an unknown value: the engine would take the input for not yet known"
    if spelled == SIGNATURE_KEY:
        return "Pulumi's type signature key: a mapping holding it is decoded as a secret, asset or resource"
    return None


def sentinel_problems(value: Any, path: str) -> list[Problem]:
    """A problem for every string (mapping keys too) under ``value`` that Pulumi reads as a marker, named by
    its key path from ``path``. Each container is visited once, so an alias repeated a million times is
    read once."""
    problems: list[Problem] = []
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            meaning = sentinel_meaning(item)
            if meaning:
                problems.append(Problem(at, f"is spelled like {meaning}", None,
                                        "write the real value; a secret goes in with `pulumi config set --secret`"))
            continue
        if not isinstance(item, (dict, list)) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            for key, child in reversed(list(item.items())):
                child_at = f"{at}.{key}" if at else str(key)
                if isinstance(key, str) and sentinel_meaning(key):
                    stack.append((key, child_at))
                stack.append((child, child_at))
        else:
            stack.extend((child, f"{at}[{i}]") for i, child in reversed(list(enumerate(item))))
    return problems
