"""One machine per inventory node: no two nodes reach the same SSH host and port.

The playbook runner connects to each node at ``ssh_host`` (default ``host_ip``) and ``ssh_port`` (default
``ssh.port``); two nodes with the same pair are one machine, on which every playbook would act twice (the
facts playbook would write that machine's devices under both names, npu-network would configure it twice).
"""

from __future__ import annotations

from ascend_runtime.config.errors import Problem
from ascend_runtime.config.inventory import Inventory


def ssh_endpoint(inventory: Inventory, index: int) -> tuple[str, int]:
    """(host, port) node ``index`` is reached at over SSH; host names compared case-insensitively."""
    node = inventory.nodes[index]
    host = node.ssh_host if node.ssh_host is not None else str(node.host_ip)
    return host.lower(), node.ssh_port if node.ssh_port is not None else inventory.ssh.port


def ssh_endpoint_problems(inventory: Inventory) -> list[Problem]:
    """One problem per node whose SSH host and port an earlier node already has, naming both nodes."""
    first: dict[tuple[str, int], int] = {}
    problems = []
    for i, node in enumerate(inventory.nodes):
        endpoint = ssh_endpoint(inventory, i)
        if endpoint not in first:
            first[endpoint] = i
            continue
        j = first[endpoint]
        key = "ssh_host" if node.ssh_host is not None else "host_ip"
        what = "host IP" if key == "host_ip" and inventory.nodes[j].ssh_host is None else "SSH host and port"
        problems.append(Problem(
            f"inventory.nodes[{i}].{key}",
            f"{what} listed twice: nodes {inventory.nodes[j].name} (nodes[{j}]) and {node.name} (nodes[{i}]) are "
            f"both reached at {endpoint[0]}:{endpoint[1]} over SSH, one machine that every playbook would act on twice",
            endpoint[0], "give each node the ssh_host and ssh_port of its own machine"))
    return problems
