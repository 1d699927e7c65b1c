"""Engine pods' CPU and memory (requests, limits, /dev/shm inside the limit, the stack keys and their
refusals) and the serving taint (no node patch holds it; kubectl commands; every engine tolerates it)."""

from __future__ import annotations

import copy
import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ascend_runtime.cli import main as cli_main
from ascend_runtime.config.errors import ConfigError
from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects.common import TAINT_KEY
from ascend_runtime.render.objects.resources import (
    ENGINE_HOST_BASE_GIB,
    ENGINE_HOST_GIB_PER_NPU,
    MIN_CPUS_PER_NPU,
    resource_problems,
)

from .conftest import K8S_STACKS, stack_run
from .harness import ROOT, Run, run_stack
from .pods import pod_spec, workload_objects

NPU_STACKS = [s for s in K8S_STACKS if load_plan(s).target == "kubernetes"]
GI = 1 << 30


def _quantity(value: str) -> float:
    """A Kubernetes quantity in base units (the suffixes the kit writes)."""
    for suffix, factor in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", GI), ("Ti", 1 << 40), ("m", 1e-3)):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def qos_class(spec: dict[str, Any]) -> str:
    """The pod's QoS class by the kubelet's rules (cpu and memory of every container)."""
    containers = [*spec.get("initContainers", []), *spec["containers"]]
    requests = [c.get("resources", {}).get("requests", {}) for c in containers]
    limits = [c.get("resources", {}).get("limits", {}) for c in containers]
    if not any(r.get(k) or lim.get(k) for r, lim in zip(requests, limits) for k in ("cpu", "memory")):
        return "BestEffort"
    guaranteed = all(lim.get(k) and _quantity(r.get(k, lim[k])) == _quantity(lim[k])
                     for r, lim in zip(requests, limits) for k in ("cpu", "memory"))
    return "Guaranteed" if guaranteed else "Burstable"


def _engine_pods(run: Run) -> list[dict[str, Any]]:
    """Pod specs of every engine workload (rank Deployments and both LeaderWorkerSet templates)."""
    engines = [o for o in run.k8s_objects if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "engine"]
    return [pod_spec(o) for o in workload_objects(engines)]


# ---------------------------------------------------------------- engine resources


@pytest.mark.parametrize("stack", NPU_STACKS)
def test_engine_pods_request_cpu_and_memory_limit_equal_request(stack: str) -> None:
    plan = load_plan(stack)
    spec = hardware_spec(plan.hardware)
    npu = plan.config["kubernetes"]["npu_resource"]
    pods = _engine_pods(stack_run(stack))
    assert pods
    for pod in pods:
        (container,) = pod["containers"]
        req, lim = container["resources"]["requests"], container["resources"].get("limits", {})
        assert qos_class(pod) == "Burstable"  # not BestEffort: the first to be evicted and OOM-killed
        assert _quantity(req["cpu"]) == spec.engine_cpu and "cpu" not in lim  # no CFS quota on the engine
        assert _quantity(req["memory"]) == _quantity(lim["memory"]) == spec.engine_memory_gib * GI
        assert req[npu] == lim[npu]
        npus = int(req[npu])
        assert _quantity(req["cpu"]) >= MIN_CPUS_PER_NPU * npus
        # /dev/shm is memory-backed and charged to the pod: it and the engine fit inside the limit
        (shm,) = [v for v in pod["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"]["medium"] == "Memory"
        expected = (ENGINE_HOST_BASE_GIB + ENGINE_HOST_GIB_PER_NPU * npus) * GI
        assert _quantity(shm["emptyDir"]["sizeLimit"]) + expected <= _quantity(lim["memory"])
        # the defaults leave the node room for the kubelet, system reservations, device plugin and daemons
        assert _quantity(req["cpu"]) < spec.host_cpus and _quantity(lim["memory"]) < spec.host_memory_gib * GI


def test_simulated_engines_keep_their_small_requests() -> None:
    for pod in _engine_pods(stack_run("kind")):
        assert pod["containers"][0]["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}}


def _stacks_with(tmp_path: Path, stack: str, **kubernetes: Any) -> Path:
    """A copy of stacks/ whose ``stack`` has ``kubernetes`` keys set (or, with value ``...``, removed)."""
    target = tmp_path / f"stacks-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(ROOT / "stacks", target)
    path = target / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(path.read_text())
    k8s = doc["config"]["ascend-deepseek:kubernetes"]
    for key, value in kubernetes.items():
        k8s[key] = value
    path.write_text(yaml.safe_dump(doc))
    return target


def _paths(exc: ConfigError) -> set[str]:
    return {p.path for p in exc.problems}


def test_stack_keys_size_the_pods_and_bad_sizes_are_refused(tmp_path: Path) -> None:
    from ascend_runtime.render.objects import build_system

    # explicit keys replace the hardware's defaults
    plan = load_plan("a2-staging", _stacks_with(tmp_path, "a2-staging", engine_cpu=96, engine_memory_gib=900))
    lws = next(o for o in build_system(plan).all() if o["kind"] == "LeaderWorkerSet")
    for template in workload_objects([lws]):
        resources = pod_spec(template)["containers"][0]["resources"]
        assert resources["requests"]["cpu"] == "96" and resources["limits"]["memory"] == "900Gi"
        kubernetes_validate.validate(template, plan.config["kubernetes"]["version"], strict=True)

    a2 = hardware_spec("atlas-800i-a2")
    expected_a2 = ENGINE_HOST_BASE_GIB + ENGINE_HOST_GIB_PER_NPU * a2.devices_per_node
    fits = a2.engine_memory_gib - expected_a2
    # (keys, the key the refusal names or None when the stack is fine)
    cases: list[tuple[dict[str, Any], str | None]] = [
        ({"shm_size_gib": fits}, None),  # exactly fills the default limit
        ({"shm_size_gib": fits + 1}, "kubernetes.shm_size_gib"),
        ({"shm_size_gib": fits + 1, "engine_memory_gib": a2.engine_memory_gib + 1}, None),
        ({"shm_size_gib": 64, "engine_memory_gib": 200}, "kubernetes.shm_size_gib"),  # 64 + 160 > 200
        ({"engine_cpu": MIN_CPUS_PER_NPU * a2.devices_per_node}, None),
        ({"engine_cpu": MIN_CPUS_PER_NPU * a2.devices_per_node - 1}, "kubernetes.engine_cpu"),
    ]
    for keys, refused in cases:
        plan = load_plan("a2-staging", _stacks_with(tmp_path, "a2-staging", **keys))
        got = {p.path for p in resource_problems(plan)}
        assert got == ({refused} if refused else set()), keys
        if refused:
            with pytest.raises(ConfigError) as err:
                build_system(plan)
            assert _paths(err.value) == {refused}
    # the schema's bounds and types, named by key (the loader's refusal, before any Plan)
    for key, value in [("engine_cpu", 0), ("engine_cpu", 1025), ("engine_cpu", "96"), ("engine_cpu", 2.5),
                       ("engine_cpu", True), ("engine_memory_gib", 15), ("engine_memory_gib", 16385),
                       ("engine_memory_gib", "768Gi"), ("engine_memory_gib", 512.0)]:
        with pytest.raises(ConfigError) as err:
            load_plan("a2-staging", _stacks_with(tmp_path, "a2-staging", **{key: value}))
        assert f"kubernetes.{key}" in _paths(err.value), (key, value)
    # CM384: 16 dies per node, so more host memory is expected than on A2
    cm = hardware_spec("cm384")
    over = cm.engine_memory_gib - (ENGINE_HOST_BASE_GIB + ENGINE_HOST_GIB_PER_NPU * cm.devices_per_node) + 1
    plan = load_plan("cm384-prod", _stacks_with(tmp_path, "cm384-prod", shm_size_gib=over))
    assert {p.path for p in resource_problems(plan)} == {"kubernetes.shm_size_gib"}
    # kind simulates the engines: no NPU-sized check
    assert resource_problems(load_plan("kind", _stacks_with(tmp_path, "kind", shm_size_gib=4096))) == []


def test_oversized_shm_registers_nothing_and_the_cli_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    stacks = _stacks_with(tmp_path, "a2-staging", shm_size_gib=700)
    monkeypatch.setenv("ASCEND_DEPLOY_STACKS", str(stacks))
    run = run_stack("a2-staging")
    assert isinstance(run.error, ConfigError) and _paths(run.error) == {"kubernetes.shm_size_gib"}
    assert run.resources == [] and run.exports == {}
    code = cli_main(["render", "--stack", "a2-staging", "--stacks-dir", str(stacks), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "kubernetes.shm_size_gib" in err and "Traceback" not in err
    assert "engine_memory_gib" in err  # the fix names the other key too


# ---------------------------------------------------------------- serving taint


def _schema_versions() -> list[str]:
    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return sorted(p.name.split("-")[0][1:].rsplit(".", 1)[0] for p in base.glob("v*-local-strict"))


def _node_spec_schema(version: str) -> dict[str, Any]:
    base = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}.0-local-strict"
    path = base / "nodespec.json"  # 1.30 and later; older releases name it nodespec-v1.json
    return json.loads((path if path.exists() else base / "nodespec-v1.json").read_text())


def test_node_taints_are_an_atomic_list_in_every_supported_version() -> None:
    """Server-side apply treats a list without a list-type marker as atomic; 1.30+ state it explicitly."""
    versions = _schema_versions()
    assert "1.30" in versions
    for version in versions:
        taints = _node_spec_schema(version)["properties"]["taints"]
        assert taints.get("x-kubernetes-list-type", "atomic") == "atomic", version
        assert "x-kubernetes-list-map-keys" not in taints, version


def _owned_fields(obj: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Field paths an apply of ``obj`` owns: maps are granular, every list of a Node is atomic (one field)."""
    if isinstance(obj, dict):
        out: dict[tuple[str, ...], Any] = {}
        for key, value in obj.items():
            out.update(_owned_fields(value, (*prefix, key)))
        return out
    return {prefix: obj}


def apply_conflicts(applied: dict[str, Any], live_owners: dict[tuple[str, ...], tuple[str, Any]],
                    manager: str) -> list[tuple[str, ...]]:
    """Fields an apply by ``manager`` would conflict on: set to a value other than the live one another
    manager owns (the server-side apply rule; ``live_owners``: path -> (manager, value))."""
    return sorted(path for path, value in _owned_fields(applied).items()
                  if path in live_owners and live_owners[path][0] != manager and live_owners[path][1] != value)


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_node_patches_never_conflict_with_other_managers(stack: str) -> None:
    run = stack_run(stack)
    patches = [o for o in run.k8s_objects if o["kind"] == "Node"]
    assert patches
    cordoned = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                {"key": TAINT_KEY, "value": "decode", "effect": "NoSchedule"}]
    for patch in patches:
        assert set(patch) == {"apiVersion", "kind", "metadata"} and set(patch["metadata"]) == {"name", "labels"}
        # another manager's label and the controller's taint list on the live node
        live = {("metadata", "labels", "team"): ("operator", "x"), ("spec", "taints"): ("kube-controller-manager", cordoned)}
        assert apply_conflicts(patch, live, "pulumi-kubernetes") == []
        # the model can fail: the former patch, holding the serving taint, conflicts on the whole list
        former = copy.deepcopy(patch)
        former["spec"] = {"taints": [{"key": TAINT_KEY, "value": "decode", "effect": "NoSchedule"}]}
        assert apply_conflicts(former, live, "pulumi-kubernetes") == [("spec", "taints")]


def _selects(selector: str, labels: dict[str, str]) -> bool:
    key, _, value = selector.partition("=")
    return labels.get(key) == value


def kubectl_taint(node_taints: list[dict[str, str]], spec: str) -> list[dict[str, str]]:
    """``kubectl taint --overwrite KEY=VALUE:EFFECT`` on one node's taints: the taint of the same key and
    effect replaced, every other kept (kubectl ``reorganizeTaints``)."""
    key_value, effect = spec.rsplit(":", 1)
    key, value = key_value.split("=", 1)
    new = {"key": key, "value": value, "effect": effect}
    return [new, *(t for t in node_taints if (t["key"], t["effect"]) != (key, effect))]


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_taint_commands_cover_the_serving_nodes_idempotently(stack: str) -> None:
    plan = load_plan(stack)
    run = stack_run(stack)
    commands = [shlex.split(c) for c in run.exports["node_taint_commands"]]
    if not plan.config["kubernetes"]["taint_nodes"]:
        assert commands == []
        return
    assert commands
    labels = {o["metadata"]["name"]: o["metadata"]["labels"] for o in run.k8s_objects if o["kind"] == "Node"}
    foreign = {"key": "example.com/maintenance", "value": "", "effect": "NoExecute"}
    taints: dict[str, list[dict[str, str]]] = {n.name: [dict(foreign)] for n in plan.nodes}
    # a node whose role changed keeps a stale taint value until the commands run again
    stale = next(n.name for n in plan.nodes if n.role)
    taints[stale].append({"key": TAINT_KEY, "value": "stale", "effect": "NoSchedule"})
    for _ in range(2):  # running them twice changes nothing
        for argv in commands:
            assert argv[:3] == ["kubectl", "taint", "nodes"] and "--overwrite" in argv
            selector = argv[argv.index("-l") + 1]
            (spec,) = [a for a in argv[3:] if a.startswith(f"{TAINT_KEY}=")]
            for name, node_labels in labels.items():
                if _selects(selector, node_labels):
                    taints[name] = kubectl_taint(taints[name], spec)
    for node in plan.nodes:
        kit = [t for t in taints[node.name] if t["key"] == TAINT_KEY]
        assert foreign in taints[node.name]  # another manager's taint stays
        assert kit == ([{"key": TAINT_KEY, "value": node.role, "effect": "NoSchedule"}] if node.role else []), node.name


def tolerates(tolerations: list[dict[str, str]], taint: dict[str, str]) -> bool:
    """The scheduler's toleration match (``Exists`` matches any value; empty effect any effect)."""
    for tol in tolerations:
        if tol.get("effect") and tol["effect"] != taint["effect"]:
            continue
        if tol.get("operator", "Equal") == "Exists" and tol.get("key") in (None, "", taint["key"]):
            return True
        if tol.get("key") == taint["key"] and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


@pytest.mark.parametrize("stack", K8S_STACKS)
def test_every_engine_tolerates_the_serving_taint_whatever_its_value(stack: str) -> None:
    """Placement is the Plan's nodeSelector/affinity; the taint's value may lag a role change, so no engine
    pod may depend on it. Pods that are no engine or plugin still keep off serving nodes."""
    run = stack_run(stack)
    for pod in _engine_pods(run):
        for value in ("prefill", "decode", "stale"):
            assert tolerates(pod.get("tolerations", []), {"key": TAINT_KEY, "value": value, "effect": "NoSchedule"})
    proxy = [o for o in workload_objects(run.k8s_objects) if o["metadata"]["name"] == "pd-proxy"]
    assert proxy and not tolerates(pod_spec(proxy[0]).get("tolerations", []),
                                   {"key": TAINT_KEY, "value": "decode", "effect": "NoSchedule"})
