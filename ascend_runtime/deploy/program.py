"""Entry point of the Pulumi program (called by the project's ``__main__.py``).

The Plan is built first; an invalid stack raises :class:`ConfigError` before a
single resource is registered.
"""

from __future__ import annotations

import shlex

import pulumi

from ascend_runtime.deploy.components import (
    ServingSystem,
    ServingSystemArgs,
    present_secrets,
    require_env_secrets,
)
from ascend_runtime.deploy.image import require_registry_secrets
from ascend_runtime.engine.conformance import require_conformance
from ascend_runtime.planner import Plan, load_plan
from ascend_runtime.render.objects import build_system, deploys_to_kubernetes
from ascend_runtime.render.objects import text as renderers
from ascend_runtime.render.objects.cluster import serving_taint_commands
from ascend_runtime.render.objects.common import Context, digest


def rank_table_digests(plan: Plan) -> dict[str, str]:
    """sha256 of each rank table (canonical JSON), keyed by its file name."""
    return {name: digest(table) for name, table in sorted(renderers.rank_tables(plan).items())}


def node_taint_commands(plan: Plan) -> list[str]:
    """The ``kubectl taint ... --overwrite`` command lines that give the serving nodes their taint.

    Not a resource: Node ``spec.taints`` is an atomic list under server-side apply, so a NodePatch holding
    it would conflict with every other manager's taint (docs/kubernetes.md, "Serving taint").
    """
    return [shlex.join(argv) for argv in serving_taint_commands(Context(plan))]


def export_plan_summary(plan: Plan) -> None:
    """Stack outputs: proxy endpoint, instances and their nodes, rank table digests, plan summary, and on
    Kubernetes targets the serving taint's commands (``node_taint_commands``)."""
    pulumi.export("proxy_endpoint", plan.proxy_url)
    if deploys_to_kubernetes(plan):
        pulumi.export("node_taint_commands", node_taint_commands(plan))
    pulumi.export("instances", {i.name: {"role": i.role, "nodes": list(i.nodes), "api": i.api_url} for i in plan.instances})
    pulumi.export("rank_table_digests", rank_table_digests(plan))
    pulumi.export(
        "plan_summary",
        {
            "stack": plan.stack,
            "target": plan.target,
            "hardware": plan.hardware,
            "kv_connector": plan.kv_connector,
            "vllm_ascend_version": plan.vllm_ascend_version,
            "namespace": plan.config["kubernetes"]["namespace"],
            "prefill_npus": sum(i.npus for i in plan.by_role("prefill")),
            "decode_npus": sum(i.npus for i in plan.by_role("decode")),
            "nodes_used": sum(1 for n in plan.nodes if n.role),
        },
    )


def main(stack_name: str | None = None) -> Plan:
    """Build the Plan of the current Pulumi stack and declare its resources.

    The ``local`` target runs processes on this machine instead:
    its stack registers no Kubernetes objects, only the outputs (`ascend-deploy up --stack local` runs it).
    """
    plan = load_plan(stack_name or pulumi.get_stack())
    require_conformance(plan)  # every flag, key, env var and connector exists in the targeted release
    if deploys_to_kubernetes(plan):
        require_env_secrets(plan)  # every Pulumi secret engine.extra_env references is set, before any resource
        require_registry_secrets(plan)  # a runtime image build logs in with the stack's secrets only
        system = ServingSystem(plan.stack, ServingSystemArgs(plan, build_system(plan, present_secrets())))
        pulumi.export("runtime_image", system.image_ref)  # what every kit pod runs (a build: pinned by digest)
    export_plan_summary(plan)
    return plan
