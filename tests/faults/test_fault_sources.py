"""A fault source that is not alive is a failed source, never a healthy node (faults/sources.py).

NodeD deletes its ConfigMap when the node is healthy, and a dead device plugin leaves its last ConfigMap in
place, so without these checks a NodeD pod that never scheduled on a tainted node, or a crashed plugin, reads
as "no fault". The watcher runs here against FakeKubernetesApi under exactly the RBAC its objects grant.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from ascend_runtime.faults import signals, sources
from ascend_runtime.faults.kube import KubeAuth, KubeClient
from ascend_runtime.faults.proxies import ProxyAdmin
from ascend_runtime.faults.watcher import REASON_SOURCE_BACK, REASON_SOURCE_FAILED, FaultWatcher, WatcherConfig
from ascend_runtime.render.objects.faults import event_rules, namespace_rules, pod_rules, rules_for_nodes

from .conftest import TOPOLOGY
from .fake_kube import FakeKubernetesApi

MIRROR = Path(os.environ.get("UPSTREAM_MIRRORS", "/nonexistent")) / "Ascend+mind-cluster" / "repo"
EXPECTING = dataclasses.replace(TOPOLOGY, expected_sources=(sources.DEVICE_PLUGIN, sources.NODED))
FAILED = "ascend_faults_source_failed"


@pytest.fixture
async def fake() -> AsyncIterator[FakeKubernetesApi]:
    """Every node of the topology with a fresh device plugin ConfigMap and both sources' pods running and ready,
    the API restricted to the watcher's rules (ClusterRole, serving-namespace Role, and the Roles in default,
    kube-system and mindx-dl)."""
    api = FakeKubernetesApi()
    await api.start()
    for node in EXPECTING.nodes:
        api.add_node(node)
        api.set_source_pod(sources.DEVICE_PLUGIN, node)
        api.set_source_pod(sources.NODED, node)
    api.bind(rules_for_nodes(list(EXPECTING.nodes)), namespace_rules(), "deepseek",
             ((event_rules(), signals.NODE_EVENT_NAMESPACE), (pod_rules(), signals.DEVICE_INFO_NAMESPACE),
              (pod_rules(), signals.NODE_INFO_NAMESPACE)))
    yield api
    await api.stop()


def _watcher(fake: FakeKubernetesApi, session: aiohttp.ClientSession) -> FaultWatcher:
    kube = KubeClient(KubeAuth(fake.url, token=fake.token), session)
    admin = ProxyAdmin(session, "t", timeout_s=0.2)  # no proxy replica: drains are what the watcher wants
    cfg = WatcherConfig(event_namespace=signals.NODE_EVENT_NAMESPACE, node_interval_s=0.0)
    return FaultWatcher(EXPECTING, kube, admin, cfg, session)


def _value(w: FaultWatcher, name: str, **labels: str) -> float | None:
    return w.metrics.registry.get_sample_value(name, labels)


async def test_a_stale_configmap_and_an_absent_pod_are_failed_sources_flagged_not_drained(
        fake: FakeKubernetesApi) -> None:
    async with aiohttp.ClientSession() as session:
        w = _watcher(fake, session)
        await w.run_cycle()
        assert not any(st.failures for st in w.nodes.values())
        assert w.metrics.registry.get_sample_value(FAILED, {}) is None

        # the plugin on n-d1 stopped writing 601 s ago (it rewrites every 300 s); NodeD's pod left n-p0
        old = int(time.time()) - sources.STALE_AFTER_S - 1
        fake.set_device_info("n-d1", update_time=old)
        fake.set_source_pod(sources.NODED, "n-p0", phase=None)
        await w.run_cycle()
        assert _value(w, FAILED, node="n-d1", role="decode", source="device-plugin", reason="configmap-stale") == 1
        assert _value(w, FAILED, node="n-p0", role="prefill", source="noded", reason="pod-absent") == 1
        assert _value(w, "ascend_faults_instance_unwatched", instance="decode-1", role="decode") == 1
        assert _value(w, "ascend_faults_instance_unwatched", instance="prefill-0", role="prefill") == 1
        assert _value(w, "ascend_faults_instance_unwatched", instance="decode-0", role="decode") is None
        assert (_value(w, "ascend_faults_device_info_age_seconds", node="n-d1") or 0) > sources.STALE_AFTER_S
        # no fault is seen: nothing is drained, the instances stay routable, the nodes count as not faulted
        assert w.drains == {} and not w.nodes["n-d1"].faulted and not w.nodes["n-p0"].faulted
        status = w.status()
        assert set(status["failed_sources"]) == {"n-d1", "n-p0"}
        assert "noded pod-absent" in status["failed_sources"]["n-p0"][0]
        assert set(status["unwatched_instances"]) == {"decode-1", "prefill-0"}
        await w.close()
        failed = fake.events_with(REASON_SOURCE_FAILED)
        assert {e["involvedObject"]["name"] for e in failed} == {"n-d1", "n-p0"}
        assert all("nothing is drained" in e["message"] for e in failed)

        # a fault on a stale ConfigMap is still a fault: drained
        fake.set_device_info("n-d1", unhealthy=("Ascend910-2",), update_time=old)
        await w.run_cycle()
        assert "decode-1" in w.drains

        # both alive again: flags and metrics cleared, a Normal Event each
        fake.set_device_info("n-d1")
        fake.set_source_pod(sources.NODED, "n-p0")
        await w.run_cycle()
        assert not any(st.failures for st in w.nodes.values())
        assert w.metrics.registry.get_sample_value(FAILED, {"node": "n-d1", "role": "decode",
                                                            "source": "device-plugin", "reason": "configmap-stale"}) is None
        await w.close()
        assert {e["involvedObject"]["name"] for e in fake.events_with(REASON_SOURCE_BACK)} == {"n-d1", "n-p0"}
    assert fake.denied == [] and fake.rejected_events == []


async def test_a_pod_not_ready_an_absent_configmap_and_a_failed_list(fake: FakeKubernetesApi) -> None:
    async with aiohttp.ClientSession() as session:
        w = _watcher(fake, session)
        fake.set_source_pod(sources.DEVICE_PLUGIN, "n-d0a", phase="Running", ready=False)  # crash-looping
        fake.configmaps.pop((signals.DEVICE_INFO_NAMESPACE, signals.device_info_name("n-spare")))
        await w.run_cycle()
        assert _value(w, FAILED, node="n-d0a", role="decode", source="device-plugin", reason="pod-not-ready") == 1
        assert _value(w, FAILED, node="n-spare", role="spare", source="device-plugin", reason="configmap-absent") == 1
        assert w.drains == {}
        # a list the API server fails keeps the last judgement and counts a read error
        fake.failing.add(f"/api/v1/namespaces/{signals.DEVICE_INFO_NAMESPACE}/pods")
        fake.set_source_pod(sources.DEVICE_PLUGIN, "n-d0a")
        await w.run_cycle()
        assert _value(w, FAILED, node="n-d0a", role="decode", source="device-plugin", reason="pod-not-ready") == 1
        assert _value(w, "ascend_faults_read_errors_total", source="device-plugin-pods") == 1
        fake.failing.clear()
        await w.run_cycle()
        assert _value(w, FAILED, node="n-d0a", role="decode", source="device-plugin", reason="pod-not-ready") is None
        await w.close()


async def test_nothing_is_expected_without_sources_in_the_topology(fake: FakeKubernetesApi) -> None:
    """kind and local stacks run no MindCluster: their topology expects no source, and nothing is listed."""
    async with aiohttp.ClientSession() as session:
        kube = KubeClient(KubeAuth(fake.url, token=fake.token), session)
        w = FaultWatcher(TOPOLOGY, kube, ProxyAdmin(session, "t"), WatcherConfig(node_interval_s=0.0), session)
        for node in TOPOLOGY.nodes:
            fake.set_source_pod(sources.NODED, node, phase=None)
        await w.run_cycle()
        assert not any(st.failures for st in w.nodes.values())
        assert not any(path.endswith("/pods") for _, path, _ in fake.requests)
        await w.close()


def test_judging_pods_and_configmaps() -> None:
    ds = sources.DAEMONSETS[sources.NODED]
    assert ds.selector == "app=noded"
    running = {"spec": {"nodeName": "n"}, "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    pending = {"metadata": {"name": "noded-x"}, "spec": {"nodeName": "n"}, "status": {"phase": "Pending"}}
    assert sources.pod_failure(ds, [running], "n") is None
    assert sources.pod_failure(ds, [pending, running], "n") is None
    assert sources.pod_failure(ds, [pending], "n").reason == sources.POD_NOT_READY  # type: ignore[union-attr]
    assert sources.pod_failure(ds, [], "n").reason == sources.POD_ABSENT  # type: ignore[union-attr]
    assert sources.pods_by_node([running, {"spec": {}}]) == {"n": [running]}
    cm = {"data": {signals.DEVICE_INFO_KEY: '{"DeviceInfo": {"DeviceList": {}, "UpdateTime": 1000}}'}}
    assert sources.device_info_update_time(cm) == 1000
    assert sources.configmap_failure(cm, "n", 1000 + sources.STALE_AFTER_S) is None  # exactly two periods: fresh
    assert sources.configmap_failure(cm, "n", 1001 + sources.STALE_AFTER_S).reason == sources.CONFIGMAP_STALE  # type: ignore[union-attr]
    assert sources.configmap_failure({"data": {}}, "n", 0).reason == sources.CONFIGMAP_STALE  # type: ignore[union-attr]
    assert sources.configmap_failure(None, "n", 0).reason == sources.CONFIGMAP_ABSENT  # type: ignore[union-attr]
    assert sources.STALE_AFTER_S == 2 * sources.DEVICE_INFO_REWRITE_S == 600


def _git_show(path: str) -> str:
    return subprocess.run(["git", f"--git-dir={MIRROR}", "show", f"{signals.MINDCLUSTER_RELEASE}:{path}"],
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no mind-cluster mirror on this machine")
def test_period_field_and_daemonsets_are_mindcluster_v26_1_0s() -> None:
    common = _git_show("component/ascend-device-plugin/pkg/device/ascendcommon.go")
    minutes = int(re.search(r"defaultUpdateTimeInterval\s*=\s*(\d+)", common).group(1))  # type: ignore[union-attr]
    assert minutes * 60 == sources.DEVICE_INFO_REWRITE_S
    assert "time.Since(tool.lastUpdateTimeStamp) < defaultUpdateTimeInterval*time.Minute" in common
    assert re.search(r"DeviceInfo: common\.NodeDeviceInfo\{\s*DeviceList: newDeviceList,\s*UpdateTime: time\.Now\(\)\.Unix\(\)",
                     common)
    proto = _git_show("component/ascend-device-plugin/pkg/common/proto.go")
    assert re.search(r"type NodeDeviceInfo struct \{\s*DeviceList map\[string\]string\s*UpdateTime int64", proto)
    for ds in sources.DAEMONSETS.values():
        (daemonset,) = [d for d in yaml.safe_load_all(_git_show(ds.manifest)) if d and d.get("kind") == "DaemonSet"]
        assert (daemonset["metadata"]["name"], daemonset["metadata"]["namespace"]) == (ds.daemonset, ds.namespace)
        assert daemonset["spec"]["template"]["metadata"]["labels"] == dict(ds.pod_labels)
        assert daemonset["spec"]["selector"]["matchLabels"] == dict(ds.pod_labels)
