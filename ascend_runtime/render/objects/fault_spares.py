"""What the fault watcher's objects gain when the Plan has spare nodes: recovery onto spares (docs/faults.md).

Only for a Plan with at least one spare (an unused node with every device in service, planner/spares.py):

* the watcher's ConfigMap also holds the stack as data (``stack.json``, faults/stack_data.py), which it
  re-plans with when it takes a faulted node out, and its command names it (``--stack-data``);
* ClusterRole: ``patch`` of the Plan's Node objects, by name (cordon, and the annotation
  ``ascend-deepseek/out-of-service`` recording the move);
* Role in the serving namespace: ``get`` and ``patch`` of the engine instances' LeaderWorkerSets
  (``leaderworkerset.x-k8s.io``), per-rank Deployments and ConfigMaps (``<inst>-launch``,
  ``<inst>-ranktable``), and of ``pd-proxy-instances``, all by name: the objects a move changes
  (faults/spares_kube.py); nothing else, and no create or delete.
"""

from __future__ import annotations

import json
from typing import Any

from ascend_runtime.faults.stack_data import stack_document
from ascend_runtime.planner.spares import free_nodes
from ascend_runtime.render.objects.common import PROXY_NAME, Context
from ascend_runtime.render.objects.engine import instance_objects
from ascend_runtime.render.objects.lws import RELEASE as LWS_RELEASE

#: The key of the stack document in the watcher's ConfigMap.
STACK_KEY = "stack.json"
#: Kinds a move patches, with their API group and resource.
PATCHED = {"LeaderWorkerSet": (LWS_RELEASE.api_version.partition("/")[0], "leaderworkersets"),
           "Deployment": ("apps", "deployments"), "ConfigMap": ("", "configmaps")}


def recovers_onto_spares(ctx: Context) -> bool:
    """True when the Plan has a spare and carries the inventory to re-plan with."""
    return bool(free_nodes(ctx.plan)) and ctx.plan.source_inventory is not None


def spare_cluster_rules(ctx: Context) -> list[dict[str, Any]]:
    """``patch`` of the Plan's nodes, by name (cordon and the out-of-service annotation)."""
    if not recovers_onto_spares(ctx):
        return []
    return [{"apiGroups": [""], "resources": ["nodes"], "resourceNames": [n.name for n in ctx.plan.nodes],
             "verbs": ["patch"]}]


def spare_namespace_rules(ctx: Context) -> list[dict[str, Any]]:
    """``get`` and ``patch`` of each object a move may change (module docstring), by name."""
    if not recovers_onto_spares(ctx):
        return []
    names: dict[str, set[str]] = {kind: set() for kind in PATCHED}
    for inst in ctx.plan.all_instances:
        for obj in instance_objects(ctx, inst):
            if obj["kind"] in PATCHED:
                names[obj["kind"]].add(obj["metadata"]["name"])
    names["ConfigMap"].add(f"{PROXY_NAME}-instances")
    return [{"apiGroups": [group], "resources": [resource], "resourceNames": sorted(names[kind]),
             "verbs": ["get", "patch"]}
            for kind, (group, resource) in PATCHED.items() if names[kind]]


def stack_data(ctx: Context) -> dict[str, str]:
    """The ConfigMap entry with the stack document (none without spares)."""
    doc = stack_document(ctx.plan) if recovers_onto_spares(ctx) else None
    return {STACK_KEY: json.dumps(doc, indent=1, sort_keys=True) + "\n"} if doc else {}


def stack_data_args(ctx: Context, directory: str) -> list[str]:
    """``--stack-data <directory>/stack.json`` when the ConfigMap holds it."""
    return ["--stack-data", f"{directory}/{STACK_KEY}"] if recovers_onto_spares(ctx) else []
