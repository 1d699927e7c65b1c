"""``render``'s manifests: exactly the objects the Pulumi program registers, as YAML files.

Secret values never appear: Secrets carry the ``${pulumi-secret:KEY}``
placeholder that only the Pulumi program replaces. Node objects are patches
(Pulumi ``NodePatch``); apply them with ``kubectl apply --server-side``.
"""

from __future__ import annotations

from collections.abc import Iterable

import yaml

from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects import K8sObject, build_system, deploys_to_kubernetes
from ascend_runtime.render.objects.faults import (
    PROXY_ADMIN_SECRET,
    fault_watcher_objects,
)


def file_name(index: int, obj: K8sObject) -> str:
    """``NN-<kind>-<name>.yaml`` (NN keeps the registration order when files are applied in order)."""
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def to_yaml(obj: K8sObject) -> str:
    """One object as a YAML document (a comment first for Node patches)."""
    head = "# Node patch (Pulumi NodePatch): kubectl apply --server-side -f this file\n" if obj["kind"] == "Node" else ""
    return head + yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=120)


def manifest_files(plan: Plan, secrets: Iterable[str] | None = None) -> dict[str, str]:
    """Relative path under ``manifests/`` -> YAML text, one file per registered object."""
    if not deploys_to_kubernetes(plan):
        return {}
    keys = plan.secret_keys if secrets is None else tuple(secrets)
    files: dict[str, str] = {}
    for group, objs in build_system(plan, keys).groups():
        for i, obj in enumerate(objs):
            files[f"{group}/{file_name(i, obj)}"] = to_yaml(obj)
    for i, obj in enumerate(fault_watcher_objects(plan, PROXY_ADMIN_SECRET in keys, frozenset(keys))):
        files[f"faults/{file_name(i, obj)}"] = to_yaml(obj)
    return files
