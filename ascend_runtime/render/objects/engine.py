"""Engine instances: the workload of every instance, its ConfigMaps, API Service and PodDisruptionBudget.

Which workload (docs/kubernetes.md, "Engine instances"):

* a multi-node instance is one LeaderWorkerSet (:mod:`.lws`): the leader template runs rank 0
  (pinned to the Plan's leader node, serves the API), the worker template runs every headless rank
  from one script that takes the rank from ``LWS_WORKER_INDEX``; the controller recreates the whole
  group when any pod or container of it restarts (``RecreateGroupOnPodRestart``);
* an instance whose connector reads a rank table (LLMDataDist) keeps one Deployment per rank,
  pinned to the node the table lists it on; its headless ranks follow the leader themselves
  (leader-watch.sh, probes on the leader's ``/health``);
* a single-node instance is one Deployment.

Probes: the startup probe allows ``startup_probe_seconds`` (default an hour) for model loading and
liveness only starts after it, so no probe can kill a loading engine. The leader's probes are its
own ``/health`` (vLLM reports the engine dead as soon as one DP engine, also one on another node,
dies); a headless rank's readiness is the leader's ``/health``.
"""

from __future__ import annotations

import json
import math
import posixpath
from typing import Any

from ascend_runtime.config.runtime_image import simulator_image
from ascend_runtime.perf.from_plan import sim_config_from_plan
from ascend_runtime.perf.sim_flags import argv_from_config
from ascend_runtime.planner.plan import InstancePlan, RankPlan
from ascend_runtime.render.launch import (
    WORKER_NODE_ENV,
    serves_ranks,
    worker_env,
    worker_launch_script,
    worker_script_name,
)
from ascend_runtime.render.objects import text as renderers
from ascend_runtime.render.objects.cluster import SUPER_POD_LABEL
from ascend_runtime.render.objects.common import (
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_LEADER,
    LABEL_NAME,
    LABEL_RANK,
    LABEL_ROLE,
    MODEL_SOURCE_SECRET,
    MODEL_SOURCE_SECRET_NAME,
    SIM_ADMIN_TOKEN_ENV,
    Context,
    K8sObject,
    configmap_key,
    digest,
    metadata,
    pod_security,
    serving_toleration,
    simulator_admin_token,
    simulator_admin_token_env,
    tmp_volume,
)
from ascend_runtime.render.objects.lws import (
    SET_NAME_LABEL,
    WORKER_INDEX_LABEL,
    deploys_as_lws,
    leader_worker_set,
)
from ascend_runtime.render.objects.resources import engine_resources

#: Host paths the engine container needs (facts section 5); device nodes come from the device plugin.
DRIVER_MOUNTS: tuple[tuple[str, str, str], ...] = (
    ("ascend-driver-lib64", "/usr/local/Ascend/driver/lib64", "Directory"),
    ("ascend-driver-version", "/usr/local/Ascend/driver/version.info", "File"),
    ("ascend-install-info", "/etc/ascend_install.info", "File"),
    ("ascend-dcmi", "/usr/local/dcmi", "Directory"),
    ("npu-smi", "/usr/local/bin/npu-smi", "File"),
    ("hccn-tool", "/usr/local/Ascend/driver/tools/hccn_tool", "File"),
    ("hccn-conf", "/etc/hccn.conf", "File"),  # the node's own hccn.conf (render.paths.HCCN_CONF)
)
HEALTH_PERIOD_S = 10
ENGINE_COMPONENT = "engine"
#: The only capability an NPU engine keeps (docs/kubernetes.md, "Pod security"): the vLLM-Ascend image
#: runs as root, and the device nodes (copied with the host's owner and mode by Ascend Docker Runtime)
#: and driver files belong to the driver's run user HwHiAiUser, so root needs DAC_OVERRIDE to open them.
ENGINE_CAPABILITIES: tuple[str, ...] = ("DAC_OVERRIDE",)


def engine_security_context(ctx: Context) -> dict[str, Any]:
    """Container securityContext of an engine rank.

    NPU engines: not privileged (the device plugin allocates ``npu_resource`` and Ascend Docker
    Runtime injects the devices), no privilege escalation, every capability dropped but
    :data:`ENGINE_CAPABILITIES`, the runtime's default seccomp profile; root (the image's user) and a
    writable root filesystem (CANN logs and operator caches go under ``$HOME``). The simulator on
    kind runs the kit's runtime image: fully restricted (:func:`~.common.pod_security`).
    """
    if ctx.simulated:
        return pod_security()
    return {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": list(ENGINE_CAPABILITIES)},
        "runAsNonRoot": False,
        "readOnlyRootFilesystem": False,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def engine_labels(rank: RankPlan) -> dict[str, str]:
    """Pod labels of one rank (the selector is a subset)."""
    return {
        LABEL_NAME: "vllm-ascend",
        LABEL_INSTANCE: rank.instance,
        LABEL_ROLE: rank.role,
        LABEL_RANK: str(rank.index),
        LABEL_LEADER: "true" if rank.is_leader else "false",
    }


def rank_selector(rank: RankPlan) -> dict[str, str]:
    """Selector of one rank's pod."""
    return {LABEL_COMPONENT: ENGINE_COMPONENT, LABEL_INSTANCE: rank.instance, LABEL_RANK: str(rank.index)}


def ranktable_configmap_name(inst: InstancePlan) -> str:
    return f"{inst.name}-ranktable"


def launch_configmap_name(inst: InstancePlan) -> str:
    return f"{inst.name}-launch"


def api_service_name(inst: InstancePlan) -> str:
    """Service in front of the instance leader's OpenAI API."""
    return f"{inst.name}-api"


def api_service_url(ctx: Context, inst: InstancePlan) -> str:
    """In-cluster URL of an instance's API Service."""
    return f"http://{api_service_name(inst)}.{ctx.namespace}.svc:{inst.api_port}"


def rank_service_name(inst: InstancePlan, rank: RankPlan) -> str:
    """Service in front of the API servers of one node group's DP ranks (``serving: rank``): the leader's is the
    instance's own (:func:`api_service_name`), a worker node group's ``<instance>-rank<k>-api``."""
    return api_service_name(inst) if rank.is_leader else f"{rank.name}-api"


def rank_port_name(local_rank: int) -> str:
    """Container and Service port name of a node group's local DP rank (``serving: rank``): ``api`` for the
    first, ``api-r<j>`` after it (at most 15 characters, an IANA_SVC_NAME)."""
    return "api" if local_rank == 0 else f"api-r{local_rank}"


def endpoint_service_urls(ctx: Context, inst: InstancePlan) -> list[str]:
    """In-cluster URL of each of an instance's DP rank API servers (``serving: rank``), in
    ``InstancePlan.api_endpoints`` order: the Service of the rank's node group, the rank's port."""
    return [f"http://{rank_service_name(inst, r)}.{ctx.namespace}.svc:{port}" for r in inst.ranks for port in r.api_ports]


def instance_tables(ctx: Context, inst: InstancePlan) -> dict[str, str]:
    """ConfigMap data: the rank tables the instance's ranks read (JSON text)."""
    tables = renderers.rank_tables(ctx.plan)
    names = sorted({n for r in inst.ranks for n in renderers.ranktables_for_rank(ctx.plan, r)})
    return {configmap_key(renderers.ranktable_file(n)): json.dumps(tables[n], indent=2) + "\n" for n in names}


def uses_lws(ctx: Context, inst: InstancePlan) -> bool:
    """True when the instance is a LeaderWorkerSet (the rule and its reasons: :func:`.lws.deploys_as_lws`)."""
    return deploys_as_lws(ctx.plan, inst)


def launch_data(ctx: Context, inst: InstancePlan) -> dict[str, str]:
    """ConfigMap data: the launch scripts and, on simulated targets, each node's hccn.conf.

    A LeaderWorkerSet instance ships the leader's script and the one worker script
    (``<instance>-worker.sh``); per-rank Deployments ship one script per rank and the leader-watch
    library their headless ranks source (LWS restarts the group itself, so it needs none).
    """
    leader = inst.ranks[0]
    if uses_lws(ctx, inst):
        data = {f"{leader.name}.sh": renderers.launch_script(ctx.plan, leader),
                worker_script_name(inst): worker_launch_script(ctx.plan, inst)}
    else:
        data = {f"{r.name}.sh": renderers.launch_script(ctx.plan, r) for r in inst.ranks}
        if len(inst.ranks) > 1:
            data[renderers.LEADER_WATCH] = renderers.leader_watch_script()
    if ctx.simulated:
        for r in inst.ranks:
            data[f"hccn-{r.node}.conf"] = renderers.hccn_conf(ctx.plan, r.node)
    return data


#: Exec probe: GET the URL sys.argv[2] within sys.argv[1] seconds; a failure exits non-zero.
HTTP_PROBE_CODE = "import sys, urllib.request; urllib.request.urlopen(sys.argv[2], timeout=float(sys.argv[1]))"


#: Exec probe of ``serving: rank``: GET every URL of sys.argv[2:] within sys.argv[1] seconds each; any failure
#: exits non-zero.
HTTP_PROBE_ALL_CODE = ("import sys, urllib.request\n"
                       "for url in sys.argv[2:]:\n    urllib.request.urlopen(url, timeout=float(sys.argv[1]))")


def _rank_probe(rank: RankPlan, base: dict[str, Any], timeout: int) -> dict[str, Any]:
    """``serving: rank``: the pod's own DP ranks' ``/health``, every one (the pod runs them all on its node's
    network; the script exits when any of them does, so a rank that is down is one that is loading or stuck)."""
    if len(rank.api_ports) == 1:
        return {"httpGet": {"path": "/health", "port": rank.api_ports[0]}, **base}
    urls = [f"http://127.0.0.1:{port}/health" for port in rank.api_ports]
    return {"exec": {"command": ["python3", "-c", HTTP_PROBE_ALL_CODE, str(timeout), *urls]}, **base}


def _probe(rank: RankPlan, ctx: Context, inst: InstancePlan, period: int, failures: int, timeout: int) -> dict[str, Any]:
    """Probe of ``/health``: the rank's own API on the leader, the leader's API on workers (``serving: rank``:
    every DP rank server of the pod's own, :func:`_rank_probe`)."""
    base = {"periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": timeout}
    if serves_ranks(inst) and not ctx.simulated:
        return _rank_probe(rank, base, timeout)
    if rank.is_leader:
        return {"httpGet": {"path": "/health", "port": inst.api_port}, **base}
    if ctx.simulated:
        # constant code; the URL and the timeout are its arguments (sys.argv), never part of it
        url = api_service_url(ctx, inst) + "/health"
        return {"exec": {"command": ["python3", "-c", HTTP_PROBE_CODE, str(timeout), url]}, **base}
    return {"httpGet": {"host": inst.ranks[0].host_ip, "path": "/health", "port": inst.api_port}, **base}


def probes(ctx: Context, inst: InstancePlan, rank: RankPlan) -> dict[str, Any]:
    """startupProbe (budget ``startup_probe_seconds``), readinessProbe and livenessProbe."""
    startup_s = ctx.k8s["startup_probe_seconds"]
    return {
        "startupProbe": _probe(rank, ctx, inst, HEALTH_PERIOD_S, math.ceil(startup_s / HEALTH_PERIOD_S), 5),
        "readinessProbe": _probe(rank, ctx, inst, HEALTH_PERIOD_S, 3, 5),
        "livenessProbe": _probe(rank, ctx, inst, 30, 4, 10),
    }


def worker_probes(ctx: Context, inst: InstancePlan) -> dict[str, Any]:
    """Probes of a LeaderWorkerSet worker: readiness only, the leader's ``/health``.

    A Ready worker means the instance serves (the group counts ready when all its pods are). No
    liveness: a worker whose engine exits ends its container and the controller recreates the group,
    and the leader's own probes cover a hung instance; a second, worker-side restart would only race
    the group's.

    ``serving: rank``: a worker serves the API of its own DP ranks, so it gets the leader's three probes on
    them (:func:`probes`): a hung rank server on a worker node is one no leader-side probe sees.
    """
    if serves_ranks(inst) and not ctx.simulated:
        return probes(ctx, inst, inst.ranks[1])
    return {"readinessProbe": _probe(inst.ranks[1], ctx, inst, HEALTH_PERIOD_S, 3, 5)}


def _volumes(ctx: Context, inst: InstancePlan, rank: RankPlan,
             node_conf: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) of one rank (``node_conf``: the simulated node's hccn.conf, per node)."""
    volumes: list[dict[str, Any]] = [
        {"name": "launch", "configMap": {"name": launch_configmap_name(inst), "defaultMode": 0o755}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{ctx.k8s['shm_size_gib']}Gi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "launch", "mountPath": renderers.LAUNCH_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if renderers.ranktables_for_rank(ctx.plan, rank):  # only engines that read a rank table mount one
        volumes.insert(0, {"name": "ranktables", "configMap": {"name": ranktable_configmap_name(inst)}})
        mounts.insert(0, {"name": "ranktables", "mountPath": renderers.RANKTABLE_DIR, "readOnly": True})
    if ctx.simulated:
        if node_conf:
            mounts.append({"name": "launch", "mountPath": renderers.HCCN_CONF, "subPath": f"hccn-{rank.node}.conf",
                           "readOnly": True})
        return volumes, mounts
    for name, path, kind in DRIVER_MOUNTS:
        volumes.append({"name": name, "hostPath": {"path": path, "type": kind}})
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    model_dir = posixpath.dirname(ctx.plan.config["model"]["weights_path"].rstrip("/")) or "/"
    if ctx.k8s["model_source"] == "pvc":
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": ctx.k8s["model_pvc_name"], "readOnly": True}})
    else:
        volumes.append({"name": "model", "hostPath": {"path": ctx.k8s["model_host_path"], "type": "Directory"}})
    mounts.append({"name": "model", "mountPath": model_dir, "readOnly": True})
    return volumes, mounts


def simulator_command(ctx: Context, inst: InstancePlan, rank: RankPlan) -> list[str]:
    """``ascend-deploy sim`` argv of a simulated leader (kind): the instance's shape and the stack's timing."""
    # the CLI binds 127.0.0.1 by default; the proxy and the balancer reach the simulator on the node IP
    config = sim_config_from_plan(ctx.plan, inst, bind_host="0.0.0.0").model_copy(
        update={"kv_port": rank.kv_port, "kv_host": "$(POD_IP)"}
    )
    token = ["--admin-token-env", SIM_ADMIN_TOKEN_ENV] if simulator_admin_token(ctx) else []
    return ["ascend-deploy", "sim", *argv_from_config(config), *token]


def _container(ctx: Context, inst: InstancePlan, rank: RankPlan, worker_template: bool = False) -> dict[str, Any]:
    """The engine container of ``rank``; ``worker_template``: of every LeaderWorkerSet worker (``rank``
    is then the first headless rank, standing for all of them)."""
    if worker_template:
        # what is equal on every headless rank; the node's own values come from the worker script
        values = dict(worker_env(ctx.plan, inst)[0])
    else:
        values = renderers.rank_env(ctx.plan, rank)
    env = [{"name": k, "value": v} for k, v in sorted(values.items())]
    if worker_template:  # the worker script looks the node's HCCL_IF_IP, NIC and devices up by node name
        env.append({"name": WORKER_NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    env += ctx.engine_secret_env  # engine.extra_env Secret references: valueFrom.secretKeyRef, never a value
    if MODEL_SOURCE_SECRET in ctx.secrets and not ctx.simulated:
        env.append({"name": "MODEL_SOURCE_CREDENTIALS",
                    "valueFrom": {"secretKeyRef": {"name": MODEL_SOURCE_SECRET_NAME, "key": "credentials"}}})
    if ctx.simulated:
        env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        if rank.is_leader and simulator_admin_token(ctx):
            env.append(simulator_admin_token_env())
    ports = []
    if serves_ranks(inst):  # every DP rank's server (the worker template: every worker's)
        ports += [{"name": rank_port_name(j), "containerPort": p, "protocol": "TCP"} for j, p in enumerate(rank.api_ports)]
    elif rank.is_leader:
        ports.append({"name": "api", "containerPort": inst.api_port, "protocol": "TCP"})
    script = worker_script_name(inst) if worker_template else f"{rank.name}.sh"
    if ctx.simulated:
        image = simulator_image(ctx.plan.config)
        if rank.is_leader:
            command = simulator_command(ctx, inst, rank)
        else:
            # a simulated worker holds its node slot and follows the leader's health (gang restart)
            command = ["sleep", "infinity"]
        resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    else:
        image = ctx.plan.engine_image
        command = ["/bin/bash", f"{renderers.LAUNCH_DIR}/{script}"]
        # CPU and memory sized from the stack or the hardware (resources.py): memory request = limit, no CPU limit
        resources = engine_resources(ctx.plan).container_resources(ctx.k8s["npu_resource"], len(rank.devices))
    volumes_mounts = _volumes(ctx, inst, rank, node_conf=not worker_template)[1]
    if ctx.simulated:  # read-only root filesystem: a writable /tmp
        volumes_mounts = [*volumes_mounts, tmp_volume()[1]]
    container: dict[str, Any] = {
        "name": "engine",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env,
        "resources": resources,
        "volumeMounts": volumes_mounts,
        "securityContext": engine_security_context(ctx),
        **(worker_probes(ctx, inst) if worker_template else probes(ctx, inst, rank)),
    }
    if ports:
        container["ports"] = ports
    return container


def _startup_timeout(ctx: Context) -> int:
    """How long Pulumi waits for an engine workload: the startup budget plus 10 minutes."""
    return ctx.k8s["startup_probe_seconds"] + 600


def _pod_spec(ctx: Context, inst: InstancePlan, rank: RankPlan, worker_template: bool = False) -> dict[str, Any]:
    """Pod spec of ``rank`` (``worker_template``: of every LeaderWorkerSet worker); no placement yet."""
    pod_spec: dict[str, Any] = {
        # the serving taint whatever its value: placement is the nodeSelector/affinity on the Plan's nodes, the
        # taint only keeps other pods off them, and its value (the role) is set by hand and may lag a role change
        # (a flexible group's nodes, a changed P:D ratio): docs/kubernetes.md, "Serving taint"
        "tolerations": [serving_toleration()],
        # the node's network (HCCL_IF_IP, rank table server_id): NetworkPolicies do not isolate these pods,
        # the hosts' firewalls must (docs/kubernetes.md, "Network policy")
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "automountServiceAccountToken": False,  # engines never call the Kubernetes API
        "terminationGracePeriodSeconds": ctx.k8s["termination_grace_seconds"],
        "containers": [_container(ctx, inst, rank, worker_template)],
        "volumes": [*_volumes(ctx, inst, rank, node_conf=not worker_template)[0],
                    *([tmp_volume()[0]] if ctx.simulated else [])],
    }
    if ctx.k8s.get("runtime_class") and not ctx.simulated:
        pod_spec["runtimeClassName"] = ctx.k8s["runtime_class"]
    if ctx.image_pull_secrets:
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets
    return pod_spec


def _pinned(rank: RankPlan, pod_spec: dict[str, Any]) -> dict[str, Any]:
    """``pod_spec`` pinned to the Plan's node of ``rank``."""
    return {"nodeSelector": {"kubernetes.io/hostname": rank.node}, **pod_spec}


def _template(ctx: Context, name: str, labels: dict[str, str], annotations: dict[str, str],
              spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"labels": {**metadata(ctx, name, ENGINE_COMPONENT)["labels"], **labels},
                         "annotations": annotations},
            "spec": spec}


def rank_deployment(ctx: Context, inst: InstancePlan, rank: RankPlan, config_digest: str) -> K8sObject:
    """The workload of one rank: a single-replica Deployment pinned to the Plan's node."""
    labels = engine_labels(rank)
    timeout = _startup_timeout(ctx)
    annotations = {"ascend-deepseek/config-digest": config_digest, "ascend-deepseek/node": rank.node}
    meta_annotations = {"pulumi.com/timeoutSeconds": str(timeout)}
    if ctx.plan.flex_group_of(inst.name):
        meta_annotations["pulumi.com/skipAwait"] = "true"  # the P:D planner owns replicas (0 or 1)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(ctx, rank.name, ENGINE_COMPONENT, {**labels, **flexible_label(ctx, inst)},
                             annotations=meta_annotations),
        "spec": {
            "replicas": instance_replicas(ctx, inst),
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": timeout,
            "selector": {"matchLabels": rank_selector(rank)},
            "template": _template(ctx, rank.name, labels, annotations, _pinned(rank, _pod_spec(ctx, inst, rank))),
        },
    }


#: Label of a flexible group's workloads; the Pulumi program ignores changes of their replicas.
FLEXIBLE_LABEL = "ascend-deepseek/flexible"


def flexible_label(ctx: Context, inst: InstancePlan) -> dict[str, str]:
    """``{FLEXIBLE_LABEL: "true"}`` on a flexible group's workloads (pd_ratio auto), else nothing."""
    return {FLEXIBLE_LABEL: "true"} if ctx.plan.flex_group_of(inst.name) else {}


def instance_replicas(ctx: Context, inst: InstancePlan) -> int:
    """1 for a running instance, 0 for a flexible group's standby shape (pd_ratio auto; the planner scales it)."""
    return 0 if any(s.name == inst.name for s in ctx.plan.standby) else 1


def group_affinity(inst: InstancePlan, worker: bool) -> dict[str, Any]:
    """Placement of a LeaderWorkerSet's pods beyond the leader's ``nodeSelector``.

    * one pod of the group per node: required podAntiAffinity on ``kubernetes.io/hostname`` against the
      group's pods (label ``leaderworkerset.sigs.k8s.io/name``; one group per set, ``replicas: 1``);
    * workers only on the instance's planned worker nodes (nodeAffinity ``In``): with one pod per node
      the group occupies exactly the Plan's nodes, and never a node the Plan gave another instance;
    * on super-pod hardware (the instance inside one super pod), workers in the leader's super pod:
      required podAffinity to the leader (worker-index 0) on ``huawei.com/topotree.superpodid``.

    Not LWS's ``exclusive-topology`` annotation: ``SetExclusiveAffinities`` (pkg/webhooks/pod_webhook.go,
    v0.10.0) requires every pod of a group in the *same* domain and no other group in it, i.e. the
    whole instance on one node for ``kubernetes.io/hostname``, and one instance per super pod for the
    super pod key; neither fits ranks that each need a node of their own in a shared super pod.
    """
    group = {"matchLabels": {SET_NAME_LABEL: inst.name}}
    affinity: dict[str, Any] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": group, "topologyKey": "kubernetes.io/hostname"}]}}
    if worker:
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                   "values": [r.node for r in inst.ranks[1:]]}]}]}}
        if inst.super_pod_id is not None:
            leader = {"matchLabels": {SET_NAME_LABEL: inst.name, WORKER_INDEX_LABEL: "0"}}
            affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": leader, "topologyKey": SUPER_POD_LABEL}]}
    return affinity


def instance_lws(ctx: Context, inst: InstancePlan, config_digest: str) -> K8sObject:
    """The LeaderWorkerSet of a multi-node instance (one group of ``len(ranks)`` pods)."""
    leader, first_worker = inst.ranks[0], inst.ranks[1]
    inst_labels = {LABEL_NAME: "vllm-ascend", LABEL_INSTANCE: inst.name, LABEL_ROLE: inst.role}
    leader_spec = {**_pinned(leader, _pod_spec(ctx, inst, leader)), "affinity": group_affinity(inst, worker=False)}
    worker_spec = {**_pod_spec(ctx, inst, first_worker, worker_template=True), "affinity": group_affinity(inst, worker=True)}
    digest_annotation = {"ascend-deepseek/config-digest": config_digest}
    return leader_worker_set(
        metadata(ctx, inst.name, ENGINE_COMPONENT, {**inst_labels, **flexible_label(ctx, inst)}),
        size=len(inst.ranks),
        leader=_template(ctx, leader.name, engine_labels(leader),
                         {**digest_annotation, "ascend-deepseek/node": leader.node}, leader_spec),
        worker=_template(ctx, f"{inst.name}-worker", {**inst_labels, LABEL_LEADER: "false"}, digest_annotation,
                         worker_spec),
        timeout_s=_startup_timeout(ctx),
        replicas=instance_replicas(ctx, inst),
        flexible=ctx.plan.flex_group_of(inst.name) is not None,
    )


def instance_objects(ctx: Context, inst: InstancePlan) -> list[K8sObject]:
    """Everything one engine instance needs, ConfigMaps first."""
    leader = inst.ranks[0]
    inst_labels = {LABEL_NAME: "vllm-ascend", LABEL_INSTANCE: inst.name, LABEL_ROLE: inst.role}
    tables = instance_tables(ctx, inst)
    launch = launch_data(ctx, inst)
    config_digest = digest({"tables": tables, "launch": launch})[:16]
    objs: list[K8sObject] = []
    if tables:
        objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": metadata(ctx, ranktable_configmap_name(inst), ENGINE_COMPONENT, inst_labels),
                     "data": tables})
    objs.append({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": metadata(ctx, launch_configmap_name(inst), ENGINE_COMPONENT, inst_labels), "data": launch})
    if uses_lws(ctx, inst):
        objs.append(instance_lws(ctx, inst, config_digest))
    else:
        objs += [rank_deployment(ctx, inst, r, config_digest) for r in inst.ranks]
    if serves_ranks(inst):
        objs += rank_services(ctx, inst, inst_labels)
    else:
        objs.append({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(ctx, api_service_name(inst), ENGINE_COMPONENT, inst_labels),
            "spec": {
                "type": "ClusterIP",
                "selector": rank_selector(leader),
                "ports": [{"name": "http", "port": inst.api_port, "targetPort": inst.api_port, "protocol": "TCP"}],
            },
        })
    objs.append(instance_pdb(ctx, inst, inst_labels))
    return objs


def rank_services(ctx: Context, inst: InstancePlan, labels: dict[str, str]) -> list[K8sObject]:
    """``serving: rank``: one Service per node group (:func:`rank_service_name`) with a port per DP rank it runs
    (``http`` for the first, ``http-r<j>`` after it; target the container port of the same number). Ranks of
    different node groups share port numbers, so a node group's Service selects its one pod: the leader by
    :func:`rank_selector`, a LeaderWorkerSet worker by its ``worker-index`` label (set by the controller), a rank
    Deployment's pod by :func:`rank_selector`."""
    out: list[K8sObject] = []
    for rank in inst.ranks:
        if rank.is_leader or not uses_lws(ctx, inst):
            selector = rank_selector(rank)
        else:
            selector = {LABEL_COMPONENT: ENGINE_COMPONENT, SET_NAME_LABEL: inst.name, WORKER_INDEX_LABEL: str(rank.index)}
        ports = [{"name": "http" if j == 0 else f"http-r{j}", "port": p, "targetPort": p, "protocol": "TCP"}
                 for j, p in enumerate(rank.api_ports)]
        out.append({"apiVersion": "v1", "kind": "Service",
                    "metadata": metadata(ctx, rank_service_name(inst, rank), ENGINE_COMPONENT, labels),
                    "spec": {"type": "ClusterIP", "selector": selector, "ports": ports}})
    return out


#: First Kubernetes minor whose eviction API honours ``unhealthyPodEvictionPolicy`` by default (feature gate
#: PDBUnhealthyPodEvictionPolicy: alpha and off in 1.26, beta and on from 1.27, GA in 1.31; the field's
#: description in the policy/v1 ``PodDisruptionBudgetSpec`` OpenAPI schema of each release, and kubernetes/website
#: ``content/en/docs/reference/command-line-tools-reference/feature-gates/PDBUnhealthyPodEvictionPolicy.md``).
UNHEALTHY_POD_EVICTION_SINCE = (1, 27)


def instance_pdb(ctx: Context, inst: InstancePlan, labels: dict[str, str]) -> K8sObject:
    """The PodDisruptionBudget of an instance: no voluntary eviction of a serving instance's ranks.

    ``maxUnavailable: 0``: evicting any rank takes the whole instance down (a LeaderWorkerSet recreates
    the group), so a drain of a serving node is refused and goes through the runbooks. Under the
    default ``unhealthyPodEvictionPolicy`` (``IfHealthyBudget``) the eviction API also refuses to
    evict a *not Ready* pod whenever fewer pods are healthy than the budget wants, which with
    ``maxUnavailable: 0`` is whenever any rank is not Ready: an instance that is already down (a
    crashed leader makes every worker unready, a worker stuck on a failed node) would block the drain of
    every node it occupies, forever. ``AlwaysAllow`` lets such pods go; Ready pods stay protected
    (policy/v1 ``PodDisruptionBudgetSpec.unhealthyPodEvictionPolicy``; kubernetes/website
    ``content/en/docs/tasks/run-application/configure-pdb.md``, "Unhealthy Pod Eviction Policy").
    Older clusters (:data:`UNHEALTHY_POD_EVICTION_SINCE`) get the budget without the field.
    Shape: a policy/v1 PodDisruptionBudget dict named after the instance.
    """
    spec: dict[str, Any] = {"maxUnavailable": 0,
                            "selector": {"matchLabels": {LABEL_COMPONENT: ENGINE_COMPONENT, LABEL_INSTANCE: inst.name}}}
    major, minor = (int(x) for x in str(ctx.k8s["version"]).split(".")[:2])
    if (major, minor) >= UNHEALTHY_POD_EVICTION_SINCE:
        spec["unhealthyPodEvictionPolicy"] = "AlwaysAllow"
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": metadata(ctx, inst.name, ENGINE_COMPONENT, labels), "spec": spec}
