"""DrainRestartApplier against the real proxy admin API, with a fake Kubernetes core API."""

from __future__ import annotations

from types import SimpleNamespace

import aiohttp

from ascend_runtime.balancer.apply import DrainRestartApplier
from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import InstanceSpec
from ascend_runtime.proxy.server import start_proxy

TOKEN = "balancer-token"


def _pod(name: str, uid: str, ready: bool) -> SimpleNamespace:
    cond = SimpleNamespace(type="Ready", status="True" if ready else "False")
    return SimpleNamespace(metadata=SimpleNamespace(name=name, uid=uid), status=SimpleNamespace(conditions=[cond]))


class FakeCore:
    """Deleting a pod replaces it with a new uid, Ready after one listing; records every call."""

    def __init__(self, proxy_pool, name: str) -> None:
        self.pods = [_pod(f"{name}-0", "u0", True)]
        self.pool, self.name = proxy_pool, name
        self.calls: list[tuple[str, bool]] = []  # (call, instance draining at that moment)
        self.gen = 0

    def _draining(self) -> bool:
        return self.pool.get(self.name).draining

    def list_namespaced_pod(self, namespace: str, label_selector: str):
        self.calls.append(("list", self._draining()))
        for i, p in enumerate(self.pods):
            if p.metadata.uid != "u0":
                self.pods[i] = _pod(p.metadata.name, p.metadata.uid, True)
        return SimpleNamespace(items=list(self.pods))

    def delete_namespaced_pod(self, name: str, namespace: str):
        self.calls.append(("delete", self._draining()))
        self.gen += 1
        self.pods = [_pod(name, f"u{self.gen}", False)]


async def _proxy():
    cfg = ProxyConfig(host="127.0.0.1", port=0, admin_token=TOKEN, health_interval_s=0,
                      instances=[InstanceSpec(name="p0", role="prefill", url="http://127.0.0.1:9"),
                                 InstanceSpec(name="d0", role="decode", url="http://127.0.0.1:9")])
    return await start_proxy(cfg)


async def test_drain_restart_undrains_through_the_existing_proxy_api():
    px = await _proxy()
    try:
        core = FakeCore(px.proxy.pool, "d0")
        applier = DrainRestartApplier("d0", px.url, TOKEN, core, "ns", "app=d0", drain_wait_s=1.0, poll_s=0.01)
        async with aiohttp.ClientSession() as s:
            res = await applier.apply(s, {})
        assert res.ok, res.detail
        assert ("delete", True) in core.calls  # restarted while drained
        assert px.proxy.pool.get("d0").draining is False  # re-admitted by the proxy's own undrain
        assert core.pods[0].metadata.uid != "u0"
    finally:
        await px.stop()


async def test_drain_restart_refuses_unknown_instance_and_bad_token():
    px = await _proxy()
    try:
        core = FakeCore(px.proxy.pool, "d0")
        async with aiohttp.ClientSession() as s:
            res = await DrainRestartApplier("nope", px.url, TOKEN, core, "ns", "x", poll_s=0.01).apply(s, {})
            assert not res.ok and "does not list" in res.detail
            res = await DrainRestartApplier("d0", px.url, "wrong", core, "ns", "x", poll_s=0.01).apply(s, {})
            assert not res.ok and "401" in res.detail
        assert core.calls == [] and px.proxy.pool.get("d0").draining is False
    finally:
        await px.stop()
