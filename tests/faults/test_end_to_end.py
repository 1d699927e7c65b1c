"""The watcher against the real proxy (two replicas) and simulators on loopback, with FakeKubernetesApi.

"Within 5 s" is asserted structurally: the watch cycle here is 50 ms, and the proxies must show the
instance draining by the time the fake API answers the *second* read of the faulted node's
ConfigMap after the fault was written (the first read sees it, the drain happens in that cycle).
That bound is two poll intervals whatever the machine's speed; in production (1 s interval) it is
2 s on top of the device plugin's own report period. Wall-clock timeouts below only stop a hung test.

Every test fails without the watcher: nothing else drains (the proxies' own health checks are off),
and the spare-node test waits for the watcher's Event.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ascend_runtime.faults import signals
from ascend_runtime.faults.watcher import (
    REASON_DRAINED,
    REASON_RECOVERED,
    REASON_RECOVERY_FAILED,
    REASON_SPARE,
)

from .conftest import INTERVAL_S, Load, System, one_request, wait_for

CM_PATH = "/api/v1/namespaces/kube-system/configmaps/"


class DrainObserver:
    """Records, at every fake-API read of one node's device ConfigMap, whether the proxies drain ``instance``."""

    def __init__(self, system: System, node: str, instance: str, path: str | None = None) -> None:
        self.system, self.instance = system, instance
        self.path = path or CM_PATH + signals.device_info_name(node)
        self.after_fault: list[list[bool]] | None = None
        system.fake.observers.append(self._observe)

    def _observe(self, path: str) -> None:
        if path == self.path and self.after_fault is not None:
            self.after_fault.append(self.system.draining(self.instance))

    def fault_written(self) -> None:
        self.after_fault = []

    async def assert_drained_within_two_cycles(self) -> None:
        await wait_for(lambda: self.after_fault is not None and len(self.after_fault) >= 2,
                       "two reads of the faulted node after the fault")
        assert self.after_fault is not None
        first, second = self.after_fault[0], self.after_fault[1]
        assert first == [False, False], "the first read after the fault is the one that sees it"
        assert second == [True, True], f"{self.instance} not drained on every replica by the next cycle: {second}"


def metric(system: System, name: str, **labels: str) -> float | None:
    watcher = system.watchers[0][0]
    return watcher.metrics.registry.get_sample_value(name, labels)


async def test_link_fault_drains_within_two_cycles_and_in_flight_requests_finish(system: System) -> None:
    """A link fault on one of decode-0's nodes: drained everywhere by the next cycle; its running streams
    complete (a drain only stops new requests); every new request goes to decode-1; nothing fails."""
    system.watcher()
    observer = DrainObserver(system, "n-d0b", "decode-0")
    await wait_for(lambda: system.watchers[0][0].cycles >= 2, "the watcher running")
    load = Load(system.session, system.proxy_urls)
    load.start()
    await wait_for(lambda: len(load.streaming_on("decode-0")) >= 2, "streams running on decode-0")
    system.fake.set_device_info("n-d0b", network_unhealthy=("Ascend910-5",),
                                faults=[{"fault_type": "CardNetworkUnhealthy", "npu_name": "Ascend910-5",
                                         "fault_level": "SeparateNPU", "fault_handling": "SeparateNPU",
                                         "fault_code": "81078603"}])
    observer.fault_written()
    fault_at = time.monotonic()
    streaming = load.streaming_on("decode-0")
    await observer.assert_drained_within_two_cycles()
    drained_at = time.monotonic()
    await wait_for(lambda: len([r for r in load.results if r.sent_at > drained_at]) >= 12, "requests after the drain")
    results = await load.stop()

    assert len(streaming) >= 2, "no stream was running on decode-0 when the fault arrived"
    in_flight = [r for r in results if r.decode == "decode-0" and r.sent_at < fault_at and r.ended_at > fault_at]
    assert set(map(id, streaming)) <= set(map(id, in_flight))
    for r in in_flight:
        assert (r.status, r.done, r.error, r.broken, r.tokens) == (200, True, None, None, 96), r
    after = [r for r in results if r.sent_at > drained_at]
    assert after and {r.decode for r in after} == {"decode-1"}
    assert all(r.status == 200 and r.done and r.error is None for r in after)
    assert not [r for r in results if r.status != 200 or r.error or r.broken]

    await wait_for(lambda: system.fake.events_with(REASON_DRAINED), "the drain Event")
    (event,) = system.fake.events_with(REASON_DRAINED)
    assert event["involvedObject"]["kind"] == "Node" and event["involvedObject"]["name"] == "n-d0b"
    assert event["involvedObject"]["uid"] == system.fake.nodes["n-d0b"]["metadata"]["uid"]
    assert event["type"] == "Warning" and event["metadata"]["namespace"] == "default"
    assert "huawei.com/Ascend910-NetworkUnhealthy=Ascend910-5" in event["message"]
    assert "81078603 (SeparateNPU)" in event["message"]
    assert "decode-0 drained on 2 proxy replicas" in event["message"]
    assert system.fake.rejected_events == []
    assert metric(system, "ascend_faults_faulted_nodes", role="decode") == 1
    assert metric(system, "ascend_faults_node_faulted", node="n-d0b", role="decode", kind=signals.LINK) == 1
    assert metric(system, "ascend_faults_instance_drained", instance="decode-0", role="decode") == 1
    assert metric(system, "ascend_faults_signal_to_drain_seconds_count") == 1
    assert metric(system, "ascend_faults_drains_total", instance="decode-0") == 1
    assert system.draining("decode-1") == [False, False] and system.draining("prefill-0") == [False, False]


async def test_npu_fault_that_breaks_the_engine(system: System) -> None:
    """An NPU fault that stalls decode-0: its running streams continue on decode-1 once the proxy gives up on
    the stall (one whole answer each, no error); new requests are served by decode-1 from the next cycle on."""
    system.watcher()
    observer = DrainObserver(system, "n-d0a", "decode-0")
    load = Load(system.session, system.proxy_urls)
    load.start()
    await wait_for(lambda: len(load.streaming_on("decode-0")) >= 2, "streams running on decode-0")
    streaming = load.streaming_on("decode-0")
    system.sims["decode-0"].state.faults.update({"hang": True})  # the engine stops stepping
    system.fake.set_device_info("n-d0a", unhealthy=("Ascend910-2",))
    observer.fault_written()
    await observer.assert_drained_within_two_cycles()
    drained_at = time.monotonic()
    await wait_for(lambda: len([r for r in load.results if r.sent_at > drained_at]) >= 12, "requests after the drain")
    await wait_for(lambda: system.inflight("decode-0") == 0, "decode-0's streams to end (idle timeout)")
    results = await load.stop()

    assert streaming, "no stream was running on decode-0 when it stalled"
    for r in streaming:  # continued elsewhere after the stall: HTTP 200, every token, [DONE]; no error event
        assert r.status == 200 and r.broken is None and r.done and r.error is None and r.tokens == 96, r
    after = [r for r in results if r.sent_at > drained_at]
    assert after and {r.decode for r in after} == {"decode-1"}
    assert all(r.status == 200 and r.done and r.error is None and r.tokens == 96 for r in after)
    await wait_for(lambda: system.fake.events_with(REASON_DRAINED), "the drain Event")
    assert "huawei.com/Ascend910-Unhealthy=Ascend910-2" in system.fake.events_with(REASON_DRAINED)[0]["message"]


async def test_recovery_needs_clear_signals_health_and_a_pd_round_trip(system: System) -> None:
    """NodeD reports n-d1 UnHealthy: decode-1 drained. The ConfigMap goes away while the engine still
    hangs: decode-1 stays drained (health fails). Once the engine answers, it passes /health and a
    PD round trip and is undrained on both replicas; new requests reach it again."""
    w = system.watcher()
    nodeinfo = "/api/v1/namespaces/mindx-dl/configmaps/" + signals.node_info_name("n-d1")
    observer = DrainObserver(system, "n-d1", "decode-1", path=nodeinfo)
    system.sims["decode-1"].state.faults.update({"hang": True})
    system.fake.set_node_info("n-d1", "UnHealthy", [{"DeviceType": "CPU", "DeviceId": 0, "FaultCode": ["00000011"],
                                                    "FaultLevel": "SeparateFault"}])
    observer.fault_written()
    await observer.assert_drained_within_two_cycles()

    system.fake.set_node_info("n-d1", "Healthy")  # NodeD deletes its ConfigMap
    await wait_for(lambda: (metric(system, "ascend_faults_recovery_checks_total", instance="decode-1",
                                   outcome="failed") or 0) >= 2, "two failed recovery checks")
    assert system.draining("decode-1") == [True, True]
    assert "decode-1" in w.drains and not w.drains["decode-1"].recovered
    await wait_for(lambda: system.fake.events_with(REASON_RECOVERY_FAILED), "the recovery-failed Event")
    assert "/health" in system.fake.events_with(REASON_RECOVERY_FAILED)[0]["message"]

    seen_before = len(system.sims["decode-1"].state.request_ids)
    system.sims["decode-1"].state.faults.update({"hang": False})
    await wait_for(lambda: system.draining("decode-1") == [False, False], "decode-1 undrained on both replicas")
    assert len(system.sims["decode-1"].state.request_ids) > seen_before  # the PD round trip reached it directly
    await wait_for(lambda: system.fake.events_with(REASON_RECOVERED), "the recovered Event")
    (event,) = system.fake.events_with(REASON_RECOVERED)
    assert event["type"] == "Normal" and event["involvedObject"]["name"] == "n-d1"
    assert "decode-1 passed recovery checks" in event["message"] and "-> decode-1" in event["message"]
    assert metric(system, "ascend_faults_undrains_total", instance="decode-1") == 1
    assert metric(system, "ascend_faults_drained_instances") == 0
    # back in rotation: with decode-0 busy, new requests reach decode-1
    results = await asyncio.gather(*(one_request(system.session, system.proxy_urls[i % 2], 8) for i in range(8)))
    assert "decode-1" in {r.decode for r in results} and all(r.status == 200 and r.done for r in results)


async def test_a_fault_on_a_spare_node_drains_nothing(system: System) -> None:
    """n-spare is in the inventory but unused by the Plan: an Event says so, and no instance is drained."""
    w = system.watcher()
    assert w.topology.spares == ("n-spare",)
    system.fake.set_device_info("n-spare", unhealthy=("Ascend910-0", "Ascend910-1"))
    await wait_for(lambda: system.fake.events_with(REASON_SPARE), "the spare-node Event")
    cycles = w.cycles
    await wait_for(lambda: w.cycles >= cycles + 2, "two more cycles")
    for inst in w.topology.instances:
        assert system.draining(inst) == [False, False], inst
    assert w.drains == {}
    (event,) = system.fake.events_with(REASON_SPARE)
    assert event["involvedObject"]["name"] == "n-spare" and "nothing drained" in event["message"]
    assert metric(system, "ascend_faults_faulted_nodes", role="spare") == 1
    assert metric(system, "ascend_faults_spare_nodes", state="faulted") == 1
    assert metric(system, "ascend_faults_drained_instances") == 0
    results = await asyncio.gather(*(one_request(system.session, u, 8) for u in system.proxy_urls * 2))
    assert all(r.status == 200 and r.done for r in results)


async def test_node_not_ready_drains_and_a_replica_undrained_behind_its_back_is_drained_again(system: System) -> None:
    """The kubelet stops reporting on n-p0 (Ready=Unknown): prefill-0 drained; new requests prefill on
    prefill-1. Someone undrains it on one replica: the next cycle drains it again."""
    w = system.watcher()
    observer = DrainObserver(system, "n-p0", "prefill-0", path="/api/v1/nodes/n-p0")
    system.fake.set_ready("n-p0", "Unknown")
    observer.fault_written()
    await observer.assert_drained_within_two_cycles()
    results = await asyncio.gather(*(one_request(system.session, u, 8) for u in system.proxy_urls * 3))
    assert {r.prefill for r in results} == {"prefill-1"} and all(r.status == 200 and r.done for r in results)

    system.proxies[1].pool.drain("prefill-0", False)  # e.g. a proxy restarted from its instances file
    cycles = w.cycles
    await wait_for(lambda: w.cycles >= cycles + 2, "two more cycles")
    assert system.draining("prefill-0") == [True, True]
    assert metric(system, "ascend_faults_drains_total", instance="prefill-0") == 1  # one fault, one drain


async def test_an_instance_drained_before_its_fault_stays_drained(system: System) -> None:
    """An operator drained decode-1 for maintenance; a fault on its node comes and goes; the watcher
    does not put it back."""
    for p in system.proxies:
        p.pool.drain("decode-1", True)
    w = system.watcher()
    system.fake.set_device_info("n-d1", recovering=("Ascend910-4",))
    await wait_for(lambda: "decode-1" in w.drains and w.drains["decode-1"].preexisting is True, "the fault seen")
    system.fake.set_device_info("n-d1")
    await wait_for(lambda: "decode-1" not in w.drains, "the fault over")
    assert system.draining("decode-1") == [True, True]
    assert (metric(system, "ascend_faults_undrains_total", instance="decode-1") or 0) == 0


async def test_without_the_watcher_nothing_is_drained(system: System) -> None:
    """The checks above can fail: reads of the faulted ConfigMap without the watcher's drain fail the
    two-cycle assertion, and ten cycles' worth later nothing is drained and no Event exists."""
    from ascend_runtime.faults.kube import KubeAuth, KubeClient

    observer = DrainObserver(system, "n-d0b", "decode-0")
    system.fake.set_device_info("n-d0b", network_unhealthy=("Ascend910-5",))
    observer.fault_written()
    reader = KubeClient(KubeAuth(system.fake.url, token=system.fake.token), system.session)
    for _ in range(2):  # what a watcher that reads but does not drain would do
        await reader.get_configmap("kube-system", signals.device_info_name("n-d0b"))
        await asyncio.sleep(INTERVAL_S)
    with pytest.raises(AssertionError, match="not drained"):
        await observer.assert_drained_within_two_cycles()
    await asyncio.sleep(10 * INTERVAL_S)
    assert system.draining("decode-0") == [False, False]
    assert system.fake.events == []
