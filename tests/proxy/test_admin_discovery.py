"""Admin API, file discovery (change + SIGHUP), Kubernetes EndpointSlice events, the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import yaml

from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.discovery import KubernetesDiscovery
from ascend_runtime.proxy.server import start_proxy
from tests.proxy.conftest import free_port

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_admin_requires_token_and_manages_instances(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d0 = await stubs("decode", "d0")
    d1 = await stubs("decode", "d1")
    px = await proxy(p, d0, admin_token=TOKEN)
    for method, path in (("GET", "/admin/instances"), ("POST", "/admin/instances/add"),
                         ("POST", "/admin/instances/remove"), ("POST", "/admin/instances/drain")):
        async with http.request(method, px.url + path, json={}) as resp:
            assert resp.status == 401, path
        async with http.request(method, px.url + path, json={}, headers={"Authorization": "Bearer wrong"}) as resp:
            assert resp.status == 401, path
    async with http.post(px.url + "/admin/instances/add", headers=AUTH,
                         json={"name": "d1", "role": "decode", "url": d1.url}) as resp:
        assert resp.status == 200
        assert {i["name"] for i in (await resp.json())["instances"]} == {"p0", "d0", "d1"}
    async with http.post(px.url + "/admin/instances/drain", headers=AUTH, json={"name": "d0"}) as resp:
        assert resp.status == 200
    for _ in range(3):
        async with http.post(px.url + "/v1/completions", json={"prompt": "a", "max_tokens": 2}) as resp:
            assert resp.headers["x-decode-instance"] == "d1"
    async with http.post(px.url + "/admin/instances/remove", headers=AUTH, json={"name": "d1"}) as resp:
        assert resp.status == 200
    async with http.post(px.url + "/admin/instances/drain", headers=AUTH, json={"name": "d0", "drain": False}):
        pass
    async with http.get(px.url + "/admin/instances", headers=AUTH) as resp:
        listing = await resp.json()
    assert {i["name"] for i in listing["instances"]} == {"p0", "d0"}
    async with http.post(px.url + "/admin/instances/add", headers=AUTH, json={"role": "nope", "url": "x"}) as resp:
        assert resp.status == 400


async def test_admin_bodies_of_every_wrong_shape_get_400_and_change_nothing(stubs, proxy, http):
    """Each field the admin API reads, set to each JSON type: a 400 in the proxy's error shape naming the field
    (never a 500), and the instance list as it was."""
    p = await stubs("prefill", "p0")
    d0 = await stubs("decode", "d0")
    px = await proxy(p, d0, admin_token=TOKEN)
    values = [None, "", "abc", -1, 1e308, True, [], {}, [1], [{}], ["d0"], {"a": 1}]
    bodies = [("add", {"role": "decode", "url": d0.url, "name": "zz", "instances": v}) for v in values]
    bodies += [("remove", {"names": v}) for v in values if v not in (None, ["d0"])]
    bodies += [("remove", {"name": v}) for v in values if v != "abc"]
    bodies += [("drain", {"name": v}) for v in values if v != "abc"]
    bodies += [("add", [1, 2]), ("drain", "d0"), ("remove", 7), ("remove", {"name": "abc"}), ("drain", {"name": "abc"})]
    statuses = set()
    for route, body in bodies:
        async with http.post(px.url + f"/admin/instances/{route}", headers=AUTH, json=body) as resp:
            answer = await resp.json(content_type=None)
            statuses.add(resp.status)
            assert resp.status in (400, 404), (route, body, resp.status, answer)
            assert answer["error"]["code"] == resp.status, answer
    assert statuses == {400, 404}  # 404: well-formed names that are not instances ("abc")
    async with http.get(px.url + "/admin/instances", headers=AUTH) as resp:
        listing = await resp.json()
    assert {i["name"]: i["draining"] for i in listing["instances"]} == {"p0": False, "d0": False}


async def test_admin_disabled_without_token(stubs, proxy, http):
    px = await proxy(await stubs("prefill", "p0"))
    async with http.get(px.url + "/admin/instances", headers=AUTH) as resp:
        assert resp.status == 403


async def test_instances_file_reloaded_on_change(stubs, tmp_path, http):
    p = await stubs("prefill", "p0")
    d0 = await stubs("decode", "d0")
    d1 = await stubs("decode", "d1")
    path = tmp_path / "instances.yaml"
    path.write_text(yaml.safe_dump([{"name": "p0", "role": "prefill", "url": p.url},
                                    {"name": "d0", "role": "decode", "url": d0.url}]))
    px = await start_proxy(ProxyConfig(port=0, instances_file=path, file_poll_interval_s=0.05, health_interval_s=0))
    try:
        assert {s.name for s in px.pool.all()} == {"p0", "d0"}
        path.write_text(yaml.safe_dump({"prefill": [{"name": "p0", "url": p.url}],
                                        "decode": [{"name": "d1", "url": d1.url}]}))
        for _ in range(40):
            if px.pool.get("d0") is None:
                break
            await asyncio.sleep(0.05)
        assert {s.name for s in px.pool.all()} == {"p0", "d1"}
        path.write_text("[not: valid")  # a broken file keeps the current list
        assert px.reload() is False
        assert {s.name for s in px.pool.all()} == {"p0", "d1"}
    finally:
        await px.stop()


def _slice(name: str, endpoints: list[tuple[str, str, bool | None]], port: int = 8000) -> dict:
    return {"metadata": {"name": name}, "addressType": "IPv4",
            "ports": [{"name": "metrics", "port": 9000}, {"name": "http", "port": port}],
            "endpoints": [{"addresses": [addr], "conditions": {} if ready is None else {"ready": ready},
                           "targetRef": {"kind": "Pod", "name": pod}} for pod, addr, ready in endpoints]}


def test_kubernetes_endpointslice_events():
    applied = []
    k = KubernetesDiscovery(applied.append, "serving", {"prefill": "app=p", "decode": "app=d"})
    assert k.handle_event("prefill", {"type": "ADDED", "object": _slice("p-abc", [("prefill-0", "10.0.0.1", True),
                                                                                  ("prefill-1", "10.0.0.2", False)])})
    assert k.handle_event("decode", {"type": "ADDED", "object": _slice("d-abc", [("decode-0", "10.0.1.1", None)])})
    specs = {s.name: s for s in k.specs()}
    assert set(specs) == {"prefill-0", "decode-0"}
    assert specs["prefill-0"].url == "http://10.0.0.1:8000" and specs["decode-0"].role == "decode"
    # a pod becomes ready
    assert k.handle_event("prefill", {"type": "MODIFIED", "object": _slice("p-abc", [("prefill-0", "10.0.0.1", True),
                                                                                     ("prefill-1", "10.0.0.2", True)])})
    assert {s.name for s in k.specs()} == {"prefill-0", "prefill-1", "decode-0"}
    # same content again: no change; bookmarks and errors are ignored
    assert not k.handle_event("prefill", {"type": "MODIFIED", "object": _slice(
        "p-abc", [("prefill-0", "10.0.0.1", True), ("prefill-1", "10.0.0.2", True)])})
    assert not k.handle_event("prefill", {"type": "BOOKMARK", "object": {"metadata": {"name": "p-abc"}}})
    assert k.handle_event("decode", {"type": "DELETED", "object": _slice("d-abc", [])})
    assert {s.name for s in k.specs()} == {"prefill-0", "prefill-1"}


def test_kubernetes_events_with_client_model_objects():
    from kubernetes import client

    obj = client.V1EndpointSlice(
        address_type="IPv4", metadata=client.V1ObjectMeta(name="d-x"),
        ports=[client.DiscoveryV1EndpointPort(name="http", port=8100)],
        endpoints=[client.V1Endpoint(addresses=["10.1.1.1"], conditions=client.V1EndpointConditions(ready=True),
                                     target_ref=client.V1ObjectReference(kind="Pod", name="decode-7"))])
    k = KubernetesDiscovery(lambda s: None, "ns", {"decode": "app=d"})
    assert k.handle_event("decode", {"type": "ADDED", "object": obj})
    (spec,) = k.specs()
    assert (spec.name, spec.url) == ("decode-7", "http://10.1.1.1:8100")


async def test_kubernetes_discovery_feeds_a_running_proxy(stubs, http):
    """The watch thread's apply lands on the proxy's pool (fake API, no cluster)."""
    p = await stubs("prefill", "prefill-0")
    d = await stubs("decode", "decode-0")

    class FakeApi:
        def list_namespaced_endpoint_slice(self, **kwargs):  # pragma: no cover - replaced by fake stream
            raise AssertionError

    k = KubernetesDiscovery(lambda s: None, "ns", {}, api=FakeApi())
    px = await start_proxy(ProxyConfig(port=0, health_interval_s=0), k8s=k)
    try:
        for role, h in (("prefill", p), ("decode", d)):
            port = int(h.url.rsplit(":", 1)[1])
            ev = {"type": "ADDED", "object": {"metadata": {"name": f"{role}-slice"}, "ports": [{"name": "http",
                  "port": port}], "endpoints": [{"addresses": ["127.0.0.1"], "targetRef": {"name": f"{role}-0"}}]}}
            assert k.handle_event(role, ev)
        k.apply(k.specs())
        async with http.post(px.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as resp:
            assert resp.status == 200 and resp.headers["x-decode-instance"] == "decode-0"
    finally:
        await px.stop()


async def test_cli_serves_and_reloads_on_sighup(stubs, tmp_path):
    p = await stubs("prefill", "p0")
    d0 = await stubs("decode", "d0")
    d1 = await stubs("decode", "d1")
    path = tmp_path / "inst.json"
    path.write_text(json.dumps([{"name": "p0", "role": "prefill", "url": p.url},
                                {"name": "d0", "role": "decode", "url": d0.url}]))
    port = free_port()
    env = {**os.environ, "PROXY_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "ascend_runtime", "proxy", "--host", "127.0.0.1", "--port",
                             str(port), "--instances-file", str(path), "--admin-token-env", "PROXY_ADMIN_TOKEN",
                             "--health-interval-s", "0.5", "--log-level", "WARNING"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            deadline = time.monotonic() + 15
            while True:
                try:
                    async with http.get(url + "/health") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None
                await asyncio.sleep(0.1)
            async with http.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}) as resp:
                assert resp.headers["x-decode-instance"] == "d0"
            # change the file but keep its mtime and size: only SIGHUP can notice
            st = path.stat()
            path.write_text(path.read_text().replace(d0.url, d1.url).replace('"d0"', '"d1"'))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.kill(proc.pid, signal.SIGHUP)
            names: set[str] = set()
            for _ in range(50):
                async with http.get(url + "/admin/instances", headers=AUTH) as resp:
                    names = {i["name"] for i in (await resp.json())["instances"]}
                if names == {"p0", "d1"}:
                    break
                await asyncio.sleep(0.05)
            assert names == {"p0", "d1"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
