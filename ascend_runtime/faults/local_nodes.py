"""The local stack's fault source: a simulated node is down when a process of the stack on its address died.

On the local target every simulated node is a loopback address of the inventory (127.0.1.x) and each
engine instance is a process listening on its leader node's address (``local/topology.py``). A node fault
is simulated by killing the processes on that address (``kill`` of the pids ``state.json`` records for it).
:class:`LocalNodes` answers the calls the watcher makes of the Kubernetes API the way the API server would
for such a node: ``GET`` of the Node gives ``Ready`` ``False`` (reason ``ProcessesDied``) while a process
recorded on its address is not alive, ``True`` otherwise; no MindCluster ConfigMap exists (no device plugin
runs locally); Events are logged instead of posted; there is no EndpointSlice (the proxy is given by URL).
``state.json`` is read again on every call, so a process the watcher replaced is judged by its new record.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from ascend_runtime.local.processes import is_alive
from ascend_runtime.local.state import StackState
from ascend_runtime.local.topology import ENGINE_KINDS
from ascend_runtime.planner.plan import Plan

log = logging.getLogger(__name__)
#: ``reason`` of the Ready condition of a simulated node whose processes died.
PROCESSES_DIED = "ProcessesDied"


def node_addresses(plan: Plan) -> dict[str, str]:
    """Node name -> its loopback address (the inventory's ``host_ip``)."""
    return {n.name: n.host_ip for n in plan.nodes}


def dead_on(state: StackState | None, address: str) -> list[str]:
    """Names of the engine processes recorded on ``address`` (their health URL's host) that are not alive."""
    if state is None:
        return []
    return [p.name for p in state.processes
            if p.kind in ENGINE_KINDS and urlsplit(p.health_url).hostname == address and not is_alive(p.pid)]


class LocalNodes:
    """The watcher's view of a running local stack's nodes (state directory ``state_dir``), in the Kubernetes
    API's shapes: :meth:`get_node` a core/v1 Node with its Ready condition, :meth:`get_configmap` None."""

    def __init__(self, plan: Plan, state_dir: Path, timeout_s: float = 2.0) -> None:
        self.addresses, self.state_dir = node_addresses(plan), state_dir
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    def _state(self) -> StackState | None:
        try:
            return StackState.load(self.state_dir)
        except Exception:  # noqa: BLE001 - a state file being rewritten reads as no news
            return None

    async def get_node(self, name: str) -> dict[str, Any] | None:
        """The Node ``name``: Ready False while a process on its address died; None for a name not in the Plan."""
        if name not in self.addresses:
            return None
        dead = dead_on(self._state(), self.addresses[name])
        condition = {"type": "Ready", "status": "False" if dead else "True",
                     "reason": PROCESSES_DIED if dead else "ProcessesAlive",
                     "message": f"not alive: {', '.join(dead)}" if dead else "every process on the node is alive"}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "status": {"conditions": [condition], "addresses": [{"type": "InternalIP",
                                                                    "address": self.addresses[name]}]}}

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """No MindCluster runs on the local target: no fault ConfigMap exists."""
        return None

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        """No DaemonSet pods on the local target."""
        return []

    async def list_endpointslices(self, namespace: str, service: str) -> list[dict[str, Any]]:
        """No Services on the local target (proxies are given by URL)."""
        return []

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        """Log what would be a Kubernetes Event."""
        log.info("event %s %s on node %s: %s", event.get("type"), event.get("reason"),
                 (event.get("involvedObject") or {}).get("name"), event.get("message"))
