"""The pods the kit's workloads create, from the registered objects (Deployments, Jobs, DaemonSets and the
leader/worker templates of LeaderWorkerSets). A patch of a DaemonSet the kit does not own (its tolerations,
render/objects/mindcluster.py) makes no pods of the kit's and is no workload here."""

from __future__ import annotations

from typing import Any

from ascend_runtime.render.objects.mindcluster import is_patch

POD_OWNERS = ("Deployment", "Job", "DaemonSet", "StatefulSet")
LWS_KIND = "LeaderWorkerSet"


def lws_templates(lws: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(leader template, worker template) of a LeaderWorkerSet."""
    group = lws["spec"]["leaderWorkerTemplate"]
    return group["leaderTemplate"], group["workerTemplate"]


def lws_size(lws: dict[str, Any]) -> int:
    return int(lws["spec"]["leaderWorkerTemplate"]["size"])


def _pod_template(lws: dict[str, Any], role: str, template: dict[str, Any]) -> dict[str, Any]:
    meta = lws["metadata"]
    return {"apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": f"{meta['name']}-{role}", "namespace": meta["namespace"], "labels": meta["labels"]},
            "template": template}


def workload_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every object that makes pods; a LeaderWorkerSet as two ``v1/PodTemplate`` objects
    (``<lws>-leader``, ``<lws>-worker``) carrying its labels, so kubernetes-validate checks the templates."""
    out: list[dict[str, Any]] = []
    for o in objs:
        if is_patch(o):
            continue
        if o["kind"] in POD_OWNERS or o["kind"] == "Pod":
            out.append(o)
        elif o["kind"] == LWS_KIND:
            leader, worker = lws_templates(o)
            out += [_pod_template(o, "leader", leader), _pod_template(o, "worker", worker)]
    return out


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a workload object of :func:`workload_objects`."""
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] == "PodTemplate":
        return obj["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def pods_by_rank(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pod template per pod name: a workload's own name, and for a LeaderWorkerSet ``<lws>-rank<k>`` for every
    worker index ``k`` (0: the leader template, 1..size-1: the worker template, as the controller creates them)."""
    out: dict[str, dict[str, Any]] = {}
    for o in objs:
        if o["kind"] in POD_OWNERS and not is_patch(o):
            out[o["metadata"]["name"]] = o["spec"]["template"]
        elif o["kind"] == LWS_KIND:
            leader, worker = lws_templates(o)
            out[f"{o['metadata']['name']}-rank0"] = leader
            for k in range(1, lws_size(o)):
                out[f"{o['metadata']['name']}-rank{k}"] = worker
    return out
