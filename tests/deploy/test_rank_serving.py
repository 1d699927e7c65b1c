"""serving: rank on Kubernetes: a2-staging and cm384-prod with ``serving: rank`` run under the mock runtime; every
object validates (kubernetes-validate, the LWS CRD schema), each DP rank's launch line carries its
``--data-parallel-rank`` and port, and the ports of the LeaderWorkerSets, the Services and the proxy's instances
file agree with ``Plan.endpoints()`` (docs/rank-serving.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ascend_runtime.engine.surface import load_surface
from ascend_runtime.planner import Plan, load_plan
from ascend_runtime.render.launch import rank_servers
from ascend_runtime.render.objects.engine import launch_configmap_name, rank_service_name, worker_script_name
from ascend_runtime.render.shell import quote
from tests.stack_copies import edited_stacks

from .harness import Run, run_stack
from .pods import lws_templates
from .test_program_objects import validate_object

STACKS = ("a2-staging", "cm384-prod")
NS = "ascend-deepseek:"


@pytest.fixture(scope="module", params=STACKS)
def rank_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Plan]:
    stack = request.param
    stacks = edited_stacks(tmp_path_factory.mktemp(stack), stack, lambda cfg: cfg.__setitem__(NS + "serving", "rank"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ASCEND_DEPLOY_STACKS", str(stacks))
        run = run_stack(stack)
    assert run.error is None, run.error
    plan = load_plan(stack, Path(stacks))
    assert all(i.serving == "rank" for i in plan.instances)
    return run, plan


def _objs(run: Run, kind: str) -> list[dict[str, Any]]:
    return [o for o in run.k8s_objects if o["kind"] == kind]


def test_every_object_validates(rank_run: tuple[Run, Plan]) -> None:
    run, plan = rank_run
    version = plan.config["kubernetes"]["version"]
    for obj in run.k8s_objects:
        validate_object(obj, version)
    assert _objs(run, "LeaderWorkerSet")


def test_each_rank_launch_line_carries_its_rank_and_port(rank_run: tuple[Run, Plan]) -> None:
    run, plan = rank_run
    maps = {o["metadata"]["name"]: o["data"] for o in _objs(run, "ConfigMap")}
    flags = set(load_surface(plan.vllm_ascend_version).serve_flags)
    for inst in plan.instances:
        data = maps[launch_configmap_name(inst)]
        for rank in inst.ranks:
            script = data[f"{rank.name}.sh"] if rank.is_leader or len(inst.ranks) == 1 else data[worker_script_name(inst)]
            assert "--headless" not in script and "--data-parallel-size-local" not in script
            assert "--data-parallel-start-rank" not in script and "--api-server-count" not in script
            assert "\n    --data-parallel-rank\n    \"$dp_rank\"\n" in script and "\n    --port\n    \"$api_port\"\n" in script
            assert f"readonly API_PORTS=({' '.join(map(str, rank.api_ports))})\n" in script
            if rank.is_leader:
                assert f"readonly DP_START_RANK={rank.dp_start_rank}\n" in script
            for dp_rank, port, devices, argv in rank_servers(plan, rank):
                assert argv[argv.index("--data-parallel-rank") + 1] == str(dp_rank)
                assert argv[argv.index("--port") + 1] == str(port)
                assert argv[argv.index("--data-parallel-size") + 1] == str(inst.dp)
                assert argv[argv.index("--data-parallel-address") + 1] == inst.api_host
                assert argv[argv.index("--data-parallel-rpc-port") + 1] == str(inst.dp_rpc_port)
                assert len(devices) == inst.tp
                assert {a for a in argv if a.startswith("--")} <= flags
                kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
                assert kv["engine_id"] == f"{plan.stack}-{inst.name}-dp{dp_rank}" and kv["kv_port"] == str(rank.kv_port)
                # every other word of the rank's argv is in the script as quoted
                for word in argv[3:]:
                    if word not in (str(dp_rank), str(port)) and "engine_id" not in word:
                        assert quote(word) in script, word


def test_ports_agree_with_plan_endpoints(rank_run: tuple[Run, Plan]) -> None:
    run, plan = rank_run
    endpoints = plan.endpoints()
    assert len(endpoints) == sum(i.dp for i in plan.instances)
    # the proxy's instances file
    cm = next(o for o in _objs(run, "ConfigMap") if o["metadata"]["name"].endswith("-instances") and
              "instances.yaml" in o["data"])
    listed = yaml.safe_load(cm["data"]["instances.yaml"])["instances"]
    assert [{k: e[k] for k in ("name", "role", "url", "instance")} for e in listed] == endpoints
    by_url = {(e["instance"], int(e["url"].rsplit(":", 1)[1]), e["url"].split("//")[1].rsplit(":", 1)[0])
              for e in endpoints}
    services = {o["metadata"]["name"]: o for o in _objs(run, "Service")}
    lws = {o["metadata"]["name"]: o for o in _objs(run, "LeaderWorkerSet")}
    deployments = {o["metadata"]["name"]: o for o in _objs(run, "Deployment")}
    seen = set()
    for inst in plan.instances:
        for rank in inst.ranks:
            service_ports = [p["port"] for p in services[rank_service_name(inst, rank)]["spec"]["ports"]]
            assert service_ports == list(rank.api_ports)
            if inst.name in lws:
                leader, worker = lws_templates(lws[inst.name])
                template = leader if rank.is_leader else worker
            else:
                template = deployments[rank.name]["spec"]["template"]
            container = template["spec"]["containers"][0]
            assert [p["containerPort"] for p in container["ports"]] == list(rank.api_ports)
            assert all(len(p["name"]) <= 15 for p in container["ports"])
            probe = container["readinessProbe"]
            checked = ([probe["httpGet"]["port"]] if "httpGet" in probe else
                       [int(m) for m in re.findall(r"^http://127\.0\.0\.1:(\d+)/health$", " ".join(probe["exec"]["command"][4:]).replace(" ", "\n"), re.M)])
            assert checked == list(rank.api_ports)  # readiness covers every rank the pod serves
            seen |= {(inst.name, port, rank.host_ip) for port in rank.api_ports}
    assert seen == by_url
    # the proxy may reach every rank port (NetworkPolicy)
    egress = next(o for o in _objs(run, "NetworkPolicy") if o["metadata"]["name"] == "proxy-egress")
    allowed = {p["port"] for rule in egress["spec"]["egress"] for p in rule.get("ports", [])}
    assert {port for _, port, _ in by_url} <= allowed
