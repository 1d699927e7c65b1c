"""A proxy over stub engines under rank serving, for the rank-serving tests of the proxy, rollouts and the
P:D planner: each engine instance is ``ranks`` stub engines, endpoints ``<instance>-dp<rank>`` with
``instance`` set, all on 127.0.0.1 in the test's event loop."""

from __future__ import annotations

from dataclasses import dataclass

from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import InstanceSpec
from ascend_runtime.proxy.server import ProxyHandle, start_proxy
from tests.proxy.stub_engine import StubHandle, start_stub


@dataclass
class RankStack:
    """The stub engines (endpoint name -> handle) and the proxy routing to them."""

    stubs: dict[str, StubHandle]
    proxy: ProxyHandle

    async def stop(self) -> None:
        await self.proxy.stop()
        for handle in self.stubs.values():
            await handle.stop()


async def start_rank_stack(instances: dict[str, str], admin_token: str, ranks: int = 2,
                           decode_token_interval_s: float = 0.05) -> RankStack:
    """``instances``: engine instance name -> role; decode stubs send a token every ``decode_token_interval_s``
    seconds (streams last long enough to be seen in flight)."""
    stubs: dict[str, StubHandle] = {}
    specs = []
    for instance, role in instances.items():
        for rank in range(ranks):
            name = f"{instance}-dp{rank}"
            interval = decode_token_interval_s if role == "decode" else 0.0
            stubs[name] = await start_stub(role, name, token_interval_s=interval)
            specs.append(InstanceSpec(name=name, role=role, url=stubs[name].url, instance=instance))  # type: ignore[arg-type]
    proxy = await start_proxy(ProxyConfig(host="127.0.0.1", port=0, instances=specs, health_interval_s=0,
                                          admin_token=admin_token))
    return RankStack(stubs, proxy)
