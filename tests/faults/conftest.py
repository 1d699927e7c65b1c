"""A PD system on loopback for the fault watcher: simulators, two proxy replicas, a fake Kubernetes API.

Topology (hand-written, like a Plan's): prefill-0 on n-p0, prefill-1 on n-p1, decode-0 on n-d0a and
n-d0b, decode-1 on n-d1, and n-spare, a node the Plan leaves unused. The proxies run without their
own health checks (``health_interval_s=0``), so only the watcher takes instances out of rotation.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from ascend_runtime.faults.kube import KubeAuth, KubeClient
from ascend_runtime.faults.signals import NODE_EVENT_NAMESPACE
from ascend_runtime.faults.proxies import ProxyAdmin
from ascend_runtime.faults.topology import Topology
from ascend_runtime.faults.watcher import FaultWatcher, WatcherConfig
from ascend_runtime.perf.sim_config import SimConfig
from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import specs_from_data
from ascend_runtime.proxy.server import ProxyHandle, start_proxy
from ascend_runtime.sim.server import SimHandle, start_simulator

from .fake_kube import FakeKubernetesApi

ADMIN_TOKEN = "proxy-admin-t0ken"
NAMESPACE = "deepseek"
MODEL = "deepseek-ai/DeepSeek-R1"
#: Watch cycle of the tests: small, so "within two cycles" is a tight bound.
INTERVAL_S = 0.05
#: Only a bound for a test that would otherwise hang; no assertion depends on it.
WAIT_S = 20.0

TOPOLOGY = Topology(
    stack="faults-test",
    nodes={"n-p0": "prefill", "n-p1": "prefill", "n-d0a": "decode", "n-d0b": "decode", "n-d1": "decode",
           "n-spare": None},
    instances={"prefill-0": ("prefill", ("n-p0",)), "prefill-1": ("prefill", ("n-p1",)),
               "decode-0": ("decode", ("n-d0a", "n-d0b")), "decode-1": ("decode", ("n-d1",))},
)


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    """Poll ``predicate`` until true; fail naming ``what`` after ``timeout`` (a hang guard, not a measure)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.01)


@dataclass
class Result:
    """One request through a proxy: when it was sent, where it went, how it ended."""

    sent_at: float
    proxy: str
    status: int = 0
    prefill: str = ""
    decode: str = ""
    ended_at: float = 0.0
    done: bool = False
    error: str | None = None
    tokens: int = 0
    broken: str | None = None  # the connection failed (no clean end)


@dataclass
class Load:
    """``workers`` clients sending streaming completions through the proxies in turn, until stopped."""

    session: aiohttp.ClientSession
    proxies: list[str]
    workers: int = 6
    max_tokens: int = 96
    results: list[Result] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]

    async def stop(self) -> list[Result]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.results

    async def _worker(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            url = self.proxies[(i + n) % len(self.proxies)]
            n += 1
            res = Result(sent_at=time.monotonic(), proxy=url)
            self.results.append(res)  # filled in while it streams
            await one_request(self.session, url, self.max_tokens, res)

    def on(self, decode: str) -> list[Result]:
        return [r for r in self.results if r.decode == decode]

    def streaming_on(self, decode: str) -> list[Result]:
        """Requests whose tokens are arriving from ``decode`` right now."""
        return [r for r in self.results if r.decode == decode and r.tokens > 0 and not r.ended_at]


async def one_request(session: aiohttp.ClientSession, proxy: str, max_tokens: int, res: Result | None = None) -> Result:
    """A streaming completion through ``proxy``, read event by event to the end."""
    res = res or Result(sent_at=time.monotonic(), proxy=proxy)
    body = {"model": MODEL, "prompt": "one two three four five six", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    buf = b""
    try:
        async with session.post(proxy + "/v1/completions", json=body) as resp:
            res.status = resp.status
            res.prefill = resp.headers.get("x-prefill-instance", "")
            res.decode = resp.headers.get("x-decode-instance", "")
            if resp.status != 200:
                res.error = (await resp.text())[:200]
                res.ended_at = time.monotonic()
                return res
            async for chunk in resp.content.iter_any():
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for event in events:
                    _account(res, event.decode())
    except aiohttp.ClientError as exc:
        res.broken = f"{type(exc).__name__}: {exc}"
    res.ended_at = time.monotonic()
    return res


def _account(res: Result, event: str) -> None:
    if not event.startswith("data: "):
        return
    data = event[6:]
    if data == "[DONE]":
        res.done = True
        return
    obj = json.loads(data)
    if "error" in obj:
        res.error = obj["error"].get("message", "error")
    for choice in obj.get("choices") or []:
        if choice.get("text"):
            res.tokens += 1


@dataclass(repr=False)
class System:
    """Everything a test drives."""

    fake: FakeKubernetesApi
    sims: dict[str, SimHandle]
    proxies: list[ProxyHandle]
    session: aiohttp.ClientSession
    watchers: list[tuple[FaultWatcher, asyncio.Event, asyncio.Task[None]]] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"System(proxies={self.proxy_urls}, sims={sorted(self.sims)}, fake={self.fake!r})"

    @property
    def proxy_urls(self) -> list[str]:
        return [p.url for p in self.proxies]

    def draining(self, instance: str) -> list[bool]:
        """The instance's drain flag in every proxy replica."""
        return [p.pool.get(instance).draining for p in self.proxies]  # type: ignore[union-attr]

    def inflight(self, instance: str) -> int:
        return sum(p.pool.get(instance).inflight for p in self.proxies)  # type: ignore[union-attr]

    def watcher(self, **overrides: Any) -> FaultWatcher:
        """Start the watcher (in this loop) against the fake API and both proxy replicas."""
        cfg = WatcherConfig(**{"interval_s": INTERVAL_S, "node_interval_s": INTERVAL_S, "settle_s": 0.0,
                               "recheck_s": INTERVAL_S, "check_timeout_s": 1.0, "event_namespace": NODE_EVENT_NAMESPACE,
                               "reporting_instance": "ascend-fault-watcher-test", **overrides})
        kube = KubeClient(KubeAuth(self.fake.url, token=self.fake.token), self.session, timeout_s=2.0)
        admin = ProxyAdmin(self.session, ADMIN_TOKEN, static=self.proxy_urls, timeout_s=2.0)
        w = FaultWatcher(TOPOLOGY, kube, admin, cfg, self.session)
        stop = asyncio.Event()
        self.watchers.append((w, stop, asyncio.create_task(w.run(stop))))
        return w


@pytest.fixture
async def system() -> AsyncIterator[System]:
    fake = FakeKubernetesApi()
    await fake.start()
    for node in TOPOLOGY.nodes:
        fake.add_node(node)
    sims: dict[str, SimHandle] = {}
    for name, (role, _) in TOPOLOGY.instances.items():
        sims[name] = await start_simulator(SimConfig(role=role, instance=name, port=0, kv_port=0, speedup=1.0,
                                                     exit_on_fault=False))
    specs = specs_from_data([{"name": n, "role": TOPOLOGY.role(n), "url": h.url} for n, h in sims.items()])
    # a stream idle this long is a stalled engine: long enough that a loaded machine pausing this one event
    # loop (simulators, proxies and clients together) is not taken for a stall, short beside WAIT_S
    proxies = [await start_proxy(ProxyConfig(port=0, instances=specs, admin_token=ADMIN_TOKEN, health_interval_s=0,
                                             stream_idle_timeout_s=4.0, first_token_timeout_s=8.0))
               for _ in range(2)]
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    sys_ = System(fake, sims, proxies, session)
    try:
        yield sys_
    finally:
        for w, stop, task in sys_.watchers:
            stop.set()
            await asyncio.wait_for(task, 10)
        for sim in sims.values():
            sim.state.faults.update({"hang": False})
        for p in proxies:
            await p.stop()
        # a hung simulator's requests outlive their clients; let them finish, or its stop waits for them
        try:
            await wait_for(lambda: all(s.state.engine.num_running == 0 and not s.state.engine.waiting
                                       for s in sims.values()), "the simulators idle", timeout=10.0)
        except AssertionError:
            pass
        for sim in sims.values():
            await sim.stop()
        await session.close()
        await fake.stop()
