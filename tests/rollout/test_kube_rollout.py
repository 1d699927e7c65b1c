"""The Kubernetes driver end to end: the real ``kubernetes`` client against FakeWorkloadApi (a test double of
the API server and the LWS/Deployment controllers), simulators standing in for the instance leaders, two
proxy replicas, a load; the workloads are cm384-prod's as the Pulumi program registers them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from ascend_runtime.faults.proxies import ProxyAdmin
from ascend_runtime.planner import load_plan
from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import specs_from_data
from ascend_runtime.proxy.server import ProxyHandle, start_proxy
from ascend_runtime.render.objects import build_system
from ascend_runtime.rollout.kube import (
    RESTARTED_AT,
    KubeDriver,
    KubeWorkloads,
    api_client,
    instance_workloads,
)
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.rollout.order import Target, ordered
from ascend_runtime.rollout.postcheck import EnginePostCheck
from ascend_runtime.rollout.steps import Rollout, RolloutOptions
from ascend_runtime.sim.server import SimHandle, start_simulator

from .conftest import Load
from .fake_kube_workloads import FakeWorkloadApi

ADMIN_TOKEN = "rollout-proxy-t0ken"
NEW_IMAGE = "quay.io/ascend/vllm-ascend:v0.23.1-a3"
#: cm384-prod: prefill-k are single-node Deployments ``prefill-k-rank0``, decode-k LeaderWorkerSets.
INSTANCES = {"prefill-0": "prefill", "prefill-1": "prefill", "decode-0": "decode", "decode-1": "decode"}


@dataclass
class KubeSystem:
    fake: FakeWorkloadApi
    sims: dict[str, SimHandle]
    proxies: list[ProxyHandle]
    session: aiohttp.ClientSession
    targets: list[Target]
    driver: KubeDriver
    engine_ids: dict[str, list[str]] = field(default_factory=dict)
    seen_at_patch: list[tuple[str, dict[str, bool], int]] = field(default_factory=list)

    def rollout(self, lines: list[str], **options: float) -> Rollout:
        admin = ProxyAdmin(self.session, ADMIN_TOKEN, [p.url for p in self.proxies])
        return Rollout(self.targets, self.targets, admin, self.driver, EnginePostCheck(self.session, 10.0),
                       RolloutOptions(**{"drain_timeout_s": 30.0, "routable_timeout_s": 10.0, "poll_s": 0.02,
                                         **options}), lines.append)


@pytest.fixture
async def kube_system() -> AsyncIterator[KubeSystem]:
    plan = load_plan("cm384-prod")
    workloads = {n: w for n, w in instance_workloads(build_system(plan).engines).items() if n in INSTANCES}
    fake = FakeWorkloadApi(settle_reads=2)
    await fake.start()
    for obj in (o for n, objs in build_system(plan).engines.items() if n in INSTANCES for o in objs
                if o["kind"] in ("Deployment", "LeaderWorkerSet")):
        fake.add(obj)
    sims = {n: await start_simulator(SimConfig(role=r, instance=n, port=0, kv_port=0, speedup=50.0))
            for n, r in INSTANCES.items()}
    specs = specs_from_data([{"name": n, "role": r, "url": sims[n].url} for n, r in INSTANCES.items()])
    proxies = [await start_proxy(ProxyConfig(port=0, instances=specs, admin_token=ADMIN_TOKEN, health_interval_s=0))
               for _ in range(2)]
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    targets = ordered((n, r, int(n[-1]), sims[n].url) for n, r in INSTANCES.items())
    api = KubeWorkloads(api_client(fake.url, fake.token, None))
    driver = KubeDriver(api, workloads, NEW_IMAGE, ready_timeout_s=10.0, poll_s=0.02)
    system = KubeSystem(fake, sims, proxies, session, targets, driver,
                        engine_ids={n: [h.engine_id] for n, h in sims.items()})

    async def new_engine(kind: str, name: str) -> None:  # the controller started the new group: a new engine
        inst = name.removesuffix("-rank0")
        old = system.sims[inst]
        await old.stop()
        system.sims[inst] = await start_simulator(old.config.model_copy(update={"port": old.port, "kv_port": old.kv_port}))
        system.engine_ids[inst].append(system.sims[inst].engine_id)

    def at_patch(kind: str, name: str) -> None:
        inst = name.removesuffix("-rank0")
        pool = proxies[0].pool
        system.seen_at_patch.append((inst, {n: pool.get(n).draining for n in INSTANCES},  # type: ignore[union-attr]
                                     sum(p.pool.get(inst).inflight for p in proxies)))  # type: ignore[union-attr]

    fake.on_ready, fake.on_patch = new_engine, at_patch
    try:
        yield system
    finally:
        for p in proxies:
            await p.stop()
        for sim in system.sims.values():
            await sim.stop()
        await session.close()
        await fake.stop()


def _images(obj: dict) -> list[str]:
    if obj["kind"] == "LeaderWorkerSet":
        lwt = obj["spec"]["leaderWorkerTemplate"]
        templates = [lwt["leaderTemplate"], lwt["workerTemplate"]]
    else:
        templates = [obj["spec"]["template"]]
    return [c["image"] for t in templates for c in t["spec"]["containers"] if c["name"] == "engine"]


async def test_every_instance_patched_in_order_drained_and_idle_with_zero_failed_requests(kube_system: KubeSystem) -> None:
    s = kube_system
    old_image = _images(s.fake.get("LeaderWorkerSet", "decode-0"))[0]
    assert old_image != NEW_IMAGE
    s.fake.race_once.add("decode-1")  # a concurrent writer: the patch's resourceVersion test fails once
    load = Load(s.proxies[0].url, workers=8)
    await load.start()
    await asyncio.sleep(0.3)
    lines: list[str] = []
    outcome = await s.rollout(lines).run()
    await asyncio.sleep(0.3)
    await load.stop()

    assert outcome.ok and outcome.done == ["prefill-0", "prefill-1", "decode-0", "decode-1"], lines
    assert load.failures == [] and len(load.results) > 10, [r.error for r in load.failures][:5]
    # each workload patched while its instance, and only it, was drained on the proxies with nothing in flight
    assert [i for i, _, _ in s.seen_at_patch] == ["prefill-0", "prefill-1", "decode-0", "decode-1", "decode-1"]
    for inst, draining, inflight in s.seen_at_patch:
        assert draining == {n: n == inst for n in INSTANCES} and inflight == 0, (inst, draining, inflight)
    assert [(k, n) for k, n, _ in s.fake.patches] == [
        ("Deployment", "prefill-0-rank0"), ("Deployment", "prefill-1-rank0"),
        ("LeaderWorkerSet", "decode-0"), ("LeaderWorkerSet", "decode-1")]
    assert [r for r in s.fake.rejected if "test failed" not in r[1]] == []  # every patched object still valid
    assert len(s.fake.rejected) == 1  # the raced patch, retried once
    for kind, name in (("Deployment", "prefill-0-rank0"), ("Deployment", "prefill-1-rank0"),
                       ("LeaderWorkerSet", "decode-0"), ("LeaderWorkerSet", "decode-1")):
        obj = s.fake.get(kind, name)
        assert _images(obj) == [NEW_IMAGE] * (2 if kind == "LeaderWorkerSet" else 1), name
        assert obj["metadata"]["generation"] == 2, name
        templates = ([obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"], obj["spec"]["leaderWorkerTemplate"]
                     ["workerTemplate"]] if kind == "LeaderWorkerSet" else [obj["spec"]["template"]])
        assert all(RESTARTED_AT in t["metadata"]["annotations"] for t in templates)
    # every instance's engine was replaced by the new group and passed the post-check there
    assert all(len(ids) == 2 and ids[0] != ids[1] for ids in s.engine_ids.values()), s.engine_ids
    assert all(h.state.request_ids for h in s.sims.values())
    for p in s.proxies:
        assert all(st.routable(0) for st in p.pool.all())


async def test_a_group_that_never_gets_ready_stops_the_rollout_and_stays_drained(kube_system: KubeSystem) -> None:
    s = kube_system
    s.fake.never_ready.add("prefill-1-rank0")
    s.driver.ready_timeout_s = 0.5
    lines: list[str] = []
    outcome = await s.rollout(lines).run()

    assert (outcome.failed, outcome.step, outcome.left_drained) == ("prefill-1", "replace", True), lines
    assert "not ready after 0.5 s" in outcome.reason and "pods available 0/1" in outcome.reason
    assert outcome.done == ["prefill-0"] and outcome.untouched == ["decode-0", "decode-1"]
    assert [n for _, n, _ in s.fake.patches] == ["prefill-0-rank0", "prefill-1-rank0"]
    for name in ("decode-0", "decode-1"):  # untouched: the old image, generation 1
        obj = s.fake.get("LeaderWorkerSet", name)
        assert obj["metadata"]["generation"] == 1 and NEW_IMAGE not in _images(obj)
    for p in s.proxies:
        assert p.pool.get("prefill-1").draining  # type: ignore[union-attr]
        assert not any(p.pool.get(n).draining for n in ("prefill-0", "decode-0", "decode-1"))  # type: ignore[union-attr]
