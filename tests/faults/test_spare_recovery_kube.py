"""Recovery onto spares on Kubernetes: a cm384 decode node's NPU fault moves its instance's LeaderWorkerSet.

A copy of cm384-prod with one spare node per super pod and ``spares: {decode: 1}`` goes through the Pulumi
program under the mock runtime (tests/deploy/harness.py) with the proxy admin token set. What the
FaultWatcher component registers is the input: the watcher's ConfigMap (topology and the stack as data), its
RBAC, its Deployment's command. Then, against FakeCluster (one fake API server speaking the real JSON of
GET, JSON patch and merge patch, holding the registered engine objects and the watcher's RBAC bindings), the
watcher runs as its pod runs it (that command, pointed at the fake API and an in-process proxy replica), and
the device plugin's ConfigMap of a decode node reports an unhealthy NPU. The watcher drains the instance,
patches its ConfigMaps and LeaderWorkerSet to the spare (checked by the fake against the pinned LWS v0.10.0
CRD schema and kubernetes-validate), cordons the node and posts an Event; nothing outside its RBAC is asked.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from ascend_runtime.planner import load_plan
from ascend_runtime.planner.plan import Plan
from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import specs_from_data
from ascend_runtime.proxy.server import ProxyHandle, start_proxy
from ascend_runtime.render.objects.fault_spares import STACK_KEY
from ascend_runtime.render.objects.faults import NAME, PROXY_ADMIN_SECRET, TOPOLOGY_CONFIGMAP, TOPOLOGY_KEY
from tests.deploy.harness import PROJECT, run_stack, unpinned
from tests.deploy.test_program_objects import validate_object
from tests.spare_nodes import cm384_spares

from .fake_cluster import FakeCluster

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "proxy-admin-t0ken-value"
KUBE_TOKEN = "watcher-service-account-token"
NAMESPACE = "deepseek"


def spare_stacks(tmp: Path) -> Path:
    """cm384-prod with ``cm384-sp0-spare1`` and ``cm384-sp1-spare1`` and ``spares: {decode: 1}``."""
    stacks = tmp / "stacks"
    shutil.copytree(ROOT / "stacks", stacks)
    inv_file = stacks / "inventories" / "cm384-prod.yaml"
    inv = yaml.safe_load(inv_file.read_text())
    cm384_spares(inv)
    inv_file.write_text(yaml.safe_dump(inv, sort_keys=False))
    stack_file = stacks / "Pulumi.cm384-prod.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["ascend-deepseek:spares"] = {"decode": 1}
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    return stacks


@dataclass
class Registered:
    """What the program registered for the copy: its Plan and its objects (image references unpinned)."""

    plan: Plan
    objects: list[dict[str, Any]]

    def one(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        (obj,) = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name
                  and (namespace is None or o["metadata"].get("namespace") == namespace)]
        return obj


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> Registered:
    stacks = spare_stacks(tmp_path_factory.mktemp("cm384-spares"))
    old = os.environ.get("ASCEND_DEPLOY_STACKS")
    os.environ["ASCEND_DEPLOY_STACKS"] = str(stacks)
    try:
        key = f"{PROJECT}:{PROXY_ADMIN_SECRET}"
        run = run_stack("cm384-prod", {key: TOKEN}, secret_keys=[key])
        assert run.error is None, run.error
        plan = load_plan("cm384-prod")
        return Registered(plan, unpinned(run.k8s_objects, plan))
    finally:
        if old is None:
            os.environ.pop("ASCEND_DEPLOY_STACKS", None)
        else:
            os.environ["ASCEND_DEPLOY_STACKS"] = old


def test_the_program_registers_what_the_recovery_needs_and_it_validates(registered: Registered) -> None:
    objs, version = registered, registered.plan.config["kubernetes"]["version"]
    topology = objs.one("ConfigMap", TOPOLOGY_CONFIGMAP)
    assert json.loads(topology["data"][STACK_KEY])["inventory"]["nodes"][-1]["name"] == "cm384-sp1-spare1"
    command = objs.one("Deployment", NAME)["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--stack-data" in command
    cluster_role = objs.one("ClusterRole", f"{NAME}-{NAMESPACE}")
    patch_nodes = [r for r in cluster_role["rules"] if "patch" in r["verbs"]]
    assert patch_nodes == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"],
                            "resourceNames": [n.name for n in registered.plan.nodes]}]
    role = objs.one("Role", NAME, NAMESPACE)
    by_resource = {r["resources"][0]: r for r in role["rules"]}
    assert "decode-0" in by_resource["leaderworkersets"]["resourceNames"]
    assert "prefill-0-rank0" in by_resource["deployments"]["resourceNames"]
    assert {"decode-0-launch", "pd-proxy-instances"} <= set(by_resource["configmaps"]["resourceNames"])
    assert all(set(r["verbs"]) <= {"get", "patch", "list"} for r in role["rules"])
    for obj in (topology, cluster_role, role, objs.one("Deployment", NAME)):
        validate_object(obj, version)
    spares = {"192.0.2.201", "192.0.2.211"}  # where a decode leader may move: the policies towards leaders allow it
    for policy in (o for o in objs.objects if o["kind"] == "NetworkPolicy"):
        validate_object(policy, version)
    egress = objs.one("NetworkPolicy", "proxy-egress")["spec"]["egress"]
    decode_rule = next(r for r in egress if any(p["port"] == registered.plan.instance("decode-0").api_port
                                                for p in r.get("ports", [])))
    assert spares <= {b["ipBlock"]["cidr"].split("/")[0] for b in decode_rule["to"] if "ipBlock" in b}


@dataclass
class Cluster:
    """The fake API server, the proxy replica and the watcher process."""

    fake: FakeCluster
    proxy: ProxyHandle
    watcher: asyncio.subprocess.Process
    log: Path


def _watch_argv(registered: Registered, directory: Path, api: str, proxy: str) -> list[str]:
    """The watcher pod's command, its ConfigMap at ``directory``, the fake API and the proxy by URL, fast cycles."""
    command = registered.one("Deployment", NAME)["spec"]["template"]["spec"]["containers"][0]["command"]
    argv, skip = [], False
    for k, word in enumerate(command[1:]):
        if skip:
            skip = False
            continue
        if word in ("--proxy-service", "--metrics-host", "--metrics-port"):
            skip = True
            continue
        argv.append(word.replace("/etc/ascend-deploy/faults", str(directory)))
    return [sys.executable, "-m", "ascend_runtime", *argv, "--proxy", proxy, "--kube-api", api,
            "--kube-token-env", "KUBE_TOKEN", "--interval", "0.1", "--node-interval", "0.1", "--settle", "0",
            "--recheck", "0.3", "--check-timeout", "1", "--spare-ready-timeout", "30"]


@pytest_asyncio.fixture
async def cluster(registered: Registered, tmp_path: Path) -> AsyncIterator[Cluster]:
    plan = registered.plan
    fake = FakeCluster(token=KUBE_TOKEN)
    for node in plan.nodes:
        fake.add_node(node.name)
    for obj in registered.objects:
        if obj["kind"] in ("LeaderWorkerSet", "Deployment") and obj["metadata"]["name"] != NAME and \
                obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "engine":
            fake.add_object(obj)
        elif obj["kind"] == "ConfigMap" and obj["metadata"].get("namespace") == NAMESPACE:
            fake.add_object(obj)
    roles = [o for o in registered.objects if o["kind"] == "Role" and o["metadata"]["name"].startswith(NAME)]
    cluster_role = registered.one("ClusterRole", f"{NAME}-{NAMESPACE}")
    fake.bind(cluster_role["rules"], [], NAMESPACE,
              other_roles=tuple((r["rules"], r["metadata"]["namespace"]) for r in roles))
    await fake.start()
    topology = registered.one("ConfigMap", TOPOLOGY_CONFIGMAP)
    (tmp_path / TOPOLOGY_KEY).write_text(topology["data"][TOPOLOGY_KEY])
    (tmp_path / STACK_KEY).write_text(topology["data"][STACK_KEY])
    specs = specs_from_data(plan.endpoints())
    proxy = await start_proxy(ProxyConfig(port=0, instances=specs, admin_token=TOKEN, health_interval_s=0))
    log = tmp_path / "watcher.log"
    env = {**os.environ, "ASCEND_PROXY_TOKEN": TOKEN, "KUBE_TOKEN": KUBE_TOKEN}
    env.pop("ASCEND_DEPLOY_STACKS", None)  # the pod has no stack files: everything comes from its ConfigMap
    with log.open("w") as out:
        watcher = await asyncio.create_subprocess_exec(*_watch_argv(registered, tmp_path, fake.url, proxy.url),
                                                       stdout=out, stderr=out, env=env, cwd=str(ROOT))
    try:
        yield Cluster(fake, proxy, watcher, log)
    finally:
        if watcher.returncode is None:
            watcher.terminate()
            await asyncio.wait_for(watcher.wait(), 20)
        await proxy.stop()
        await fake.stop()


async def _until(cluster: Cluster, what: str, check: Any, timeout: float = 240.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert cluster.watcher.returncode is None, f"the watcher exited: {cluster.log.read_text()[-3000:]}"
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; watcher log:\n{cluster.log.read_text()[-4000:]}")
        await asyncio.sleep(0.1)


def _worker_nodes(lws: dict[str, Any]) -> list[str]:
    affinity = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["affinity"]["nodeAffinity"]
    return affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]


def _leader_node(lws: dict[str, Any]) -> str:
    return lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["nodeSelector"]["kubernetes.io/hostname"]


async def test_a_decode_worker_node_npu_fault_moves_the_lws_workers_to_the_spare(cluster: Cluster) -> None:
    fake = cluster.fake
    before = json.loads(json.dumps(fake.workloads.get("LeaderWorkerSet", "decode-0")))
    assert _worker_nodes(before) == ["cm384-sp0-node10", "cm384-sp0-node11", "cm384-sp0-node12"]
    await _until(cluster, "the watcher's first cycles", lambda: any(p.endswith("/nodes/cm384-sp0-node10")
                                                                    for _, p, _ in fake.requests))
    fake.set_device_info("cm384-sp0-node10", unhealthy=("Ascend910-3",))
    await _until(cluster, "the LeaderWorkerSet patch", lambda: any(k == "LeaderWorkerSet" for k, _, _ in fake.patched))
    await _until(cluster, "the cordon", lambda: any(k == "Node" for k, _, _ in fake.patched))
    lws = fake.workloads.get("LeaderWorkerSet", "decode-0")
    assert _worker_nodes(lws) == ["cm384-sp0-spare1", "cm384-sp0-node11", "cm384-sp0-node12"]
    assert _leader_node(lws) == _leader_node(before) == "cm384-sp0-node09"
    assert lws["metadata"]["generation"] == 2, "one patch: the controller replaces the group once"
    kinds = [(k, n) for k, n, _ in fake.patched]
    assert kinds.index(("ConfigMap", "decode-0-launch")) < kinds.index(("LeaderWorkerSet", "decode-0")), \
        "the new scripts are in place before the group is recreated"
    assert ("ConfigMap", "pd-proxy-instances") not in kinds, "the leader did not move: its URL neither"
    ops = next(o for k, _, o in fake.patched if k == "LeaderWorkerSet")
    assert ops[0]["op"] == "test" and ops[0]["path"] == "/metadata/resourceVersion"
    assert {"op": "replace", "value": "cm384-sp0-spare1",
            "path": "/spec/leaderWorkerTemplate/workerTemplate/spec/affinity/nodeAffinity/"
                    "requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchExpressions/0/values/0"} \
        in ops
    node = fake.nodes["cm384-sp0-node10"]
    assert node["spec"]["unschedulable"] is True
    note = json.loads(node["metadata"]["annotations"]["ascend-deepseek/out-of-service"])
    assert note["instances"] == {"decode-0": ["cm384-sp0-spare1"]}
    await _until(cluster, "the Event", lambda: any(e["reason"] == "AscendInstanceMovedToSpare" for e in fake.events))
    assert cluster.proxy.pool.get("decode-0").draining, "no engine answers here: it stays drained"
    assert not [d for d in fake.denied if d[0] == "patch"], fake.denied
    assert not fake.workloads.rejected and not fake.rejected_events


async def test_a_decode_leader_node_fault_moves_the_leader_and_the_proxy_learns_its_url(cluster: Cluster) -> None:
    fake = cluster.fake
    await _until(cluster, "the watcher's first cycles", lambda: any(p.endswith("/nodes/cm384-sp1-node05")
                                                                    for _, p, _ in fake.requests))
    fake.set_ready("cm384-sp1-node05", "Unknown")  # decode-2's leader node stops reporting
    await _until(cluster, "the LeaderWorkerSet patch", lambda: any(n == "decode-2" for _, n, _ in fake.patched))
    lws = fake.workloads.get("LeaderWorkerSet", "decode-2")
    assert _leader_node(lws) == "cm384-sp1-spare1"
    assert _worker_nodes(lws) == ["cm384-sp1-node06", "cm384-sp1-node07", "cm384-sp1-node08"]
    env = {e["name"]: e.get("value") for e in lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
           ["containers"][0]["env"]}
    assert env["HCCL_IF_IP"] == "192.0.2.211"
    instances = yaml.safe_load(fake.configmaps[(NAMESPACE, "pd-proxy-instances")]["data"]["instances.yaml"])
    url = next(i["url"] for i in instances["instances"] if i["name"] == "decode-2")
    assert url.startswith("http://192.0.2.211:")
    await _until(cluster, "the proxy told", lambda: cluster.proxy.pool.get("decode-2").spec.url == url)
    assert cluster.proxy.pool.get("decode-2").draining
