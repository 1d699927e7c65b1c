"""Multi-node engine instances as LeaderWorkerSets (kubernetes-sigs/lws, pinned release in objects/lws.py).

* one LeaderWorkerSet per multi-node instance: size = its nodes, one group, the whole group recreated
  on any restart, workers created with the leader; single-node instances stay Deployments;
* no leader watcher where the controller restarts the group;
* every LeaderWorkerSet fits the pinned CRD's published schema (tests/deploy/crds/);
* one pod of a group per node, the group exactly on the Plan's nodes (and inside one super pod);
* the one worker script, run under bash for every worker index on every planned worker node, starts
  the engine with exactly the Plan's argv of that index and the Plan's values of that node;
* the kind simulators still run (the leader template's `ascend-deploy sim` argv is the instance's);
* the program checks the LWS CRD, or applies the pinned release manifest with ``kubernetes.lws.install``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from ascend_runtime.cli.commands import sim as sim_cli
from ascend_runtime.planner import Plan, load_plan
from ascend_runtime.render.engine_args import engine_command
from ascend_runtime.render.environment import rank_env
from ascend_runtime.render.launch import (
    WORKER_NODE_ENV,
    WorkerTemplateError,
    worker_argv,
    worker_launch_script,
    worker_script_name,
)
from ascend_runtime.render.objects.cluster import SUPER_POD_LABEL, lws_prerequisite
from ascend_runtime.render.objects.common import Context
from ascend_runtime.render.objects.engine import instance_objects, simulator_command
from ascend_runtime.render.objects.lws import (
    ENV_GROUP_SIZE,
    ENV_WORKER_INDEX,
    RELEASE,
    SET_NAME_LABEL,
    WORKER_INDEX_LABEL,
)
from ascend_runtime.perf.from_plan import sim_config_from_plan
from ascend_runtime.render.paths import LEADER_WATCH
from tests.render.test_injection import STUB_TIMEOUT  # coreutils `timeout` stand-in: records the DP-port probe

from .conftest import K8S_STACKS, stack_run
from .crd_schemas import LWS_SCHEMA_FILE, lws_schema_from_crd, validate_lws
from .harness import ROOT, Run, pinned_runtime_image, run_stack
from .pods import lws_templates

MIRROR = Path(os.environ.get("LWS_MIRROR") or Path(os.environ.get("UPSTREAM_MIRRORS", "/nonexistent")) / "kubernetes-sigs+lws" / "repo")
STUB_VLLM = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$STUB_OUT/argv"
env -0 > "$STUB_OUT/env"
"""


def _lws(run: Run) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in run.k8s_objects if o["kind"] == "LeaderWorkerSet"}


def _engine_deployments(run: Run) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in run.k8s_objects if o["kind"] == "Deployment"
            and o["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"}


def _launch(run: Run, inst: str) -> dict[str, str]:
    (cm,) = [o for o in run.k8s_objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == f"{inst}-launch"]
    return cm["data"]


def _stacks_copy(tmp_path: Path, stack: str, edit) -> Path:
    target = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", target)
    path = target / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text())
    edit(doc["config"])
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


# --- the objects -------------------------------------------------------------------------------------


def test_one_lws_per_multi_node_instance(k8s_run: Run) -> None:
    plan = load_plan(k8s_run.stack)
    sets, deployments = _lws(k8s_run), _engine_deployments(k8s_run)
    assert plan.kv_connector == "mooncake"  # every committed stack: no rank table, so LWS for multi-node
    for inst in plan.instances:
        if len(inst.ranks) == 1:
            assert inst.name not in sets and set(deployments) >= {f"{inst.name}-rank0"}
            continue
        lws = sets[inst.name]
        spec = lws["spec"]
        group = spec["leaderWorkerTemplate"]
        assert spec["replicas"] == 1 and group["size"] == len(inst.ranks) == len(inst.nodes)
        assert group["restartPolicy"] == "RecreateGroupOnPodRestart"
        # vLLM's leader is Ready only after every headless engine joined: LeaderReady would never start them
        assert spec["startupPolicy"] == "LeaderCreated"
        assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxUnavailable": 1, "maxSurge": 0}
        assert not [d for d in deployments if d.startswith(f"{inst.name}-rank")]  # no per-rank workload left
        ann = lws["metadata"]["annotations"]
        assert ann["pulumi.com/waitFor"] == "jsonpath={.status.readyReplicas}=1"
        assert int(ann["pulumi.com/timeoutSeconds"]) > plan.config["kubernetes"]["startup_probe_seconds"]
        assert not any(k.startswith("leaderworkerset.sigs.k8s.io/") for k in ann)  # no exclusive-topology (engine.py)
        leader, worker = lws_templates(lws)
        assert leader["metadata"]["labels"]["ascend-deepseek/leader"] == "true"
        assert leader["metadata"]["labels"]["ascend-deepseek/rank"] == "0"
        assert worker["metadata"]["labels"]["ascend-deepseek/leader"] == "false"
        assert "ascend-deepseek/rank" not in worker["metadata"]["labels"]  # LWS labels the worker index
        # the API Service and the PodMonitor still find the leader pod
        (svc,) = [o for o in k8s_run.k8s_objects if o["kind"] == "Service" and o["metadata"]["name"] == f"{inst.name}-api"]
        assert svc["spec"]["selector"].items() <= leader["metadata"]["labels"].items()
        assert not svc["spec"]["selector"].items() <= worker["metadata"]["labels"].items()
    assert len(sets) == sum(1 for i in plan.instances if len(i.ranks) > 1) > 0


def test_no_leader_watcher_where_lws_restarts_the_group(k8s_run: Run) -> None:
    plan = load_plan(k8s_run.stack)
    assert len(_lws(k8s_run)) == sum(1 for i in plan.instances if len(i.ranks) > 1) > 0
    for name, lws in _lws(k8s_run).items():
        inst = plan.instance(name)
        data = _launch(k8s_run, name)
        scripts = sorted(k for k in data if k.endswith(".sh"))
        assert scripts == sorted([f"{inst.ranks[0].name}.sh", worker_script_name(inst)])
        assert LEADER_WATCH not in data
        assert not any("watch_leader" in data[s] or "leader-watch" in data[s] for s in scripts)
        leader, worker = lws_templates(lws)
        (lc,), (wc,) = leader["spec"]["containers"], worker["spec"]["containers"]
        if plan.target == "kind":
            assert wc["command"] == ["sleep", "infinity"]
        else:
            assert lc["command"] == ["/bin/bash", f"/etc/ascend-deploy/launch/{inst.ranks[0].name}.sh"]
            assert wc["command"] == ["/bin/bash", f"/etc/ascend-deploy/launch/{worker_script_name(inst)}"]
        assert "livenessProbe" not in wc and "startupProbe" not in wc  # the group's restart is the controller's
        env = {e["name"]: e for e in wc["env"]}
        assert env[WORKER_NODE_ENV] == {"name": WORKER_NODE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def test_every_lws_fits_the_pinned_crd_schema(k8s_run: Run) -> None:
    sets = _lws(k8s_run)
    assert sets
    for lws in sets.values():
        validate_lws(lws)
    doc = json.loads(LWS_SCHEMA_FILE.read_text())
    assert doc["source"] == {"repository": "kubernetes-sigs/lws", "tag": RELEASE.tag, "commit": RELEASE.commit,
                             "path": RELEASE.crd_path}
    assert f"{doc['group']}/{doc['version']}" == RELEASE.api_version and doc["kind"] == RELEASE.kind


def _git(*args: str) -> str:
    return subprocess.run(["git", f"--git-dir={MIRROR}", *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no kubernetes-sigs/lws mirror on this machine")
def test_pinned_release_matches_upstream() -> None:
    """The pin is the tag's commit, the committed schema is that commit's CRD, the names are its API's."""
    assert _git("rev-parse", f"{RELEASE.tag}^{{commit}}").strip() == RELEASE.commit
    crd = yaml.safe_load(_git("show", f"{RELEASE.commit}:{RELEASE.crd_path}"))
    assert crd["metadata"]["name"] == RELEASE.crd_name
    assert json.loads(LWS_SCHEMA_FILE.read_text())["openAPIV3Schema"] == lws_schema_from_crd(crd)
    types = _git("show", f"{RELEASE.commit}:api/leaderworkerset/v1/leaderworkerset_types.go")
    for name in (SET_NAME_LABEL, WORKER_INDEX_LABEL, ENV_WORKER_INDEX, ENV_GROUP_SIZE, "RecreateGroupOnPodRestart",
                 "LeaderCreated", "LeaderReady"):
        assert f'"{name}"' in types, name
    pod_utils = _git("show", f"{RELEASE.commit}:pkg/utils/pod/pod_utils.go")
    assert "leaderworkerset.LwsWorkerIndex" in pod_utils and "leaderworkerset.WorkerIndexLabelKey" in pod_utils
    install = _git("show", f"{RELEASE.commit}:site/content/en/docs/installation/_index.md")
    assert f"VERSION={RELEASE.tag}" in install and "releases/download/$VERSION/manifests.yaml" in install
    assert RELEASE.manifest_url == f"https://github.com/kubernetes-sigs/lws/releases/download/{RELEASE.tag}/manifests.yaml"


def test_pods_exclusive_per_node_and_on_the_plans_nodes(k8s_run: Run) -> None:
    plan = load_plan(k8s_run.stack)
    labels = {o["metadata"]["name"]: o["metadata"]["labels"] for o in k8s_run.k8s_objects if o["kind"] == "Node"}
    pods_of = {n.name: n.super_pod_id for n in plan.nodes}
    taken: dict[str, str] = {}
    assert _lws(k8s_run)
    for name, lws in _lws(k8s_run).items():
        inst = plan.instance(name)
        leader, worker = lws_templates(lws)
        assert leader["spec"]["nodeSelector"] == {"kubernetes.io/hostname": inst.ranks[0].node}
        for template in (leader, worker):
            (anti,) = template["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            assert anti == {"labelSelector": {"matchLabels": {SET_NAME_LABEL: name}}, "topologyKey": "kubernetes.io/hostname"}
        (term,) = worker["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        (expr,) = term["matchExpressions"]
        allowed = expr["values"]
        assert expr["key"] == "kubernetes.io/hostname" and expr["operator"] == "In"
        # size - 1 workers, one per node, on exactly size - 1 allowed nodes other than the leader's:
        # the group occupies exactly the instance's planned nodes
        assert len(allowed) == len(set(allowed)) == lws["spec"]["leaderWorkerTemplate"]["size"] - 1
        assert inst.ranks[0].node not in allowed and {inst.ranks[0].node, *allowed} == set(inst.nodes)
        for node in inst.nodes:
            assert taken.setdefault(node, name) == name, f"{node} is planned for {taken[node]} and {name}"
        affinity = worker["spec"]["affinity"].get("podAffinity")
        if inst.super_pod_id is None:
            assert affinity is None and plan.hardware != "cm384"
        else:
            (term,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
            assert term == {"labelSelector": {"matchLabels": {SET_NAME_LABEL: name, WORKER_INDEX_LABEL: "0"}},
                            "topologyKey": SUPER_POD_LABEL}
            # the nodes the workers may take are in the leader's super pod by the inventory, and the label the
            # affinity keys on is the device plugin's: the kit never writes it (deploy/node_labels.py checks it)
            assert {pods_of[n] for n in inst.nodes} == {inst.super_pod_id}
            assert not any(SUPER_POD_LABEL in labels[n] for n in inst.nodes)
    if plan.hardware == "cm384":
        assert any(plan.instance(n).super_pod_id is not None for n in _lws(k8s_run))


# --- the worker script under bash --------------------------------------------------------------------


def _run_worker(script: str, tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    out = run_dir / "out"
    out.mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for name, text in (("vllm", STUB_VLLM), ("timeout", STUB_TIMEOUT)):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
    (run_dir / "worker.sh").write_text(script)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("ASCEND_DEPLOY_", "LWS_"))}
    full = {**base, "PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(out), "ASCEND_DEPLOY_CHECK_FILES": "0", **env}
    result = subprocess.run(["bash", str(run_dir / "worker.sh")], cwd=run_dir, env=full, capture_output=True, check=False,
                            text=True, timeout=60)
    return result, out


def _read(out: Path) -> tuple[list[str], dict[str, str]]:
    argv = (out / "argv").read_text().split("\0")[:-1]
    env = dict(item.split("=", 1) for item in (out / "env").read_text().split("\0") if "=" in item)
    return ["vllm", *argv], env


NODE_KEYS = ("HCCL_IF_IP", "VLLM_HOST_IP", "HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "ASCEND_RT_VISIBLE_DEVICES")


def check_worker_script(plan: Plan, inst: Any, script: str, tmp_path: Path) -> int:
    """Run ``script`` for every worker index on every planned worker node; the engine must get the Plan's
    argv of that index (start rank index x dp_local, engine_id) and the Plan's values of that node."""
    runs = 0
    size = len(inst.ranks)
    for rank in inst.ranks[1:]:
        for node_rank in inst.ranks[1:]:  # the controller may place index k on any planned worker node
            result, out = _run_worker(script, tmp_path, {ENV_WORKER_INDEX: str(rank.index), ENV_GROUP_SIZE: str(size),
                                                         WORKER_NODE_ENV: node_rank.node})
            assert result.returncode == 0, (rank.name, node_rank.node, result.stderr)
            # the engine started after the wait for the leader's DP handshake port (--data-parallel-address/rpc-port)
            probe = (out / "probes").read_text().split("\0")
            assert probe[4:7] == ["dp-rpc", inst.api_host, str(inst.dp_rpc_port)], probe[:8]
            argv, env = _read(out)
            assert argv == engine_command(plan, rank), (rank.name, node_rank.node)
            assert argv[argv.index("--data-parallel-start-rank") + 1] == str(rank.dp_start_rank)
            assert rank.dp_start_rank == rank.index * rank.dp_local
            kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
            assert kv["engine_id"] == rank.engine_id
            want = {**rank_env(plan, rank), **{k: v for k, v in rank_env(plan, node_rank).items() if k in NODE_KEYS}}
            for key, value in want.items():
                assert env.get(key) == value, (rank.name, node_rank.node, key)
            assert env["HCCL_IF_IP"] == node_rank.host_ip
            runs += 1
    return runs


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_worker_start_rank_from_the_index_equals_the_plan(stack: str, tmp_path: Path) -> None:
    run, plan = stack_run(stack), load_plan(stack)
    runs = 0
    for name in _lws(run):
        inst = plan.instance(name)
        script = _launch(run, name)[worker_script_name(inst)]  # exactly what the pods mount
        runs += check_worker_script(plan, inst, script, tmp_path)
    assert runs == sum((len(i.ranks) - 1) ** 2 for i in plan.instances if len(i.ranks) > 1) > 0


def test_worker_script_refuses_a_foreign_index_size_or_node(tmp_path: Path) -> None:
    plan = load_plan("a2-staging")
    inst = plan.instance("decode-0")
    script = worker_launch_script(plan, inst)
    good = {ENV_WORKER_INDEX: "1", ENV_GROUP_SIZE: "4", WORKER_NODE_ENV: inst.ranks[1].node}
    assert _run_worker(script, tmp_path, good)[0].returncode == 0
    for index in ("", "0", "4", "01", "-1", "1;touch CANARY", "x", "99999999999999999999", " 1", "1\n"):
        result, out = _run_worker(script, tmp_path, {**good, ENV_WORKER_INDEX: index})
        assert result.returncode == 64 and not (out / "argv").exists(), index
    result, out = _run_worker(script, tmp_path, {**good, ENV_GROUP_SIZE: "3"})
    assert result.returncode == 64 and not (out / "argv").exists()
    for node in ("", inst.ranks[0].node, plan.instance("prefill-0").ranks[1].node, "a2-node-0*"):
        result, out = _run_worker(script, tmp_path, {**good, WORKER_NODE_ENV: node})
        assert result.returncode == 68 and not (out / "argv").exists(), node
    assert not list(tmp_path.rglob("CANARY*"))


def test_worker_script_takes_metacharacters_as_data(tmp_path: Path) -> None:
    """Node names, IPs and NICs reach the worker script's per-node table: they stay data."""
    plan = load_plan("a2-staging")
    inst = plan.instance("decode-0")

    def evil(tag: str) -> str:
        return f"{tag}$(touch CANARY-{tag})`touch CANARY-{tag}b`;touch CANARY-{tag}c;'\"\n*"

    ranks = (inst.ranks[0], *(replace(r, node=evil(f"n{r.index}"), host_ip=evil(f"ip{r.index}"), nic=evil(f"nic{r.index}"))
                              for r in inst.ranks[1:]))
    inst = replace(inst, ranks=ranks)
    plan = replace(plan, instances=tuple(inst if i.name == inst.name else i for i in plan.instances))
    script = worker_launch_script(plan, inst)
    assert check_worker_script(plan, inst, script, tmp_path) == (len(ranks) - 1) ** 2
    result, _ = _run_worker(script, tmp_path, {ENV_WORKER_INDEX: "1", ENV_GROUP_SIZE: "4", WORKER_NODE_ENV: "n1"})
    assert result.returncode == 68  # a pattern-looking name matches only itself
    assert not list(tmp_path.rglob("CANARY*"))


def test_worker_argv_is_checked_against_every_rank() -> None:
    """The template is refused when a headless rank's argv is not the template's for its index."""
    plan = load_plan("a2-staging")
    inst = plan.instance("decode-0")
    assert worker_argv(plan, inst)
    odd = replace(inst.ranks[2], dp_start_rank=inst.ranks[2].dp_start_rank + 1)
    broken = replace(inst, ranks=(*inst.ranks[:2], odd, *inst.ranks[3:]))
    plan = replace(plan, instances=tuple(broken if i.name == inst.name else i for i in plan.instances))
    with pytest.raises(WorkerTemplateError, match="decode-0-rank2"):
        worker_argv(plan, broken)


# --- kind: the simulators as LeaderWorkerSets ---------------------------------------------------------


def test_kind_simulators_run_as_leader_worker_sets() -> None:
    run, plan = stack_run("kind"), load_plan("kind")
    sets = _lws(run)
    assert set(sets) == {i.name for i in plan.instances}
    parser = argparse.ArgumentParser()
    sim_cli.register(parser.add_subparsers())
    for inst in plan.instances:
        leader, worker = lws_templates(sets[inst.name])
        (lc,), (wc,) = leader["spec"]["containers"], worker["spec"]["containers"]
        assert lc["command"] == simulator_command(Context(plan), inst, inst.ranks[0])
        assert lc["command"][:2] == ["ascend-deploy", "sim"]
        got = sim_cli.config_from_args(parser.parse_args(lc["command"][1:]))
        want = sim_config_from_plan(plan, inst, bind_host="0.0.0.0").model_copy(
            update={"kv_port": inst.ranks[0].kv_port, "kv_host": "$(POD_IP)"})
        assert got == want  # the instance's shape, ports and timing, as the simulator parses them
        assert lc["image"] == wc["image"] == pinned_runtime_image(plan)  # the kit's image, built by the stack
        assert "resources" in wc and plan.config["kubernetes"]["npu_resource"] not in json.dumps(wc["resources"])
        # the simulated worker holds its node and is Ready when the leader serves (through the API Service)
        assert wc["command"] == ["sleep", "infinity"]
        assert f"{inst.name}-api" in wc["readinessProbe"]["exec"]["command"][-1]


# --- the prerequisite ----------------------------------------------------------------------------------


def test_program_checks_the_lws_crd(k8s_run: Run) -> None:
    # besides the CRD, on A3 the Nodes whose super pod label it checks (deploy/node_labels.py)
    plan = load_plan(k8s_run.stack)
    nodes = [("kubernetes:core/v1:Node", n.name) for n in plan.nodes if n.super_pod_id is not None]
    assert sorted((r.typ, r.read_id) for r in k8s_run.reads) == sorted([
        ("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition", RELEASE.crd_name), *nodes])
    assert not [r for r in k8s_run.resources if r.typ.startswith("kubernetes:yaml")]


def test_lws_install_applies_the_pinned_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stacks = _stacks_copy(tmp_path, "kind", lambda c: c["ascend-deepseek:kubernetes"].update(lws={"install": True}))
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(stacks))
    run = run_stack("kind")
    assert run.error is None, run.error
    (config_file,) = [r for r in run.resources if r.typ == "kubernetes:yaml/v2:ConfigFile"]
    assert config_file.inputs["file"] == RELEASE.manifest_url and RELEASE.tag in RELEASE.manifest_url
    assert not run.reads and not config_file.is_k8s
    assert len(_lws(run)) == 2


def test_no_prerequisite_without_a_multi_node_instance() -> None:
    plan = load_plan("cm384-prod")
    single = replace(plan, instances=tuple(i for i in plan.instances if len(i.ranks) == 1))
    assert single.instances and lws_prerequisite(plan) == "check"
    assert lws_prerequisite(single) is None
    ctx = Context(single)
    assert not [o for i in single.instances for o in instance_objects(ctx, i) if o["kind"] == "LeaderWorkerSet"]
    assert lws_prerequisite(load_plan("local")) is None  # processes, no cluster


def test_llmdatadist_keeps_pinned_per_rank_deployments(tmp_path: Path) -> None:
    """A connector that reads a rank table keeps each rank on the node the table names."""
    stacks = _stacks_copy(tmp_path, "kind", lambda c: c["ascend-deepseek:engine"].update(
        vllm_ascend_version="0.11.0", kv_connector="llmdatadist"))
    plan = load_plan("kind", stacks)
    assert plan.kv_connector == "llmdatadist" and lws_prerequisite(plan) is None
    ctx = Context(plan)
    for inst in plan.instances:
        objs = instance_objects(ctx, inst)
        deps = [o for o in objs if o["kind"] == "Deployment"]
        assert [d["metadata"]["name"] for d in deps] == [r.name for r in inst.ranks]
        assert [d["spec"]["template"]["spec"]["nodeSelector"] for d in deps] == [
            {"kubernetes.io/hostname": r.node} for r in inst.ranks]
        (launch,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-launch")]
        assert LEADER_WATCH in launch["data"]  # its headless ranks still follow the leader themselves
        assert not [o for o in objs if o["kind"] == "LeaderWorkerSet"]
