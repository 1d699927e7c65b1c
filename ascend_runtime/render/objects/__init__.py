"""Kubernetes objects of a Plan, as data (pure functions, no Pulumi).

:func:`build_system` is the single source of both the Pulumi program
(``components.py``) and ``render``'s manifests (``manifests.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects.balancer import balancer_objects
from ascend_runtime.render.objects.checks import checks_job
from ascend_runtime.render.objects.cluster import cluster_objects, node_patch
from ascend_runtime.render.objects.common import Context, K8sObject
from ascend_runtime.render.objects.engine import instance_objects
from ascend_runtime.render.objects.monitoring import monitoring_objects
from ascend_runtime.render.objects.network import network_policies
from ascend_runtime.render.objects.pdplanner import pdplanner_objects
from ascend_runtime.render.objects.proxy import proxy_objects
from ascend_runtime.render.objects.resources import require_engine_resources

__all__ = ["Context", "K8sObject", "SystemObjects", "build_system", "deploys_to_kubernetes"]


def deploys_to_kubernetes(plan: Plan) -> bool:
    """True for the ``kubernetes`` and ``kind`` targets; ``local`` runs processes, not objects."""
    return plan.target in ("kubernetes", "kind")


@dataclass(frozen=True)
class SystemObjects:
    """Every object of a stack, grouped by the component that registers it."""

    cluster: list[K8sObject]
    node_patches: list[K8sObject]
    engines: dict[str, list[K8sObject]]
    proxy: list[K8sObject]
    balancer: list[K8sObject]
    network: list[K8sObject]
    monitoring: list[K8sObject]
    checks: list[K8sObject] = field(default_factory=list)
    pdplanner: list[K8sObject] = field(default_factory=list)  # pd_ratio auto only

    def groups(self) -> Iterator[tuple[str, list[K8sObject]]]:
        """(group path, objects) in registration order; engine groups are ``engine/<instance>``."""
        yield "cluster", self.cluster
        yield "nodes", self.node_patches
        for name, objs in self.engines.items():
            yield f"engine/{name}", objs
        yield "proxy", self.proxy
        yield "balancer", self.balancer
        yield "network", self.network
        yield "monitoring", self.monitoring
        yield "checks", self.checks
        if self.pdplanner:
            yield "pdplanner", self.pdplanner

    def all(self) -> list[K8sObject]:
        """Every object, flat."""
        return [o for _, objs in self.groups() for o in objs]


def build_system(plan: Plan, secrets: Iterable[str] = ()) -> SystemObjects:
    """All objects of a Plan. ``secrets``: the secret config keys the stack has set.

    Raises ConfigError when the engine pods' memory cannot hold ``/dev/shm`` and the engine, or their CPU
    request is below what vLLM-Ascend binds (:func:`.resources.resource_problems`).
    """
    require_engine_resources(plan)
    ctx = Context(plan, frozenset(secrets))
    balancer = balancer_objects(ctx)
    job = checks_job(ctx)
    return SystemObjects(
        cluster=cluster_objects(ctx),
        node_patches=[node_patch(ctx, n) for n in plan.nodes],
        engines={i.name: instance_objects(ctx, i) for i in plan.all_instances},  # both shapes of flexible groups
        proxy=proxy_objects(ctx),
        balancer=balancer,
        network=network_policies(ctx, bool(balancer)),
        monitoring=monitoring_objects(ctx, bool(balancer)),
        checks=[job] if job else [],
        pdplanner=pdplanner_objects(ctx),
    )
