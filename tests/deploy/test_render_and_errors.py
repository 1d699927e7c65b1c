"""render's manifests equal the registered objects; invalid stacks register nothing; secrets; ordering."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from ascend_runtime.deploy.components import ServingSystem, ServingSystemArgs
from ascend_runtime.planner import load_plan
from ascend_runtime.render.manifests import manifest_files
from ascend_runtime.render.objects import build_system
from ascend_runtime.render.objects.balancer import balancer_objects
from ascend_runtime.render.objects.common import Context, secret_placeholder

from .conftest import STACKS, stack_run
from .harness import PROJECT, ROOT, SECRET_SIG, RecordingMocks, run_stack, unpinned


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def _parse(files: dict[str, str]) -> list[dict[str, Any]]:
    return [doc for text in files.values() for doc in yaml.safe_load_all(text) if doc]


@pytest.mark.parametrize("stack", STACKS)
def test_render_manifests_equal_registered_objects(stack: str) -> None:
    # the one difference: pulumi up pins the runtime image build's digest, render writes its tag (docs/rendering.md)
    registered = {_key(o): o for o in unpinned(stack_run(stack).k8s_objects, load_plan(stack))}
    rendered = {_key(o): o for o in _parse(manifest_files(load_plan(stack)))}
    assert rendered.keys() == registered.keys()
    for key, obj in rendered.items():
        assert obj == registered[key], key


def test_render_cli_hook_writes_manifests(tmp_path: Path) -> None:
    """The render package's hook picks manifest_files up under manifests/."""
    from ascend_runtime.render.artifacts import extra_files

    files = extra_files(load_plan("kind"))
    assert files and all(p.startswith("manifests/") for p in files)
    assert len(_parse(files)) == len(stack_run("kind").k8s_objects)


def _broken_stacks(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    path = tmp_path / "stacks" / "Pulumi.kind.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["ascend-deepseek:decode"]["tp"] = 3  # dp x tp no longer fits the nodes
    path.write_text(yaml.safe_dump(doc))
    return tmp_path / "stacks"


def test_invalid_stack_registers_zero_resources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(_broken_stacks(tmp_path)))
    run = run_stack("kind")
    assert run.error is not None and type(run.error).__name__ == "ConfigError"
    assert len(run.resources) == 0
    assert run.exports == {}
    monkeypatch.delenv("ASCEND_DEPLOY_STACKS")
    assert len(run_stack("kind").resources) > 0  # the same harness does count resources


def test_local_stack_registers_no_kubernetes_objects() -> None:
    run = stack_run("local")
    assert run.k8s_objects == [] and run.exports["proxy_endpoint"].startswith("http://127.0.0.1")
    assert manifest_files(load_plan("local")) == {}


def test_secrets_only_through_pulumi_config() -> None:
    secret = "docker-config-that-must-not-leak"
    config = {f"{PROJECT}:image_pull_credentials": secret, f"{PROJECT}:model_source_credentials": "token-xyz"}
    run = run_stack("a2-staging", config, secret_keys=list(config))
    assert run.error is None
    objs = run.k8s_objects
    pull = next(o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == "image-pull-credentials")
    assert pull["stringData"][".dockerconfigjson"] == secret
    raw = next(r.inputs for r in run.resources if r.name == "deepseek/image-pull-credentials")
    assert SECRET_SIG in raw["stringData"], "the value stays a Pulumi secret"
    pods = [o["spec"]["template"]["spec"] for o in objs
            if o["kind"] in ("Deployment", "Job", "DaemonSet") and o["metadata"]["namespace"] == "deepseek"]
    assert pods and all(p.get("imagePullSecrets") == [{"name": "image-pull-credentials"}] for p in pods)
    files = manifest_files(load_plan("a2-staging"), secrets=["image_pull_credentials", "model_source_credentials"])
    text = "".join(files.values())
    assert secret not in text and "token-xyz" not in text
    assert secret_placeholder("image_pull_credentials") in text
    # the same objects apart from the secret values
    rendered = {_key(o): o for o in _parse(files)}
    registered = {_key(o): o for o in unpinned(objs, load_plan("a2-staging"))}
    assert rendered.keys() == registered.keys()
    for key in rendered:
        if key[1] != "Secret":
            assert rendered[key] == registered[key], key


def test_checks_job_depends_on_every_workload() -> None:
    plan = load_plan("a2-staging")
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack="a2-staging", preview=False)
    captured: dict[str, ServingSystem] = {}

    @pulumi.runtime.test
    def program() -> None:
        captured["system"] = ServingSystem("a2-staging", ServingSystemArgs(plan, build_system(plan)))

    program()
    system = captured["system"]
    assert system.checks is not None
    assert system.balancer is None  # vLLM-Ascend 0.23.0 balances experts in the engine: no daemon
    deps = system.checks.depends_on
    for component in [*system.engines.values(), system.proxy]:
        assert component in deps
        assert component.workloads
    assert len(system.engines) == len(plan.instances)
    # a2-staging: both instances span nodes, each is one LeaderWorkerSet (its whole group is the workload)
    assert [len(e.workloads) for e in system.engines.values()] == [1] * len(plan.instances)
    assert {w._type for e in system.engines.values() for w in e.workloads} == {
        "kubernetes:leaderworkerset.x-k8s.io/v1:LeaderWorkerSet"}
    # ...and they wait for the cluster preparation, which checks the LeaderWorkerSet CRD first
    assert system.cluster.lws is not None
    assert all(system.cluster in e.depends_on for e in system.engines.values())


def test_kind_cluster_template_matches_inventory() -> None:
    doc = yaml.safe_load((ROOT / "templates" / "kind-cluster.yaml").read_text())
    assert doc["kind"] == "Cluster" and doc["name"] == "ascend"
    workers = [n for n in doc["nodes"] if n["role"] == "worker"]
    assert len(workers) == 4
    inventory = yaml.safe_load((ROOT / "stacks" / "inventories" / "kind.yaml").read_text())
    names = [n["name"] for n in inventory["nodes"]]
    assert names == ["ascend-worker", "ascend-worker2", "ascend-worker3", "ascend-worker4"]
    for worker in workers:
        assert worker["labels"]["accelerator"] == "huawei-Ascend910"
        assert worker["labels"]["accelerator-type"] == "module-910b-8"


def test_dockerfile_provides_the_runtime_commands() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT' not in text or 'ascend-deploy' in text
    assert "pip install" in text and "USER 10001" in text
    assert json.dumps("ascend-deploy") in text or "ascend-deploy" in text


@pytest.mark.parametrize("stack", ["kind", "a2-staging"])
def test_runtime_commands_parse_with_the_real_cli(stack: str) -> None:
    """Every `ascend-deploy ...` command line in the objects is accepted by the CLI's parser."""
    import shlex

    from ascend_runtime.cli import build_parser

    parser = build_parser()
    parsed = 0
    for obj in build_system(load_plan(stack)).all():
        if obj["kind"] not in ("Deployment", "Job"):
            continue
        cmd = obj["spec"]["template"]["spec"]["containers"][0]["command"]
        lines = [cmd] if cmd[0] == "ascend-deploy" else [shlex.split(line) for line in cmd[-1].splitlines()[1:]]
        for argv in lines:
            if argv and argv[0] == "ascend-deploy":
                parser.parse_args([a.replace("$(POD_IP)", "10.0.0.1") for a in argv[1:]])
                parsed += 1
    # the proxy, the checks Job and the headless workers' lines, plus the balancer where it is deployed
    assert parsed >= 3 + bool(balancer_objects(Context(load_plan(stack))))
