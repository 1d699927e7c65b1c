"""The Ascend device plugin: MindCluster's pinned manifest as objects, registered only when installed.

Expected values below are transcribed from
``component/ascend-device-plugin/build/ascendplugin.yaml@v26.1.0 (9e132e216bb7b81f4a2742a4ac6d3b50754e8a77)``;
when a bare mirror of mind-cluster is on this machine, one more test compares against the file itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError
import yaml

from ascend_runtime.config.stack import DevicePluginConfig
from ascend_runtime.planner import load_plan
from ascend_runtime.render.manifests import manifest_files
from ascend_runtime.render.objects.device_plugin import KIT_IMAGE_PULL_POLICY, RELEASE
from ascend_runtime.render.objects.mindcluster import is_patch

from .conftest import stack_run
from .harness import ROOT, Run, run_stack

STACK = "a2-staging"  # the committed stack with kubernetes.device_plugin.install: true
COMPONENT_LABEL = "app.kubernetes.io/component"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")

#: ClusterRole rules of ascendplugin.yaml@v26.1.0, verbatim.
PINNED_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "update", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["get", "patch", "update"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "update", "list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
#: hostPath volumes of ascendplugin.yaml@v26.1.0: name -> (path, type or None).
PINNED_HOST_PATHS = {
    "device-plugin": ("/var/lib/kubelet/device-plugins", None),
    "pod-resource": ("/var/lib/kubelet/pod-resources", None),
    "hiai-driver": ("/usr/local/Ascend/driver", None),
    "log-path": ("/var/log", "Directory"),
    "data-trace-file-dir": ("/user/cluster-info/datatrace-config", "DirectoryOrCreate"),
    "tmp": ("/tmp", None),
    "lingqu-log": ("/var/log/lingqu", "DirectoryOrCreate"),
    "localtime": ("/etc/localtime", None),
}
MIRROR = Path(os.environ.get("MINDCLUSTER_MIRROR") or Path(os.environ.get("UPSTREAM_MIRRORS", "/nonexistent")) / "Ascend+mind-cluster" / "repo")


def _plugin_objects(run: Run) -> list[dict[str, Any]]:
    return [o for o in run.k8s_objects if o["metadata"].get("labels", {}).get(COMPONENT_LABEL) == "device-plugin"]


def _one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def _plugin_container(ds: dict[str, Any]) -> dict[str, Any]:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


@pytest.fixture(scope="module")
def objs() -> list[dict[str, Any]]:
    return _plugin_objects(stack_run(STACK))


def test_every_device_plugin_object_validates(objs: list[dict[str, Any]]) -> None:
    version = load_plan(STACK).config["kubernetes"]["version"]
    assert sorted(o["kind"] for o in objs) == sorted([*RBAC_KINDS, "DaemonSet"])
    for obj in objs:
        kubernetes_validate.validate(obj, version, strict=True)


def test_node_name_from_downward_api(objs: list[dict[str, Any]]) -> None:
    env = {e["name"]: e for e in _plugin_container(_one(objs, "DaemonSet")).get("env", [])}
    assert "NODE_NAME" in env, "ascend-device-plugin exits without NODE_NAME"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["MOUNT_BY_RUNTIME_FOR_DP"]["value"] == "true"


def test_kubelet_pod_resources_mounted(objs: list[dict[str, Any]]) -> None:
    ds = _one(objs, "DaemonSet")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    pod_resources = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/pod-resources"]
    assert pod_resources, "no hostPath volume of the kubelet pod-resources socket directory"
    mounts = {m["name"]: m for m in _plugin_container(ds)["volumeMounts"]}
    assert mounts[pod_resources[0]]["mountPath"] == "/var/lib/kubelet/pod-resources"
    assert mounts[pod_resources[0]].get("readOnly") is not True


def test_runs_as_service_account_bound_to_pinned_cluster_role(objs: list[dict[str, Any]]) -> None:
    ds, account = _one(objs, "DaemonSet"), _one(objs, "ServiceAccount")
    role, binding = _one(objs, "ClusterRole"), _one(objs, "ClusterRoleBinding")
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == ds["metadata"]["namespace"] == "kube-system"
    assert pod.get("automountServiceAccountToken", True) is True
    assert {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "kube-system"} in binding["subjects"]
    assert binding["roleRef"] == {"kind": "ClusterRole", "name": role["metadata"]["name"],
                                  "apiGroup": "rbac.authorization.k8s.io"}
    assert role["rules"] == PINNED_RULES
    assert (account["metadata"]["name"], role["metadata"]["name"], binding["metadata"]["name"]) == (
        "ascend-device-plugin-sa", "pods-node-ascend-device-plugin-role", "pods-node-ascend-device-plugin-rolebinding")


def test_daemonset_is_the_pinned_manifest(objs: list[dict[str, Any]]) -> None:
    ds = _one(objs, "DaemonSet")
    cfg = load_plan(STACK).config["kubernetes"]["device_plugin"]
    assert ds["metadata"]["name"] == "ascend-device-plugin-daemonset"  # MindCluster: do not rename it
    spec = ds["spec"]
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    assert spec["selector"] == {"matchLabels": {"name": "ascend-device-plugin-ds"}}
    assert spec["template"]["metadata"]["labels"]["name"] == "ascend-device-plugin-ds"
    pod = spec["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"workerselector": "dls-worker-node"}
    assert pod["hostPID"] is True
    keys = [t["key"] for t in pod["tolerations"]]
    assert keys[:6] == ["CriticalAddonsOnly", "huawei.com/Ascend910", "huawei.com/Ascend310", "huawei.com/Ascend310P",
                        "huawei.com/npu", "device-plugin"]
    assert "ascend-deepseek/serving" in keys  # the kit's taint of serving nodes
    container = _plugin_container(ds)
    assert container["command"] == ["/bin/bash", "-c", "--"]
    assert container["args"] == ["device-plugin -logFile=/var/log/mindx-dl/devicePlugin/devicePlugin.log -logLevel=0"
                                 " --enable-healthz=true --healthz-address=11251"]
    assert container["securityContext"] == {"privileged": True, "readOnlyRootFilesystem": True}
    assert container["livenessProbe"]["httpGet"] == {"path": "/", "port": 11251, "scheme": "HTTP"}
    assert container["image"] == f"{cfg['image']}:{cfg['version']}"
    (init,) = pod["initContainers"]
    assert init["image"] == container["image"] and init["securityContext"] == {"runAsUser": 0, "runAsNonRoot": False}
    volumes = {v["name"]: (v["hostPath"]["path"], v["hostPath"].get("type")) for v in pod["volumes"]}
    assert volumes == PINNED_HOST_PATHS
    mounts = {(m["name"], m["mountPath"], m.get("subPath")) for m in container["volumeMounts"]}
    assert ("log-path", "/var/log/mindx-dl/devicePlugin", "mindx-dl/devicePlugin") in mounts
    assert {m["mountPath"] for m in container["volumeMounts"]} == {
        "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/usr/local/Ascend/driver",
        "/var/log/mindx-dl/devicePlugin", "/tmp", "/var/log/lingqu", "/etc/localtime",
        "/user/cluster-info/datatrace-config"}


def test_default_version_is_the_pinned_release_tag() -> None:
    assert RELEASE.tag == "v26.1.0" and RELEASE.commit == "9e132e216bb7b81f4a2742a4ac6d3b50754e8a77"
    assert DevicePluginConfig().version == RELEASE.image_tag == "v26.1.0"
    assert load_plan(STACK).config["kubernetes"]["device_plugin"]["version"] == RELEASE.image_tag


@pytest.mark.parametrize("tag", ["v6.0.0", "v26.0.0", "latest", "abc", "v26.1.01", "26.1.0"])
def test_an_image_of_another_release_than_the_manifest_is_refused(tag: str) -> None:
    """The DaemonSet is v26.1.0's manifest: an image of another release reads other flags (and exits on one it
    does not know), so its tag is refused with the field named and the fix."""
    with pytest.raises(ValidationError) as err:
        DevicePluginConfig(version=tag)
    (problem,) = err.value.errors()
    assert problem["loc"] == ("version",)
    assert "v26.1.0" in problem["msg"] and "rebuild of it" in problem["ctx"]["hint"]  # the fix


@pytest.mark.parametrize("tag", ["v26.1.0", "v26.1.0-hotfix1", "v26.1.0_arm64", "v26.1.0.2"])
def test_the_release_and_its_rebuilds_are_accepted(tag: str) -> None:
    assert DevicePluginConfig(version=tag).version == tag


def _git(*args: str) -> str:
    return subprocess.run(["git", f"--git-dir={MIRROR}", *args], check=True, capture_output=True, text=True).stdout


def _undo_kit_deviations(obj: dict[str, Any]) -> dict[str, Any]:
    """The object as the manifest has it: without kit labels, image placeholder, Never pull policy, kit tolerations."""
    obj = yaml.safe_load(yaml.safe_dump(obj))
    obj["metadata"].pop("labels")
    if obj["kind"] == "DaemonSet":
        tmpl = obj["spec"]["template"]
        tmpl["metadata"]["labels"] = {"name": tmpl["metadata"]["labels"]["name"]}
        pod = tmpl["spec"]
        pod["tolerations"] = pod["tolerations"][:len(RELEASE.tolerations)]
        for c in pod["initContainers"] + pod["containers"]:
            assert c["imagePullPolicy"] == KIT_IMAGE_PULL_POLICY
            c["image"] = "ascend-k8sdeviceplugin:v3.0.0"
            c["imagePullPolicy"] = RELEASE.image_pull_policy
        pod["initContainers"][0].pop("imagePullPolicy")  # the manifest's init container sets none
    return obj


@pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no mind-cluster mirror on this machine")
def test_objects_equal_the_pinned_manifest_file(objs: list[dict[str, Any]]) -> None:
    assert _git("rev-parse", f"{RELEASE.tag}^{{commit}}").strip() == RELEASE.commit
    docs = [d for d in yaml.safe_load_all(_git("show", f"{RELEASE.commit}:{RELEASE.manifest}")) if d]
    # the args scalar may be folded over lines in other releases; compare its words
    for d in docs:
        for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            c["args"] = [" ".join(a.split()) for a in c["args"]]
    want = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    got = {(o["kind"], o["metadata"]["name"]): _undo_kit_deviations(o) for o in objs}
    assert got.keys() == want.keys()
    for key, obj in got.items():
        assert obj == want[key], key


def _stacks_with_install(tmp_path: Path, install: bool) -> Path:
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    path = tmp_path / "stacks" / f"Pulumi.{STACK}.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["ascend-deepseek:kubernetes"]["device_plugin"]["install"] = install
    path.write_text(yaml.safe_dump(doc))
    return tmp_path / "stacks"


def _registered_plugin(run: Run) -> dict[str, dict[str, Any]]:
    """Pulumi type token -> inputs of the device plugin resources the program registered (not the tolerations
    patch of MindCluster's own plugin, render/objects/mindcluster.py)."""
    assert run.error is None, run.error
    names = {f"kube-system/{RELEASE.service_account}", RELEASE.cluster_role, RELEASE.cluster_role_binding,
             f"kube-system/{RELEASE.daemonset}"}
    return {r.typ: r.inputs for r in run.resources if r.name in names and not r.typ.endswith("Patch")}


def test_program_registers_rbac_when_installed() -> None:
    registered = _registered_plugin(stack_run(STACK))
    assert set(registered) == {
        "kubernetes:core/v1:ServiceAccount",
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole",
        "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding",
        "kubernetes:apps/v1:DaemonSet",
    }
    assert registered["kubernetes:rbac.authorization.k8s.io/v1:ClusterRole"]["rules"]  # typed, not a bare CustomResource
    assert registered["kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding"]["roleRef"]["kind"] == "ClusterRole"
    files = manifest_files(load_plan(STACK))  # render writes the same objects
    for kind, name in (("serviceaccount", RELEASE.service_account), ("clusterrole", RELEASE.cluster_role),
                       ("clusterrolebinding", RELEASE.cluster_role_binding), ("daemonset", RELEASE.daemonset)):
        assert any(p.startswith("cluster/") and p.endswith(f"-{kind}-{name}.yaml") for p in files), (kind, name)


def test_program_registers_no_device_plugin_when_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _registered_plugin(stack_run("cm384-prod")) == {}  # its install defaults to false
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(_stacks_with_install(tmp_path, False)))
    run = run_stack(STACK)
    assert _registered_plugin(run) == {}
    assert not [o for o in run.k8s_objects if o["kind"] in (*RBAC_KINDS[1:], "DaemonSet") and not is_patch(o)]
    # MindCluster's own plugin, which then runs, only gets the serving taint's toleration patched in
    (patch,) = [o for o in run.k8s_objects if is_patch(o) and o["metadata"]["name"] == RELEASE.daemonset]
    assert set(patch["spec"]["template"]["spec"]) == {"tolerations"}
    assert not [o for o in run.k8s_objects if o["kind"] == "ServiceAccount" and o["metadata"].get("namespace") == "kube-system"]
    assert not _plugin_objects(run)
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(_stacks_with_install(tmp_path / "on", True)))
    assert len(_registered_plugin(run_stack(STACK))) == 4  # the same harness does see them when installed


def test_kind_never_installs_the_plugin() -> None:
    """kind has no NPUs: no device plugin objects whatever the stack says."""
    assert not _plugin_objects(stack_run("kind"))
