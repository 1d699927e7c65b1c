"""The expert balancer: ServiceAccount, Role (its own ConfigMap only), RoleBinding,
expert-map ConfigMap, Deployment and metrics Service; on kind also the Secret with the
simulators' admin token (when the stack sets ``simulator_admin_token``)."""

from __future__ import annotations

from typing import Any

from ascend_runtime.render.objects.common import (
    BALANCER_NAME,
    EXPERT_MAP_CONFIGMAP,
    EXPERT_MAP_KEY,
    LABEL_COMPONENT,
    SIM_ADMIN_TOKEN_ENV,
    Context,
    K8sObject,
    balanced_instances,
    metadata,
    simulator_admin_secret,
    simulator_admin_token,
    simulator_admin_token_env,
)
from ascend_runtime.render.objects.controller import (
    controller_container,
    controller_pod_spec,
    metrics_service,
    role_with_binding,
    service_account,
    single_deployment,
)
from ascend_runtime.render.objects.engine import api_service_url

COMPONENT = "balancer"
__all__ = ["balanced_instances", "balancer_command", "balancer_objects", "has_role", "publishes_maps", "role_rules"]


def role_rules(ctx: Context) -> list[dict[str, Any]]:
    """The only permissions: get and update of the expert-map ConfigMap."""
    return [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [EXPERT_MAP_CONFIGMAP],
             "verbs": ["get", "update"]}]


def publishes_maps(ctx: Context) -> bool:
    """Whether the daemon publishes warm-start maps to the expert-map ConfigMap.

    Simulators apply maps at run time; vLLM-Ascend 0.11.0 reads a static map at start
    (``additional_config.expert_map_path``, vllm_ascend/ascend_config.py, v0.11.0), so a map
    published there warm-starts instances that start or restart. On 0.23.0 the engine balances
    itself (dynamic EPLB, ``eplb_config``) and the daemon is not deployed (:func:`has_role`),
    see docs/balancer.md.
    """
    return ctx.simulated or str(ctx.plan.config["engine"].get("vllm_ascend_version", "")).startswith("0.11")


def balancer_command(ctx: Context) -> list[str]:
    """``ascend-deploy balance serve`` argv."""
    insts = balanced_instances(ctx)
    first = insts[0]
    nodes = len(first.ranks)
    cmd = ["ascend-deploy", "balance", "serve",
           "--experts", str(ctx.plan.config["model"]["num_routed_experts"]),
           "--ranks", str(first.ep), "--slots", str(first.expert_slots_per_rank),
           "--groups", str(ctx.plan.config["model"]["num_expert_groups"]), "--nodes", str(nodes),
           "--configmap", f"{ctx.namespace}/{EXPERT_MAP_CONFIGMAP}:{EXPERT_MAP_KEY}",
           # applying a map restarts engines; on real clusters that is the rebalance runbook's job
           "--apply", "simulator" if ctx.simulated else "none",
           # the CLI binds 127.0.0.1 by default; Prometheus scrapes the pod IP
           "--metrics-host", "0.0.0.0", "--metrics-port", str(ctx.plan.config["ports"]["balancer_metrics"])]
    if simulator_admin_token(ctx):
        cmd += ["--sim-token-env", SIM_ADMIN_TOKEN_ENV]
    for inst in insts:
        cmd += ["--instance", f"{inst.name}={api_service_url(ctx, inst) if ctx.simulated else inst.api_url}"]
    return cmd


def has_role(ctx: Context) -> bool:
    """Whether the daemon has work on this target: a heat source to read and a map consumer.

    Simulators serve their expert load and apply maps; vLLM-Ascend 0.11.0 reads a static map at
    start. vLLM-Ascend 0.23.0 keeps expert heat inside the engine process (``shared_dict["moe_load"]``,
    vllm_ascend/eplb/eplb_updator.py, v0.23.0), serves no load endpoint and rebalances itself
    (dynamic EPLB): there the daemon would poll an endpoint that does not exist, so it is not deployed.
    """
    return publishes_maps(ctx)


def balancer_objects(ctx: Context) -> list[K8sObject]:
    """Nothing when no decode instance is expert-parallel, or when the engine balances itself (:func:`has_role`)."""
    if not balanced_instances(ctx) or not has_role(ctx):
        return []
    port = ctx.plan.config["ports"]["balancer_metrics"]
    selector = {LABEL_COMPONENT: COMPONENT, "app.kubernetes.io/name": BALANCER_NAME}
    container = controller_container(
        ctx, "balancer", balancer_command(ctx), port,
        env=[simulator_admin_token_env()] if simulator_admin_token(ctx) else (),
        requests=("500m", "1Gi"), memory_limit="4Gi", liveness=(30, 4))
    # the only pod with a token: it reads and updates the expert-map ConfigMap (role_rules)
    pod_spec = controller_pod_spec(ctx, BALANCER_NAME, container)
    secret = simulator_admin_secret(ctx)
    return [
        *([secret] if secret else []),
        service_account(ctx, BALANCER_NAME, COMPONENT, selector),
        *role_with_binding(ctx, BALANCER_NAME, COMPONENT, selector, role_rules(ctx)),
        # created empty; the balancer owns its content (Pulumi ignores later changes of `data`)
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(ctx, EXPERT_MAP_CONFIGMAP, COMPONENT, selector),
         "data": {EXPERT_MAP_KEY: ""}},
        single_deployment(ctx, BALANCER_NAME, COMPONENT, selector, pod_spec),
        metrics_service(ctx, BALANCER_NAME, COMPONENT, selector, port),
    ]
