"""LeaderWorkerSet (kubernetes-sigs/lws): the pinned release and the API names the kit relies on.

A multi-node engine instance is one LeaderWorkerSet (docs/kubernetes.md, "Engine instances"): one
group (``replicas: 1``) of ``size`` pods, the leader (worker index 0, rank 0, serves the API) and the
headless workers (indices 1..size-1). Every name below is quoted from the pinned release
(:data:`RELEASE`), file by file:

* ``api/leaderworkerset/v1/leaderworkerset_types.go``: the group, API version, ``size``,
  ``restartPolicy`` ``RecreateGroupOnPodRestart`` ("recreate all the pods in the group if any
  individual pod in the group is recreated or any container in a pod is restarted"),
  ``startupPolicy`` ``LeaderCreated`` / ``LeaderReady``, the labels ``leaderworkerset.sigs.k8s.io/name``
  and ``leaderworkerset.sigs.k8s.io/worker-index`` and the env names ``LWS_LEADER_ADDRESS``,
  ``LWS_GROUP_SIZE``, ``LWS_WORKER_INDEX``;
* ``pkg/utils/pod/pod_utils.go`` ``AddLWSVariables``: the controller's pod webhook injects those three
  variables into every container (``LWS_WORKER_INDEX`` = the pod's worker-index label,
  ``LWS_LEADER_ADDRESS`` = ``<lws>-<group>.<subdomain>.<namespace>``, a DNS name);
* ``pkg/controllers/pod_controller.go``: ``LeaderReady`` defers the worker StatefulSet until the leader
  pod is Ready; ``handleRestartPolicy`` deletes the leader (so the group) when any container restarts;
* ``pkg/webhooks/pod_webhook.go`` ``SetExclusiveAffinities``: what the exclusive-topology annotations
  mean (why the kit does not use them, see :func:`group_affinity` in engine.py);
* ``pkg/webhooks/leaderworkerset_webhook.go``: the name must be a DNS-1035 label (it names the
  headless Service); ``maxUnavailable`` and ``maxSurge`` must not both be 0;
* ``config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml``: the CRD (its schema is
  ``tests/deploy/crds/``, every LeaderWorkerSet is validated against it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascend_runtime.planner.plan import InstancePlan, Plan
from ascend_runtime.render.engine_args import connector
from ascend_runtime.render.objects.common import K8sObject


@dataclass(frozen=True)
class LwsRelease:
    """A LeaderWorkerSet release: where its CRD and manifest come from."""

    tag: str
    commit: str
    api_version: str
    kind: str
    crd_name: str
    crd_path: str
    #: The release's install manifest (CRD, controller Deployment, RBAC, webhooks), as
    #: site/content/en/docs/installation/_index.md of the release installs it.
    manifest_url: str


RELEASE = LwsRelease(
    tag="v0.10.0",
    commit="2161f38ff333f9e24d3c44adef7cd5d9787cac00",
    api_version="leaderworkerset.x-k8s.io/v1",
    kind="LeaderWorkerSet",
    crd_name="leaderworkersets.leaderworkerset.x-k8s.io",
    crd_path="config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    manifest_url="https://github.com/kubernetes-sigs/lws/releases/download/v0.10.0/manifests.yaml",
)

#: Pod labels the controller sets (leaderworkerset_types.go ``SetNameLabelKey``, ``WorkerIndexLabelKey``).
SET_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
#: Container variables the pod webhook injects (leaderworkerset_types.go, pod_utils.go ``AddLWSVariables``).
ENV_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
ENV_GROUP_SIZE = "LWS_GROUP_SIZE"
ENV_WORKER_INDEX = "LWS_WORKER_INDEX"
#: Any container restart or pod deletion recreates the whole group (``RecreateGroupOnPodRestart``).
RESTART_POLICY = "RecreateGroupOnPodRestart"
#: Workers are created as soon as the leader pod exists. ``LeaderReady`` would wait for the leader's
#: readiness, which vLLM reaches only after every headless engine joined it: a deadlock.
STARTUP_POLICY = "LeaderCreated"


def deploys_as_lws(plan: Plan, inst: InstancePlan) -> bool:
    """True for a multi-node instance whose connector reads no rank table.

    LLMDataDist's PD rank table lists every rank with its node's IP and device IPs, so each rank must run
    on exactly the node the table names; one worker template cannot pin worker index ``k`` to node ``k``
    (a per-index nodeAffinity is not expressible in it), so such instances keep one pinned Deployment
    per rank. A single-node instance has no group to restart: one Deployment.
    """
    return len(inst.ranks) > 1 and not connector(plan).needs_rank_table


def leader_worker_set(meta: dict[str, Any], size: int, leader: dict[str, Any], worker: dict[str, Any],
                      timeout_s: int, replicas: int = 1, flexible: bool = False) -> K8sObject:
    """One group of ``size`` pods: ``leader`` (index 0) and ``size - 1`` pods of ``worker``.

    ``replicas: 1`` (one group per engine instance). A template change replaces the group
    (``maxUnavailable: 1``, ``maxSurge: 0``: a surge group would need a second set of nodes).
    Pulumi waits for the group to be ready (``pulumi.com/waitFor`` on ``status.readyReplicas``; the
    controller counts a group ready when the leader and every worker are Ready).
    """
    annotations = {**meta.get("annotations", {}),
                   "pulumi.com/waitFor": "jsonpath={.status.readyReplicas}=1",
                   "pulumi.com/timeoutSeconds": str(timeout_s)}
    if flexible:
        # a flexible group's instance (pd_ratio auto): the P:D planner owns ``replicas`` (0 or 1), so Pulumi
        # must not wait for a ready group that the planner may have scaled to 0
        del annotations["pulumi.com/waitFor"]
        annotations["pulumi.com/skipAwait"] = "true"
    return {
        "apiVersion": RELEASE.api_version,
        "kind": RELEASE.kind,
        "metadata": {**meta, "annotations": annotations},
        "spec": {
            "replicas": replicas,
            "startupPolicy": STARTUP_POLICY,
            "rolloutStrategy": {"type": "RollingUpdate",
                                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}},
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": RESTART_POLICY,
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }
