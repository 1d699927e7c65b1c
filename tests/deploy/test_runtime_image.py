"""The kit's runtime image as part of the stack, under Pulumi's mock runtime.

A ``{build: ...}`` stack registers one pulumi-docker-build Image (the repository's Dockerfile, pushed to the stack's
registry with the Pulumi secrets' login) and every kit container runs ``REGISTRY/REPOSITORY@sha256:<digest>`` of
that push; a prebuilt reference is used as written; a reference without a registry, or none, on the kubernetes
target exits 2 from ``plan`` and registers nothing, naming ``kubernetes.runtime_image``.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ascend_runtime.cli import main
from ascend_runtime.config.runtime_image import configured_reference
from ascend_runtime.planner import load_plan
from ascend_runtime.render.manifests import manifest_files
from ascend_runtime.render.objects.common import LABEL_COMPONENT
from ascend_runtime.render.objects.faults import PROXY_ADMIN_SECRET

from .harness import (
    IMAGE_TYPE,
    PROJECT,
    REGISTRY_CREDENTIALS,
    ROOT,
    SECRET_SIG,
    Run,
    mock_digest,
    normalize,
    run_stack,
)
from .pods import pod_spec, workload_objects

BUILD_STACKS = ["a2-staging", "cm384-prod", "kind"]
NPU_STACKS = ["a2-staging", "cm384-prod"]
KEY = "kubernetes.runtime_image"
#: A full reference with registry and digest (the prebuilt form).
PREBUILT = ("swr.cn-north-4.myhuaweicloud.com/ascend-deepseek/ascend-deploy-runtime@sha256:"
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
PINNED = re.compile(r"(?P<registry>[^/]+\.[^/]+|localhost:[0-9]+)/[a-z0-9._/-]+@sha256:[0-9a-f]{64}\Z")
#: Components whose pods run images of others: vLLM-Ascend's engines (not on kind) and MindCluster's device plugin.
FOREIGN = {"engine", "device-plugin"}
_ADMIN = {f"{PROJECT}:{PROXY_ADMIN_SECRET}": "admin-t0ken"}  # so the fault watcher is deployed as well


def _run_with_watcher(stack: str) -> Run:
    run = run_stack(stack, _ADMIN, secret_keys=list(_ADMIN))
    assert run.error is None, run.error
    return run


def _images(run: Run) -> list[dict[str, Any]]:
    return [r.inputs for r in run.resources if r.typ == IMAGE_TYPE]


def kit_containers(objs: list[dict[str, Any]], simulated: bool) -> list[tuple[str, dict[str, Any]]]:
    """(workload, container) of every container running the kit's image: all but the engines on NPUs and the
    device plugin; on kind the simulated engines run the kit's image too."""
    out = []
    for obj in workload_objects(objs):
        component = obj["metadata"]["labels"].get(LABEL_COMPONENT)
        if component in FOREIGN and not (simulated and component == "engine"):
            continue
        spec = pod_spec(obj)
        out += [(obj["metadata"]["name"], c) for c in [*spec.get("initContainers", []), *spec["containers"]]]
    return out


def _stacks(tmp_path: Path, stack: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of stacks/ whose ``stack`` config ``edit`` changed (its ``kubernetes`` block)."""
    target = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", target)
    path = target / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text())
    edit(doc["config"].setdefault(f"{PROJECT}:kubernetes", {}))
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def _set_image(value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(k8s: dict[str, Any]) -> None:
        if value is None:
            k8s.pop("runtime_image", None)
        else:
            k8s["runtime_image"] = value
    return edit


# --- the build ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", BUILD_STACKS)
def test_stack_registers_the_build_first(stack: str) -> None:
    run = _run_with_watcher(stack)
    plan = load_plan(stack)
    spec = plan.config["kubernetes"]["runtime_image"]["build"]
    (image,) = _images(run)
    assert image["push"] is True
    assert image["tags"] == [f"{spec['registry']}/{spec['repository']}:{spec['tag']}"]
    assert image["context"] == {"location": "."} and image["dockerfile"] == {"location": "Dockerfile"}
    assert image.get("platforms") == spec["platforms"]
    assert (ROOT / image["dockerfile"]["location"]).is_file()
    # before any Kubernetes object: every workload's image is an output of it
    order = [r.typ for r in run.resources if r.custom]
    assert order.index(IMAGE_TYPE) < min(i for i, t in enumerate(order) if t.startswith("kubernetes:"))


@pytest.mark.parametrize("stack", NPU_STACKS)
def test_build_logs_in_with_the_stack_secrets(stack: str) -> None:
    (image,) = _images(_run_with_watcher(stack))
    assert SECRET_SIG in image["registries"], "the login stays a Pulumi secret"
    (login,) = normalize(image["registries"])
    registry = load_plan(stack).config["kubernetes"]["runtime_image"]["build"]["registry"]
    assert login["address"] == registry
    for field, key in (("username", "runtime_image_registry_username"), ("password", "runtime_image_registry_password")):
        assert login[field] == REGISTRY_CREDENTIALS[f"{PROJECT}:{key}"]


def test_kind_pushes_to_its_local_registry_without_a_login() -> None:
    run = run_stack("kind", registry_credentials=False)
    assert run.error is None, run.error
    (image,) = _images(run)
    assert image["tags"] == ["localhost:5001/ascend-deploy-runtime:dev"] and not image.get("registries")


@pytest.mark.parametrize("stack", BUILD_STACKS)
def test_every_kit_container_runs_the_build_by_digest(stack: str) -> None:
    run = _run_with_watcher(stack)
    plan = load_plan(stack)
    spec = plan.config["kubernetes"]["runtime_image"]["build"]
    want = f"{spec['registry']}/{spec['repository']}@{mock_digest()}"
    containers = kit_containers(run.k8s_objects, plan.target == "kind")
    names = {workload for workload, _ in containers}
    assert {"pd-proxy", "post-deploy-checks", "ascend-fault-watcher"} <= names, names
    for workload, container in containers:
        assert container["image"] == want, (workload, container["name"])
        match = PINNED.match(container["image"])
        assert match and match["registry"] == spec["registry"], container["image"]
    # nothing else in the namespace runs an image by tag from nowhere
    others = {c["image"] for o in workload_objects(run.k8s_objects) for c in pod_spec(o)["containers"]} - {want}
    assert others <= {plan.engine_image, "swr.cn-south-1.myhuaweicloud.com/ascendhub/ascend-k8sdeviceplugin:v26.1.0"}
    assert run.exports["runtime_image"] == want
    version = plan.config["kubernetes"]["version"]
    for obj in workload_objects(run.k8s_objects):  # a digest reference is a valid image field
        kubernetes_validate.validate(obj, version, strict=True)


def test_kit_containers_can_fail() -> None:
    """The selection above finds the kit's containers and would see one left on a tag."""
    run = _run_with_watcher("a2-staging")
    containers = kit_containers(run.k8s_objects, simulated=False)
    assert len(containers) >= 3 and all(c["image"] != load_plan("a2-staging").engine_image for _, c in containers)
    assert not PINNED.match(configured_reference(load_plan("a2-staging").config))


def test_render_writes_the_tag_reference_deterministically() -> None:
    """render has no build: its manifests carry the stack's registry/repository:tag, the same every time."""
    plan = load_plan("a2-staging")
    files = manifest_files(plan)
    text = "".join(files.values())
    assert configured_reference(plan.config) in text and "@sha256:" not in text
    assert manifest_files(load_plan("a2-staging")) == files


# --- prebuilt references --------------------------------------------------------------------------


def test_prebuilt_reference_is_run_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(_stacks(tmp_path, "cm384-prod", _set_image(PREBUILT))))
    run = run_stack("cm384-prod", _ADMIN, secret_keys=list(_ADMIN), registry_credentials=False)
    assert run.error is None, run.error
    assert _images(run) == []  # nothing to build, and no registry login needed
    containers = kit_containers(run.k8s_objects, simulated=False)
    assert containers and {c["image"] for _, c in containers} == {PREBUILT}


def test_prebuilt_reference_without_digest_is_allowed_with_a_warning(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    tagged = PREBUILT.split("@")[0] + ":0.1.0"
    stacks = _stacks(tmp_path, "a2-staging", _set_image(tagged))
    assert main(["plan", "--stack", "a2-staging", "--stacks-dir", str(stacks)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and KEY in err and "digest" in err
    assert main(["plan", "--stack", "a2-staging"]) == 0
    assert "warning:" not in capsys.readouterr().err  # the committed stack builds its image


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", NPU_STACKS)
@pytest.mark.parametrize("image", ["ascend-deploy-runtime:0.1.0", "ascend/ascend-deploy-runtime:0.1.0", None],
                         ids=["name-tag", "no-registry-host", "unset"])
def test_reference_without_registry_exits_2(stack: str, image: str | None, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    stacks = _stacks(tmp_path, stack, _set_image(image))
    assert main(["plan", "--stack", stack, "--stacks-dir", str(stacks)]) == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith(f"  - {KEY}: "))
    assert "build" in line and "REGISTRY/REPOSITORY@sha256:" in line and "Traceback" not in err
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(stacks))
    run = run_stack(stack)
    assert type(run.error).__name__ == "ConfigError" and KEY in str(run.error)
    assert run.resources == [] and run.exports == {}


def test_kind_runs_a_kind_loaded_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kind may run a bare name:tag that `kind load docker-image` put on its nodes (no registry, no build)."""
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(_stacks(tmp_path, "kind", _set_image(None))))
    run = run_stack("kind", registry_credentials=False)
    assert run.error is None, run.error
    assert _images(run) == []
    assert {c["image"] for _, c in kit_containers(run.k8s_objects, simulated=True)} == {"ascend-deploy-runtime:dev"}


@pytest.mark.parametrize("stack", NPU_STACKS)
def test_build_without_registry_login_registers_nothing(stack: str) -> None:
    run = run_stack(stack, registry_credentials=False)
    assert type(run.error).__name__ == "ConfigError"
    text = str(run.error)
    for key in ("runtime_image_registry_username", "runtime_image_registry_password"):
        assert f"pulumi config set --secret {PROJECT}:{key} <value>" in text
    assert run.resources == [] and run.exports == {}
