"""The stack as data for the fault watcher pod: what it re-plans with when it moves an instance to a spare.

The runtime image has no stack files, so the watcher's ConfigMap carries the stack's validated configuration
(the Plan's ``config``) and the inventory the Plan was placed on, as JSON: ``{"stack": name, "config": {...},
"inventory": {...}, "secret_keys": [...]}`` (secret *names* only; the configuration holds no secret value).
:func:`stack_from_document` validates both with the stack's own models, so the pod's Plan is the one
``pulumi up`` rendered (the planner is deterministic).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ascend_runtime.config.inventory import Inventory
from ascend_runtime.config.stack import Stack, StackConfig
from ascend_runtime.planner.plan import Plan


def stack_document(plan: Plan) -> dict[str, Any] | None:
    """The stack behind ``plan`` as JSON data; None when the Plan does not carry its inventory."""
    if plan.source_inventory is None:
        return None
    return {"stack": plan.stack, "config": plan.config, "inventory": plan.source_inventory.model_dump(mode="json"),
            "secret_keys": list(plan.secret_keys)}


def stack_from_document(doc: Any, source: str) -> Stack:
    """The :class:`Stack` of a :func:`stack_document` (``source`` names the file in messages); ValueError naming
    the key that is wrong."""
    if not isinstance(doc, dict) or not isinstance(doc.get("stack"), str):
        raise ValueError("stack: missing; write the file `ascend-deploy render` puts in the watcher's ConfigMap")
    try:
        config = StackConfig.model_validate(doc.get("config"))
        inventory = Inventory.model_validate(doc.get("inventory"))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise ValueError(f"{exc.title}.{where}: {err.get('msg')}") from None
    keys = doc.get("secret_keys") or []
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ValueError("secret_keys: must be a list of names")
    return Stack(name=doc["stack"], config=config, inventory=inventory, stack_file=source, inventory_file=source,
                 secret_keys=tuple(keys))
