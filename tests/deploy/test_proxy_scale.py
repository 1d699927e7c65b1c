"""The PD proxy scaled out: replicas and cores from the Plan's sizing, one Service, a PDB and a topology spread."""

from __future__ import annotations

import kubernetes_validate
import pytest

from ascend_runtime.perf import proxy_capacity as capacity
from ascend_runtime.planner import load_plan
from ascend_runtime.planner.proxy_sizing import MAX_WORKERS_PER_REPLICA, size_proxy

from .conftest import K8S_STACKS, stack_run


def _objects(stack: str) -> dict[str, dict]:
    run = stack_run(stack)
    return {o["kind"]: o for o in run.k8s_objects
            if o["metadata"]["name"] == "pd-proxy" and o["kind"] in ("Deployment", "Service", "PodDisruptionBudget")}


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_proxy_replicas_pdb_and_spread_validate_and_follow_the_plan(stack: str) -> None:
    plan = load_plan(stack)
    objs = _objects(stack)
    dep, svc, pdb = objs["Deployment"], objs["Service"], objs["PodDisruptionBudget"]
    version = plan.config["kubernetes"]["version"]
    for obj in (dep, svc, pdb):
        kubernetes_validate.validate(obj, version, strict=True)
    selector = dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"] == selector and pdb["spec"]["selector"]["matchLabels"] == selector
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 1
    pod = dep["spec"]["template"]["spec"]
    keys = {c["topologyKey"] for c in pod["topologySpreadConstraints"]}
    assert keys == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    assert all(c["labelSelector"]["matchLabels"] == selector for c in pod["topologySpreadConstraints"])
    cpu = pod["containers"][0]["resources"]["requests"]["cpu"]
    if plan.config["target"] == "kind":  # simulated: the configured replicas, one core each
        assert dep["spec"]["replicas"] == plan.config["kubernetes"]["proxy_replicas"] and cpu == "1"
    else:
        sizing = plan.proxy
        assert dep["spec"]["replicas"] == sizing.replicas >= 2
        assert cpu == str(sizing.workers_per_replica)
        command = pod["containers"][0]["command"]
        if sizing.workers_per_replica > 1:
            assert command[command.index("--workers") + 1] == str(sizing.workers_per_replica)
        else:
            assert "--workers" not in command
        assert (sizing.replicas - 1) * sizing.workers_per_replica >= sizing.workers  # one replica may be down


def test_sizing_follows_the_token_rate_and_the_relay_cost() -> None:
    plan = load_plan("cm384-prod")
    base = size_proxy(plan)
    assert base.workers == capacity.workers_needed(base.tokens_per_s)
    assert base.tokens_per_s <= base.capacity_tokens_per_s
    assert base.workers_per_replica <= MAX_WORKERS_PER_REPLICA
    # no expected request rate: sized for what the decode instances can emit
    cfg = {**plan.config, "slo": {**plan.config["slo"], "expected_request_rate": None}}
    from dataclasses import replace

    cap_plan = size_proxy(replace(plan, config=cfg))
    assert cap_plan.demand_tokens_per_s is None and cap_plan.tokens_per_s == base.capacity_tokens_per_s
    assert cap_plan.workers >= base.workers
    # ten times the rate (still under capacity) needs more workers
    rate = plan.config["slo"]["expected_request_rate"]
    tiny = size_proxy(replace(plan, config={**plan.config, "slo": {**plan.config["slo"],
                                                                   "expected_request_rate": rate / 100}}))
    assert tiny.workers < base.workers and tiny.replicas == max(2, plan.config["kubernetes"]["proxy_replicas"])
