"""Pulumi ComponentResources wrapping the object data in typed pulumi_kubernetes resources.

The objects come from :func:`ascend_runtime.render.objects.build_system`; this
layer only adds resource classes, parents, ordering and outputs. Each object
dict becomes e.g. ``k8s.apps.v1.Deployment(name, metadata=..., spec=...)``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from ascend_runtime.config.errors import ConfigError, Problem
from ascend_runtime.config.runtime_image import configured_reference
from ascend_runtime.config.secrets import set_secret_command
from ascend_runtime.deploy.image import build_runtime_image, pinned_image, with_image
from ascend_runtime.deploy.node_labels import checked_node_patch
from ascend_runtime.planner.plan import InstancePlan, Plan
from ascend_runtime.render.environment import secret_env_references
from ascend_runtime.render.objects import K8sObject, SystemObjects
from ascend_runtime.render.objects.cluster import lws_prerequisite
from ascend_runtime.render.objects.common import (
    EXPERT_MAP_CONFIGMAP,
    SECRET_KEYS,
    env_pulumi_secrets,
    placeholder_key,
)
from ascend_runtime.render.objects.faults import (
    PROXY_ADMIN_SECRET,
    fault_watcher_objects,
)
from ascend_runtime.render.objects.lws import RELEASE as LWS_RELEASE
from ascend_runtime.render.objects.mindcluster import is_patch
from ascend_runtime.rollout.order import predecessors

#: Label of a flexible group's engine objects (render/objects/engine.py); their replicas are the planner's.
FLEXIBLE_LABEL = "ascend-deepseek/flexible"

TYPE_PREFIX = "ascend-deepseek:deploy"

#: (apiVersion, kind) -> typed pulumi_kubernetes resource class.
RESOURCE_CLASSES: dict[tuple[str, str], type[pulumi.CustomResource]] = {
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "Node"): k8s.core.v1.NodePatch,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Secret"): k8s.core.v1.Secret,
    ("v1", "Service"): k8s.core.v1.Service,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSet,
    ("batch/v1", "Job"): k8s.batch.v1.Job,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("node.k8s.io/v1", "RuntimeClass"): k8s.node.v1.RuntimeClass,
}
#: (apiVersion, kind) -> Pulumi Patch resource of an object the kit patches but does not own (mindcluster.py).
PATCH_CLASSES: dict[tuple[str, str], type[pulumi.CustomResource]] = {
    ("apps/v1", "DaemonSet"): k8s.apps.v1.DaemonSetPatch,
}
WORKLOAD_KINDS = ("Deployment", "DaemonSet", "LeaderWorkerSet")


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _with_secrets(value: Any) -> Any:
    """Replace secret placeholders by the Pulumi secret config values (Outputs marked secret)."""
    if isinstance(value, dict):
        return {k: _with_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_with_secrets(v) for v in value]
    if isinstance(value, str):
        key = placeholder_key(value)
        if key is not None:
            return pulumi.Config().require_secret(key)
    return value


def _placeholders(value: Any) -> list[str]:
    """Secret placeholders anywhere in ``value``."""
    if isinstance(value, dict):
        return [p for v in value.values() for p in _placeholders(v)]
    if isinstance(value, list):
        return [p for v in value for p in _placeholders(v)]
    key = placeholder_key(value) if isinstance(value, str) else None
    return [key] if key is not None else []


def secret_inputs(obj: K8sObject) -> dict[str, Any]:
    """The object's inputs with secret values: only a Secret carries them; a placeholder elsewhere is a kit bug."""
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    if obj["kind"] == "Secret" and obj["apiVersion"] == "v1":
        return {k: _with_secrets(v) for k, v in body.items()}
    stray = _placeholders(body)
    if stray:
        raise ValueError(f"{obj['kind']} {obj['metadata'].get('name')}: secret placeholders {stray} outside a Secret")
    return body


def resource_name(obj: K8sObject) -> str:
    """Pulumi logical name: ``[namespace/]name`` (unique per resource type)."""
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if "namespace" in meta else meta["name"]


def register(obj: K8sObject, opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Wrap one object dict in its typed pulumi_kubernetes resource."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    body = {_snake(k): v for k, v in secret_inputs(obj).items()}
    cls = (PATCH_CLASSES if is_patch(obj) else RESOURCE_CLASSES).get((api_version, kind))
    if cls is None:
        if "." not in api_version.split("/")[0]:
            raise KeyError(f"no resource class for {api_version} {kind}")
        return k8s.apiextensions.CustomResource(
            resource_name(obj), api_version=api_version, kind=kind, metadata=obj["metadata"],
            spec=obj.get("spec"), opts=opts)
    return cls(resource_name(obj), opts=opts, **body)


def _child(parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] = (), **extra: Any) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on), **extra)


@dataclass
class ObjectsArgs:
    """Objects a component registers and the resources they must wait for."""

    objects: list[K8sObject]
    depends_on: list[pulumi.Resource] = field(default_factory=list)


class _ObjectsComponent(pulumi.ComponentResource):
    """Registers its objects in order; ConfigMaps and RBAC first, workloads after them."""

    type_name = "Objects"

    def __init__(self, name: str, args: ObjectsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:{self.type_name}", name, None, opts)
        self.args = args
        self.depends_on: list[pulumi.Resource] = list(args.depends_on)
        self.resources: list[pulumi.CustomResource] = []
        self.workloads: list[pulumi.CustomResource] = []
        support: list[pulumi.Resource] = []
        for obj in args.objects:
            is_workload = obj["kind"] in WORKLOAD_KINDS or obj["kind"] == "Job"
            deps = [*args.depends_on, *(support if is_workload else [])]
            extra = self.extra_options(obj)
            res = register(self.prepared(obj), _child(self, deps, **extra))
            self.resources.append(res)
            (self.workloads if is_workload else support).append(res)
        self.register_outputs({"objects": len(self.resources)})

    def extra_options(self, obj: K8sObject) -> dict[str, Any]:
        """Per-object resource options (none by default)."""
        return {}

    def prepared(self, obj: K8sObject) -> K8sObject:
        """The object as registered (itself by default; inputs may become Outputs that wait for a check)."""
        return obj


@dataclass
class ClusterPrepArgs(ObjectsArgs):
    """The cluster objects, what the engines need of the LeaderWorkerSet controller (``lws_prerequisite``), and
    the Plan whose nodes' super pod labels are read before their patches apply (``node_labels.py``)."""

    lws: str | None = None
    plan: Plan | None = None


class ClusterPrep(_ObjectsComponent):
    """Namespace, RuntimeClass, device plugin, the MindCluster DaemonSets' tolerations (DaemonSetPatch:
    mindcluster.py), secrets, node labels (NodePatch; no taints: cluster.py ``node_patch``; on A3 each waits for
    the read of the device plugin's super pod label, node_labels.py) and the LeaderWorkerSet prerequisite.

    ``lws == "check"``: reads the pinned CRD (``CustomResourceDefinition.get``), so ``pulumi preview``/``up``
    fails before creating anything when the cluster lacks the controller; ``"install"``: applies the pinned
    release manifest (``yaml.v2.ConfigFile``, resolved by the provider at deploy time). The engines depend
    on this component, so their LeaderWorkerSets come after either.
    """

    type_name = "ClusterPrep"

    def prepared(self, obj: K8sObject) -> K8sObject:
        plan = getattr(self.args, "plan", None)
        if obj["kind"] == "Node" and plan is not None:
            return checked_node_patch(obj, plan, self)
        return obj

    def __init__(self, name: str, args: ObjectsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(name, args, opts)
        lws = getattr(args, "lws", None)
        self.lws: pulumi.Resource | None = None
        if lws == "check":
            self.lws = k8s.apiextensions.v1.CustomResourceDefinition.get(
                LWS_RELEASE.crd_name, LWS_RELEASE.crd_name, opts=pulumi.ResourceOptions(parent=self))
        elif lws == "install":
            self.lws = k8s.yaml.v2.ConfigFile(
                f"lws-{LWS_RELEASE.tag}", file=LWS_RELEASE.manifest_url, opts=pulumi.ResourceOptions(parent=self))
        elif lws is not None:
            raise ValueError(f"unknown LeaderWorkerSet prerequisite {lws!r}")


@dataclass
class EngineInstanceArgs(ObjectsArgs):
    """One engine instance: its Plan entry and its objects (ConfigMaps, the LeaderWorkerSet or rank
    Deployments, Service, PDB)."""

    instance: InstancePlan | None = None


class EngineInstance(_ObjectsComponent):
    """All ranks of one vLLM-Ascend instance; ``workloads`` are its LeaderWorkerSet or its Deployments."""

    type_name = "EngineInstance"

    def __init__(self, name: str, args: EngineInstanceArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(name, args, opts)
        inst = args.instance
        self.nodes = list(inst.nodes) if inst else []

    def extra_options(self, obj: K8sObject) -> dict[str, Any]:
        # a flexible group's workloads (pd_ratio auto): the P:D planner owns their replica count
        if obj["kind"] in ("Deployment", "LeaderWorkerSet") and obj["metadata"]["labels"].get(FLEXIBLE_LABEL) == "true":
            return {"ignore_changes": ["spec.replicas"]}
        return {}


class PDPlanner(_ObjectsComponent):
    """The P:D planner: RBAC on the flexible workloads' replicas, Plan ConfigMap, Deployment, NetworkPolicies."""

    type_name = "PDPlanner"


class Proxy(_ObjectsComponent):
    """The PD proxy Deployment, Service, instances ConfigMap and PDB."""

    type_name = "Proxy"


class Balancer(_ObjectsComponent):
    """The expert balancer; Pulumi leaves the content of its expert-map ConfigMap alone."""

    type_name = "Balancer"

    def extra_options(self, obj: K8sObject) -> dict[str, Any]:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == EXPERT_MAP_CONFIGMAP:
            return {"ignore_changes": ["data"]}
        return {}


class FaultWatcher(_ObjectsComponent):
    """The fault watcher: proxy admin token Secret, RBAC, topology ConfigMap, Deployment, Service, NetworkPolicies."""

    type_name = "FaultWatcher"


class NetworkPolicies(_ObjectsComponent):
    """NetworkPolicies of the serving namespace."""

    type_name = "NetworkPolicies"


class Monitoring(_ObjectsComponent):
    """ServiceMonitor/PodMonitor (when the operator CRDs exist) and the Grafana dashboard."""

    type_name = "Monitoring"


class PostDeployChecks(_ObjectsComponent):
    """The check Job; it depends on every workload, and its failure fails `pulumi up`."""

    type_name = "PostDeployChecks"


@dataclass
class ServingSystemArgs:
    """The Plan and its objects (from ``build_system``)."""

    plan: Plan
    objects: SystemObjects


class ServingSystem(pulumi.ComponentResource):
    """The whole PD-separated serving system of one stack.

    ``runtime_image``: the build of the kit's image (``{build: ...}`` stacks; None for a prebuilt one);
    ``image_ref``: what every kit pod runs, the build's ``registry/repository@<digest>`` (deploy/image.py).
    """

    def __init__(self, name: str, args: ServingSystemArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(f"{TYPE_PREFIX}:ServingSystem", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.runtime_image = build_runtime_image(args.plan, child)
        self.image_ref = pinned_image(args.plan, self.runtime_image)
        configured = configured_reference(args.plan.config)
        objs = replace(args.objects, **{f.name: with_image(getattr(args.objects, f.name), configured, self.image_ref)
                                        for f in fields(args.objects)})
        self.cluster = ClusterPrep("cluster", ClusterPrepArgs(objs.cluster + objs.node_patches,
                                                              lws=lws_prerequisite(args.plan), plan=args.plan), child)
        base = [self.cluster]
        # one instance of a role at a time: each waits for the previous one of its role (the order of
        # `ascend-deploy rollout`), so an image change replaces them one after another (docs/rollout.md)
        previous = predecessors((n, args.plan.instance(n).role, args.plan.instance(n).ordinal) for n in objs.engines)
        self.engines: dict[str, EngineInstance] = {}
        for name in sorted(objs.engines, key=list(previous).index):
            before = previous[name]
            deps = [*base, *([self.engines[before]] if before else [])]
            self.engines[name] = EngineInstance(name, EngineInstanceArgs(objs.engines[name], deps,
                                                                         args.plan.instance(name)), child)
        self.proxy = Proxy("proxy", ObjectsArgs(objs.proxy, base), child)
        self.balancer = Balancer("balancer", ObjectsArgs(objs.balancer, base), child) if objs.balancer else None
        faults = with_image(fault_watcher_objects(args.plan, pulumi.Config().get_secret(PROXY_ADMIN_SECRET) is not None,
                                                  present_secrets()), configured, self.image_ref)
        self.faults = FaultWatcher("faults", ObjectsArgs(faults, base), child) if faults else None
        self.network = NetworkPolicies("network", ObjectsArgs(objs.network, base), child)
        self.pdplanner = (PDPlanner("pdplanner", ObjectsArgs(objs.pdplanner, [*base, *self.engines.values()]), child)
                          if objs.pdplanner else None)
        self.monitoring = Monitoring("monitoring", ObjectsArgs(objs.monitoring, base), child)
        workloads = [*self.engines.values(), self.proxy, *([self.balancer] if self.balancer else [])]
        self.checks = (
            PostDeployChecks("checks", ObjectsArgs(objs.checks, [*base, *workloads, self.network]), child)
            if objs.checks else None
        )
        self.register_outputs({"instances": {n: e.nodes for n, e in self.engines.items()}})


def present_secrets() -> frozenset[str]:
    """Secret config keys set on the stack (read with ``get_secret``; values never leave Pulumi)."""
    config = pulumi.Config()
    return frozenset(k for k in SECRET_KEYS if config.get_secret(k) is not None)


def require_env_secrets(plan: Plan) -> None:
    """Every Pulumi secret an ``engine.extra_env`` variable references is set; raises ConfigError before
    any resource is registered, naming the variable and the command (never a value)."""
    config = pulumi.Config()
    missing = {key for key in env_pulumi_secrets(plan) if config.get_secret(key) is None}
    problems = [
        Problem(f"engine.extra_env.{name}", f"references the Pulumi secret {ref['secret']!r}, which is not set", None,
                f"run `{set_secret_command(ref['secret'])}`")
        for name, ref in secret_env_references(plan).items()
        if ref.get("secret") in missing
    ]
    if problems:
        raise ConfigError(problems, f"stack {plan.stack}")
