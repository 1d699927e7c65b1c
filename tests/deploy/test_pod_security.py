"""Least privilege of every pod the kit creates: service account tokens and security contexts.

Decided in docs/kubernetes.md ("Pod security"):

* the kit's own pods (proxy, balancer, checks Job, and the simulator on kind) run as the runtime
  image's non-root user with the Pod Security Standards' *restricted* container settings and a
  read-only root filesystem (``/tmp`` is an emptyDir);
* vLLM-Ascend engine pods are not privileged (the device plugin and Ascend Docker Runtime inject
  the NPU devices), cannot escalate, drop every capability but ``DAC_OVERRIDE`` and run under the
  runtime's default seccomp profile; the image runs as root;
* only the balancer mounts a service account token (its Role); every other pod has none.

The device plugin DaemonSet is MindCluster's manifest (privileged, its own token) and is checked
against that manifest in test_device_plugin.py, not here.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects import build_system
from ascend_runtime.render.objects.common import (
    RUNTIME_GID,
    RUNTIME_UID,
    SIM_ADMIN_SECRET,
    SIM_ADMIN_TOKEN_ENV,
)
from ascend_runtime.render.objects.engine import ENGINE_CAPABILITIES

from .conftest import K8S_STACKS, stack_run
from .harness import PROJECT, run_stack
from .pods import pod_spec, workload_objects

COMPONENT = "app.kubernetes.io/component"
KIT_COMPONENTS = ("proxy", "balancer", "checks")
RUNTIME_DEFAULT = {"type": "RuntimeDefault"}


def workloads(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod-making object; a LeaderWorkerSet's leader and worker templates as v1 PodTemplates."""
    return workload_objects(objs)


def component(obj: dict[str, Any]) -> str:
    return obj["metadata"]["labels"][COMPONENT]


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """The Pod Security Standards "restricted" rules this pod breaks (plus a read-only root filesystem)."""
    out = []
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            out.append(flag)
    if any("hostPath" in v for v in spec.get("volumes", [])):
        out.append("hostPath volume")
    pod_sc = spec.get("securityContext") or {}
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{name}: capabilities not dropped")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities added {caps['add']}")
        if not sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            out.append(f"{name}: runAsNonRoot not true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        if (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile")
        if sc.get("readOnlyRootFilesystem") is not True:
            out.append(f"{name}: root filesystem writable")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name}: hostPort")
    return out


def _check_restricted_container(c: dict[str, Any]) -> None:
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == RUNTIME_UID and sc["runAsGroup"] == RUNTIME_GID, c["name"]
    assert sc["allowPrivilegeEscalation"] is False and sc.get("privileged", False) is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == RUNTIME_DEFAULT
    assert sc["readOnlyRootFilesystem"] is True


def _tmp_is_an_empty_dir(spec: dict[str, Any]) -> None:
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in spec["containers"]:
        (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert "emptyDir" in volumes[tmp["name"]], c["name"]


@pytest.fixture(params=[*K8S_STACKS, "kind+sim-token"])
def objects(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    if request.param == "kind+sim-token":
        run = run_stack("kind", {f"{PROJECT}:{SIM_ADMIN_SECRET}": "t0ken"}, secret_keys=[f"{PROJECT}:{SIM_ADMIN_SECRET}"])
        assert run.error is None, run.error
        return "kind", run.k8s_objects
    return request.param, stack_run(request.param).k8s_objects


def test_every_pod_has_its_decided_security(objects: tuple[str, list[dict[str, Any]]]) -> None:
    stack, objs = objects
    plan = load_plan(stack)
    seen: set[str] = set()
    for obj in workloads(objs):
        comp = component(obj)
        spec = pod_spec(obj)
        kubernetes_validate.validate(obj, plan.config["kubernetes"]["version"], strict=True)
        if comp == "device-plugin":  # MindCluster's manifest, see test_device_plugin.py
            assert obj["metadata"]["namespace"] == "kube-system"
            continue
        seen.add(comp)
        assert spec.get("hostPID") is not True and spec.get("hostIPC") is not True
        if comp == "balancer":
            assert spec["automountServiceAccountToken"] is True and spec["serviceAccountName"] == "expert-balancer"
        else:
            assert spec["automountServiceAccountToken"] is False, obj["metadata"]["name"]
            assert "serviceAccountName" not in spec
        if comp in KIT_COMPONENTS:
            assert restricted_violations(spec) == [], obj["metadata"]["name"]
            for c in spec["containers"]:
                _check_restricted_container(c)
            _tmp_is_an_empty_dir(spec)
        elif comp == "engine":
            (c,) = spec["containers"]
            sc = c["securityContext"]
            assert spec["hostNetwork"] is True
            if plan.target == "kind":  # the simulator: everything restricted but the node's network
                _check_restricted_container(c)
                _tmp_is_an_empty_dir(spec)
                assert restricted_violations({**spec, "hostNetwork": False}) == []
            else:
                assert sc == {
                    "privileged": False,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"], "add": list(ENGINE_CAPABILITIES)},
                    "runAsNonRoot": False,  # the vLLM-Ascend image runs as root
                    "readOnlyRootFilesystem": False,
                    "seccompProfile": RUNTIME_DEFAULT,
                }
                assert ENGINE_CAPABILITIES == ("DAC_OVERRIDE",)
                assert all(m.get("readOnly") for m in c["volumeMounts"]
                           if any(v["name"] == m["name"] and "hostPath" in v for v in spec["volumes"]))
        else:
            raise AssertionError(f"a pod of component {comp!r} has no decided security context")
    assert {"engine", "proxy"} <= seen


def test_the_restricted_check_can_fail() -> None:
    objs = stack_run("a2-staging").k8s_objects
    proxy = copy.deepcopy(next(o for o in workloads(objs) if o["metadata"]["name"] == "pd-proxy"))
    spec = pod_spec(proxy)
    assert restricted_violations(spec) == []
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    spec["containers"][0]["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    spec["hostNetwork"] = True
    got = restricted_violations(spec)
    assert "hostNetwork" in got and any("capabilities" in g for g in got) and any("Escalation" in g for g in got)
    engine = next(o for o in workloads(objs) if component(o) == "engine")
    assert restricted_violations(pod_spec(engine))  # the NPU engine is not restricted: hostNetwork, hostPath, root


def test_simulator_admin_token_on_kind_comes_from_a_secret() -> None:
    """With ``simulator_admin_token`` set, the kind simulators and the balancer read it from one Secret."""
    key = f"{PROJECT}:{SIM_ADMIN_SECRET}"
    run = run_stack("kind", {key: "kind-t0ken"}, secret_keys=[key])
    assert run.error is None, run.error
    objs = run.k8s_objects
    (secret,) = [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == "simulator-admin-token"]
    assert secret["stringData"] == {"token": "kind-t0ken"}
    users = 0
    for obj in workloads(objs):
        spec = pod_spec(obj)
        for c in spec["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            cmd = c["command"]
            if component(obj) == "engine" and cmd[:2] == ["ascend-deploy", "sim"]:
                assert cmd[cmd.index("--admin-token-env") + 1] == SIM_ADMIN_TOKEN_ENV
            elif component(obj) == "balancer":
                assert cmd[cmd.index("--sim-token-env") + 1] == SIM_ADMIN_TOKEN_ENV
            else:
                assert SIM_ADMIN_TOKEN_ENV not in env, obj["metadata"]["name"]
                continue
            assert env[SIM_ADMIN_TOKEN_ENV]["valueFrom"] == {
                "secretKeyRef": {"name": "simulator-admin-token", "key": "token"}}
            assert "kind-t0ken" not in " ".join(cmd)
            users += 1
    assert users == len(load_plan("kind").instances) + 1
    # without the secret: no token anywhere, the simulators' admin API stays closed
    plain = build_system(load_plan("kind")).all()
    assert not [o for o in plain if o["kind"] == "Secret"]
    assert not any(SIM_ADMIN_TOKEN_ENV in str(pod_spec(o)) for o in workloads(plain))
