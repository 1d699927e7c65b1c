"""Engine instances: one Deployment per rank, pinned to the Plan's node, plus ConfigMaps,
the instance's API Service and its PodDisruptionBudget.

Gang restart of a multi-node instance (see docs/kubernetes.md):

* the leader's liveness probe is its own ``/health``; vLLM reports the engine
  dead as soon as one DP engine (also those on worker nodes) dies, so the
  leader is restarted;
* every worker's liveness (and readiness) probe is the *leader's* ``/health``:
  when the leader goes away the workers are restarted too and wait, under a
  fresh startup probe, for the new leader's rendezvous;
* liveness only starts after the startup probe succeeded, and the startup
  probe allows ``startup_probe_seconds`` (default an hour) for model loading,
  so no probe can kill a loading engine.
"""

from __future__ import annotations

import json
import math
import posixpath
from typing import Any

from ascend_runtime.deploy import renderers
from ascend_runtime.deploy.objects.common import (
    EXPERT_MAP_CONFIGMAP,
    EXPERT_MAP_KEY,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_LEADER,
    LABEL_NAME,
    LABEL_RANK,
    LABEL_ROLE,
    MODEL_SOURCE_SECRET,
    MODEL_SOURCE_SECRET_NAME,
    TAINT_KEY,
    Context,
    K8sObject,
    configmap_key,
    digest,
    metadata,
)
from ascend_runtime.cli.commands.sim import argv_from_config
from ascend_runtime.planner.plan import InstancePlan, RankPlan
from ascend_runtime.sim.from_plan import sim_config_from_plan

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


def instance_tables(ctx: Context, inst: InstancePlan) -> dict[str, str]:
    """ConfigMap data: the rank tables the instance's ranks read (JSON text)."""
    tables = renderers.rank_tables(ctx.plan)
    names = sorted({n for r in inst.ranks for n in renderers.ranktables_for_rank(ctx.plan, r)})
    return {configmap_key(renderers.ranktable_file(n)): json.dumps(tables[n], indent=2) + "\n" for n in names}


def launch_data(ctx: Context, inst: InstancePlan) -> dict[str, str]:
    """ConfigMap data: one launch script per rank, the leader-watch library the headless ranks source,
    and on simulated targets each node's hccn.conf."""
    data = {f"{r.name}.sh": renderers.launch_script(ctx.plan, r) for r in inst.ranks}
    if len(inst.ranks) > 1:
        data[renderers.LEADER_WATCH] = renderers.leader_watch_script()
    if ctx.simulated:
        for r in inst.ranks:
            data[f"hccn-{r.node}.conf"] = renderers.hccn_conf(ctx.plan, r.node)
    return data


def _probe(rank: RankPlan, ctx: Context, inst: InstancePlan, period: int, failures: int, timeout: int) -> dict[str, Any]:
    """Probe of ``/health``: the rank's own API on the leader, the leader's API on workers."""
    base = {"periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": timeout}
    if rank.is_leader:
        return {"httpGet": {"path": "/health", "port": inst.api_port}, **base}
    if ctx.simulated:
        url = api_service_url(ctx, inst) + "/health"
        code = f"import urllib.request; urllib.request.urlopen('{url}', timeout={timeout})"
        return {"exec": {"command": ["python3", "-c", code]}, **base}
    return {"httpGet": {"host": inst.ranks[0].host_ip, "path": "/health", "port": inst.api_port}, **base}


def probes(ctx: Context, inst: InstancePlan, rank: RankPlan) -> dict[str, Any]:
    """startupProbe (budget ``startup_probe_seconds``), readinessProbe and livenessProbe."""
    startup_s = ctx.k8s["startup_probe_seconds"]
    return {
        "startupProbe": _probe(rank, ctx, inst, HEALTH_PERIOD_S, math.ceil(startup_s / HEALTH_PERIOD_S), 5),
        "readinessProbe": _probe(rank, ctx, inst, HEALTH_PERIOD_S, 3, 5),
        "livenessProbe": _probe(rank, ctx, inst, 30, 4, 10),
    }


def _volumes(ctx: Context, inst: InstancePlan, rank: RankPlan) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, volumeMounts) of one rank."""
    volumes: list[dict[str, Any]] = [
        {"name": "ranktables", "configMap": {"name": ranktable_configmap_name(inst)}},
        {"name": "launch", "configMap": {"name": launch_configmap_name(inst), "defaultMode": 0o755}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{ctx.k8s['shm_size_gib']}Gi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "ranktables", "mountPath": renderers.RANKTABLE_DIR, "readOnly": True},
        {"name": "launch", "mountPath": renderers.LAUNCH_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if ctx.simulated:
        mounts.append({"name": "launch", "mountPath": renderers.HCCN_CONF, "subPath": f"hccn-{rank.node}.conf", "readOnly": True})
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
    map_path = ctx.plan.config["engine"].get("expert_map_path")
    if map_path:
        volumes.append({"name": "expert-map", "configMap": {
            "name": EXPERT_MAP_CONFIGMAP, "items": [{"key": EXPERT_MAP_KEY, "path": posixpath.basename(map_path)}]}})
        mounts.append({"name": "expert-map", "mountPath": posixpath.dirname(map_path), "readOnly": True})
    return volumes, mounts


def simulator_command(ctx: Context, inst: InstancePlan, rank: RankPlan) -> list[str]:
    """``ascend-deploy sim`` argv of a simulated leader (kind): the instance's shape and the stack's timing."""
    config = sim_config_from_plan(ctx.plan, inst, bind_host="0.0.0.0").model_copy(
        update={"kv_port": rank.kv_port, "kv_host": "$(POD_IP)"}
    )
    return ["ascend-deploy", "sim", *argv_from_config(config)]


def _container(ctx: Context, inst: InstancePlan, rank: RankPlan) -> dict[str, Any]:
    env = [{"name": k, "value": v} for k, v in sorted(renderers.rank_env(ctx.plan, rank).items())]
    if MODEL_SOURCE_SECRET in ctx.secrets and not ctx.simulated:
        env.append({"name": "MODEL_SOURCE_CREDENTIALS",
                    "valueFrom": {"secretKeyRef": {"name": MODEL_SOURCE_SECRET_NAME, "key": "credentials"}}})
    if ctx.simulated:
        env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    ports = []
    if rank.is_leader:
        ports.append({"name": "api", "containerPort": inst.api_port, "protocol": "TCP"})
    if ctx.simulated:
        image = ctx.plan.config["simulator"]["image"]
        if rank.is_leader:
            command = simulator_command(ctx, inst, rank)
        else:
            # a simulated worker holds its node slot and follows the leader's health (gang restart)
            command = ["sleep", "infinity"]
        resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "256Mi"}}
    else:
        image = ctx.plan.config["engine"]["image"]
        command = ["/bin/bash", f"{renderers.LAUNCH_DIR}/{rank.name}.sh"]
        npus = str(len(rank.devices))
        resources = {"requests": {ctx.k8s["npu_resource"]: npus}, "limits": {ctx.k8s["npu_resource"]: npus}}
    volumes_mounts = _volumes(ctx, inst, rank)[1]
    container: dict[str, Any] = {
        "name": "engine",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": env,
        "resources": resources,
        "volumeMounts": volumes_mounts,
        **probes(ctx, inst, rank),
    }
    if ports:
        container["ports"] = ports
    return container


def rank_deployment(ctx: Context, inst: InstancePlan, rank: RankPlan, config_digest: str) -> K8sObject:
    """The workload of one rank: a single-replica Deployment pinned to the Plan's node."""
    labels = engine_labels(rank)
    timeout = ctx.k8s["startup_probe_seconds"] + 600
    pod_spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": rank.node},
        "tolerations": [{"key": TAINT_KEY, "operator": "Equal", "value": rank.role, "effect": "NoSchedule"}],
        "hostNetwork": True,
        "dnsPolicy": "ClusterFirstWithHostNet",
        "terminationGracePeriodSeconds": ctx.k8s["termination_grace_seconds"],
        "containers": [_container(ctx, inst, rank)],
        "volumes": _volumes(ctx, inst, rank)[0],
    }
    if ctx.k8s.get("runtime_class") and not ctx.simulated:
        pod_spec["runtimeClassName"] = ctx.k8s["runtime_class"]
    if ctx.image_pull_secrets:
        pod_spec["imagePullSecrets"] = ctx.image_pull_secrets
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(ctx, rank.name, ENGINE_COMPONENT, labels,
                             annotations={"pulumi.com/timeoutSeconds": str(timeout)}),
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": timeout,
            "selector": {"matchLabels": rank_selector(rank)},
            "template": {
                "metadata": {
                    "labels": {**metadata(ctx, rank.name, ENGINE_COMPONENT)["labels"], **labels},
                    "annotations": {"ascend-deepseek/config-digest": config_digest,
                                    "ascend-deepseek/node": rank.node},
                },
                "spec": pod_spec,
            },
        },
    }


def instance_objects(ctx: Context, inst: InstancePlan) -> list[K8sObject]:
    """Everything one engine instance needs, ConfigMaps first."""
    leader = inst.ranks[0]
    inst_labels = {LABEL_NAME: "vllm-ascend", LABEL_INSTANCE: inst.name, LABEL_ROLE: inst.role}
    tables = instance_tables(ctx, inst)
    launch = launch_data(ctx, inst)
    config_digest = digest({"tables": tables, "launch": launch})[:16]
    objs: list[K8sObject] = [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": metadata(ctx, ranktable_configmap_name(inst), ENGINE_COMPONENT, inst_labels), "data": tables},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": metadata(ctx, launch_configmap_name(inst), ENGINE_COMPONENT, inst_labels), "data": launch},
    ]
    objs += [rank_deployment(ctx, inst, r, config_digest) for r in inst.ranks]
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
    objs.append({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(ctx, inst.name, ENGINE_COMPONENT, inst_labels),
        # evicting any rank takes the whole instance down: voluntary disruptions go through the runbooks
        "spec": {"maxUnavailable": 0,
                 "selector": {"matchLabels": {LABEL_COMPONENT: ENGINE_COMPONENT, LABEL_INSTANCE: inst.name}}},
    })
    return objs
