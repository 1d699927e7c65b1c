"""Reading MindCluster v26.1.0's fault signals; the names are checked against the release's sources."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import aiohttp
import pytest

from ascend_runtime.faults import signals
from ascend_runtime.faults.kube import KubeAuth, KubeClient
from ascend_runtime.faults.proxies import ProxyAdmin, ProxyService
from ascend_runtime.faults.topology import Topology
from ascend_runtime.faults.watcher import FaultWatcher, WatcherConfig
from ascend_runtime.planner import load_plan
from ascend_runtime.planner.plan import NodePlan

from .conftest import TOPOLOGY
from .fake_kube import FakeKubernetesApi

MIRROR = Path(os.environ.get("UPSTREAM_MIRRORS", "/nonexistent")) / "Ascend+mind-cluster" / "repo"


def _device_cm(fake: FakeKubernetesApi, node: str) -> dict:
    return fake.configmaps[(signals.DEVICE_INFO_NAMESPACE, signals.device_info_name(node))]


def test_device_plugin_configmap_lists() -> None:
    fake = FakeKubernetesApi()
    fake.set_device_info("n1")
    assert signals.device_plugin_signals(_device_cm(fake, "n1")) == []
    fake.set_device_info("n1", unhealthy=("Ascend910-3",), network_unhealthy=("Ascend910-5", "Ascend910-6"),
                         recovering=("Ascend910-1",),
                         faults=[{"fault_type": "CardUnhealthy", "npu_name": "Ascend910-3", "fault_level": "SeparateNPU",
                                  "fault_handling": "SeparateNPU", "fault_code": "80E01801"}])
    got = {s.kind: s for s in signals.device_plugin_signals(_device_cm(fake, "n1"))}
    assert set(got) == {signals.NPU, signals.LINK, signals.RESETTING}
    assert got[signals.NPU].detail == "huawei.com/Ascend910-Unhealthy=Ascend910-3 [Ascend910-3: 80E01801 (SeparateNPU)]"
    assert got[signals.LINK].detail == "huawei.com/Ascend910-NetworkUnhealthy=Ascend910-5,Ascend910-6"
    assert got[signals.NPU].source == "kube-system/mindx-dl-deviceinfo-n1"
    assert signals.device_plugin_signals(None) == []  # no device plugin on the node: nothing known, no fault


def test_device_plugin_extras_and_renamed_resource() -> None:
    fake = FakeKubernetesApi()
    fake.set_device_info("n1", unhealthy=("Ascend910-0",), resource="example.com/npu910")
    cm = _device_cm(fake, "n1")
    assert signals.device_plugin_signals(cm) == []  # the kit's default resource name does not match
    assert [s.kind for s in signals.device_plugin_signals(cm, "example.com/npu910")] == [signals.NPU]
    fake.set_device_info("n1")
    cm = _device_cm(fake, "n1")
    cm["data"][signals.MANUALLY_SEPARATE_KEY] = "Ascend910-7"
    cm["data"][signals.SWITCH_INFO_KEY] = json.dumps({"FaultCode": ["[0x00f103b0,155904,na,na]"], "FaultLevel": "Separate",
                                                      "UpdateTime": 1, "NodeStatus": "UnHealthy"})
    assert [s.kind for s in signals.device_plugin_signals(cm)] == [signals.SEPARATED, signals.SWITCH]
    cm["data"][signals.SWITCH_INFO_KEY] = json.dumps({"FaultCode": [], "FaultLevel": "NotHandle", "NodeStatus": "Healthy"})
    assert [s.kind for s in signals.device_plugin_signals(cm)] == [signals.SEPARATED]


def test_malformed_configmaps_are_read_errors() -> None:
    for data in ({}, {signals.DEVICE_INFO_KEY: "{not json"}, {signals.DEVICE_INFO_KEY: json.dumps({"x": 1})}):
        with pytest.raises(signals.SignalFormatError):
            signals.device_plugin_signals({"metadata": {"name": "mindx-dl-deviceinfo-n1"}, "data": data})
    with pytest.raises(signals.SignalFormatError):
        signals.noded_signals({"metadata": {"name": "mindx-dl-nodeinfo-n1"}, "data": {signals.NODE_INFO_KEY: "[]"}})


def test_noded_configmap() -> None:
    fake = FakeKubernetesApi()
    key = (signals.NODE_INFO_NAMESPACE, signals.node_info_name("n1"))
    fake.set_node_info("n1", "PreSeparate", [{"DeviceType": "Memory", "DeviceId": 2, "FaultCode": ["0A000013"],
                                              "FaultLevel": "PreSeparateFault"}])
    assert signals.noded_signals(fake.configmaps[key]) == ([], "PreSeparate")  # pre-separate: serve on
    fake.set_node_info("n1", "UnHealthy", [{"DeviceType": "CPU", "DeviceId": 0, "FaultCode": ["00000011"],
                                            "FaultLevel": "SeparateFault"}])
    (sig,), status = signals.noded_signals(fake.configmaps[key])
    assert status == "UnHealthy" and sig.kind == signals.NODE_HARDWARE
    assert sig.detail == "NodeStatus=UnHealthy [CPU0:00000011(SeparateFault)]"
    fake.set_node_info("n1", "Healthy")
    assert key not in fake.configmaps  # NodeD deletes it
    assert signals.noded_signals(None) == ([], "Healthy")


def test_node_object() -> None:
    fake = FakeKubernetesApi()
    fake.add_node("n1")
    assert signals.node_signals(fake.nodes["n1"], "n1") == []
    fake.set_ready("n1", "Unknown")
    (sig,) = signals.node_signals(fake.nodes["n1"], "n1")
    assert sig.kind == signals.NOT_READY and "Ready=Unknown" in sig.detail
    assert [s.kind for s in signals.node_signals(None, "n1")] == [signals.NODE_GONE]


@pytest.mark.skipif(not MIRROR.exists(), reason="MindCluster sources not mirrored here")
def test_names_are_mindcluster_v26_1_0s() -> None:
    """Every name the watcher relies on, found in the pinned release's sources."""
    def show(path: str) -> str:
        return subprocess.run(["git", f"--git-dir={MIRROR}", "show", f"{signals.MINDCLUSTER_RELEASE}:{path}"],
                              check=True, capture_output=True, text=True).stdout

    dp = show("component/ascend-device-plugin/pkg/common/constants.go")
    api = show("component/ascend-common/api/consts.go")
    names = show("component/ascend-common/api/default_name.go")
    noded = show("component/noded/pkg/common/constants.go")
    reporter = show("component/noded/pkg/reporter/cmreporter/configmap_reporter.go")
    writer = show("component/ascend-device-plugin/pkg/kubeclient/client_server.go")
    for text, line in (
        (dp, f'DeviceInfoCMNamePrefix = "{signals.DEVICE_INFO_PREFIX}"'),
        (dp, f'DeviceInfoCMManuallySeparateNPUKey = "{signals.MANUALLY_SEPARATE_KEY}"'),
        (api, f'KubeNS      = "{signals.DEVICE_INFO_NAMESPACE}"'),
        (api, f'DLNamespace = "{signals.NODE_INFO_NAMESPACE}"'),
        (api, f'DeviceInfoCMDataKey = "{signals.DEVICE_INFO_KEY}"'),
        (api, f'SwitchInfoCMDataKey = "{signals.SWITCH_INFO_KEY}"'),
        (api, f'NodeInfoCMDataKey = "{signals.NODE_INFO_KEY}"'),
        (api, f'CmCardUnhealthySuffix = "{signals.UNHEALTHY_SUFFIX}"'),
        (api, f'CmCardNetworkUnhealthySuffix = "{signals.NETWORK_UNHEALTHY_SUFFIX}"'),
        (api, f'CmRecoveringSuffix = "{signals.RECOVERING_SUFFIX}"'),
        (api, f'CmFaultListSuffix = "{signals.FAULT_LIST_SUFFIX}"'),
        (names, f'HuaweiAscend910 = "{signals.DEFAULT_NPU_RESOURCE}"'),
        (noded, f'NodeInfoCMNamePrefix = "{signals.NODE_INFO_PREFIX}"'),
        (noded, f'NodeUnHealthy = "{signals.NODED_UNHEALTHY}"'),
        (noded, f'PreSeparate = "{signals.NODED_PRESEPARATE}"'),
        (reporter, "Namespace: api.DLNamespace"),
        (reporter, "c.deleteHealthyCM()"),
        (writer, "Namespace: api.KubeNS"),
    ):
        assert line in text, line


def test_topology_from_a_plan_with_a_spare() -> None:
    plan = load_plan("a2-staging")
    spare = NodePlan(name="a2-node-07", host_ip="192.0.2.17", nic="eth0", device_count=8, super_pod_id=None,
                     role=None, devices_used=0)
    topo = Topology.from_plan(dataclasses.replace(plan, nodes=(*plan.nodes, spare)))
    assert topo.spares == ("a2-node-07",) and topo.instances_on("a2-node-07") == ()
    for inst in plan.instances:
        for node in inst.nodes:
            assert inst.name in topo.instances_on(node)
    assert Topology.from_dict(json.loads(json.dumps(topo.to_dict()))) == topo
    assert topo.node_role("a2-node-07") == "spare" and topo.npu_resource == "huawei.com/Ascend910"


async def test_a_failed_read_keeps_the_fault_and_rbac_of_the_objects_suffices() -> None:
    """The watcher under exactly the ClusterRole/Role of its objects: no call is denied; a read that
    fails (500) neither clears nor invents a fault; a rule removed is visible as denied reads."""
    from ascend_runtime.render.objects.faults import event_rules, namespace_rules, rules_for_nodes

    fake = FakeKubernetesApi()
    await fake.start()
    for node in TOPOLOGY.nodes:
        fake.add_node(node)
    events_role = ((event_rules(), signals.NODE_EVENT_NAMESPACE),)
    fake.bind(rules_for_nodes(list(TOPOLOGY.nodes)), namespace_rules(), "deepseek", events_role)
    fake.endpointslices[("deepseek", "pd-proxy")] = [
        {"endpoints": [{"addresses": ["10.1.0.7"], "conditions": {"ready": True}},
                       {"addresses": ["10.1.0.8"], "conditions": {"ready": False}},
                       {"addresses": ["10.1.0.9"], "conditions": {"ready": False, "terminating": True}}]}]
    async with aiohttp.ClientSession() as session:
        kube = KubeClient(KubeAuth(fake.url, token=fake.token), session)
        admin = ProxyAdmin(session, "t", service=ProxyService.parse("deepseek/pd-proxy:9000"), kube=kube, timeout_s=0.2)
        assert await admin.replicas() == ["http://10.1.0.7:9000", "http://10.1.0.8:9000"]
        admin.service = None  # no proxies to talk to in this test
        w = FaultWatcher(TOPOLOGY, kube, admin, WatcherConfig(event_namespace=signals.NODE_EVENT_NAMESPACE), session)
        fake.set_device_info("n-d1", unhealthy=("Ascend910-0",))
        await w.run_cycle()
        assert w.nodes["n-d1"].faulted and "decode-1" in w.drains
        path = "/api/v1/namespaces/kube-system/configmaps/" + signals.device_info_name("n-d1")
        fake.failing.add(path)
        fake.set_device_info("n-d1")  # the fault is over, but the API server cannot say so
        await w.run_cycle()
        assert w.nodes["n-d1"].faulted
        assert w.metrics.registry.get_sample_value("ascend_faults_read_errors_total", {"source": "device-plugin"}) == 1
        fake.failing.clear()
        await w.run_cycle()
        assert not w.nodes["n-d1"].faulted
        await w.close()
        assert fake.denied == [] and fake.events and fake.rejected_events == []
        # the restriction is real: without the ConfigMap rule every device plugin read is denied
        fake.bind(rules_for_nodes(list(TOPOLOGY.nodes))[:1], namespace_rules(), "deepseek", events_role)
        await w.run_cycle()
        assert len([d for d in fake.denied if "configmaps" in d[1]]) == 2 * len(TOPOLOGY.nodes)
    await fake.stop()
