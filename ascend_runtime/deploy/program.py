"""Entry point of the Pulumi program (called by the project's ``__main__.py``).

The Plan is built first; an invalid stack raises :class:`ConfigError` before a
single resource is registered.
"""

from __future__ import annotations

import pulumi

from ascend_runtime.planner import Plan, load_plan


def export_plan_summary(plan: Plan) -> None:
    """Stack outputs every environment has: proxy endpoint, instances and their nodes."""
    pulumi.export("proxy_endpoint", plan.proxy_url)
    pulumi.export("instances", {i.name: {"role": i.role, "nodes": list(i.nodes), "api": i.api_url} for i in plan.instances})
    pulumi.export(
        "plan_summary",
        {
            "hardware": plan.hardware,
            "kv_connector": plan.kv_connector,
            "prefill_npus": sum(i.npus for i in plan.by_role("prefill")),
            "decode_npus": sum(i.npus for i in plan.by_role("decode")),
        },
    )


def main(stack_name: str | None = None) -> Plan:
    """Build the Plan of the current Pulumi stack and declare its resources."""
    plan = load_plan(stack_name or pulumi.get_stack())
    export_plan_summary(plan)
    return plan
