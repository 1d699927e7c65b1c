"""``render``'s manifests: exactly the objects the Pulumi program registers, as YAML files.

Secret values never appear: Secrets carry the ``${pulumi-secret:KEY}``
placeholder that only the Pulumi program replaces. Node objects are patches
(Pulumi ``NodePatch``); apply them with ``kubectl apply --server-side``. The
tolerations patches of MindCluster's DaemonSets (``objects/mindcluster.py``) are
forced server-side applies of objects the kit does not own: their files are named
``NN-<kind>-patch-<name>.yaml`` and say how to apply them.
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
from ascend_runtime.render.objects.mindcluster import PATCH_FIELD_MANAGER, is_patch


def file_name(index: int, obj: K8sObject) -> str:
    """``NN-<kind>-<name>.yaml``, ``NN-<kind>-patch-<name>.yaml`` for a patch of an object the kit does not own
    (NN keeps the registration order when files are applied in order)."""
    kind = obj["kind"].lower() + ("-patch" if is_patch(obj) else "")
    return f"{index:02d}-{kind}-{obj['metadata']['name']}.yaml"


def to_yaml(obj: K8sObject) -> str:
    """One object as a YAML document (a comment first for patches: how to apply them)."""
    head = ""
    if obj["kind"] == "Node":
        head = "# Node patch (Pulumi NodePatch): kubectl apply --server-side -f this file\n"
    elif is_patch(obj):
        manager = obj["metadata"]["annotations"][PATCH_FIELD_MANAGER]
        head = (f"# {obj['kind']} tolerations patch (Pulumi {obj['kind']}Patch) of an object the kit does not own:\n"
                f"# kubectl apply --server-side --force-conflicts --field-manager={manager} -f this file\n")
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
