"""Spare nodes for test copies of the committed inventories (test helpers, never used by the kit).

A spare is a copy of an inventory node with a name, host address and device addresses of its own: every
device IP (and on A3 VNIC IP and super device id) moved past the last one its super pod uses, so the
inventory checks (unique names and addresses, super device ids unique per super pod) still pass.
"""

from __future__ import annotations

import copy
from ipaddress import IPv4Address
from typing import Any


def _shift(address: str, by: int) -> str:
    return str(IPv4Address(address) + by)


def add_spare(inv: dict[str, Any], like: str, name: str, host_ip: str) -> dict[str, Any]:
    """Append to ``inv`` (an inventory document) a copy of node ``like`` named ``name`` at ``host_ip``.

    Its devices take addresses (and super device ids) above every one the nodes of its super pod use.
    Returns the new node's document.
    """
    source = next(n for n in inv["nodes"] if n["name"] == like)
    pod = source["devices"][0].get("super_pod_id")
    peers = [n for n in inv["nodes"] if n["devices"][0].get("super_pod_id") == pod]

    def past(key: str) -> int:  # how far to move ``key``'s addresses: just past the highest of the super pod
        highest = max(int(IPv4Address(d[key])) for n in peers for d in n["devices"])
        return highest - int(IPv4Address(source["devices"][0][key])) + 1

    spare = copy.deepcopy(source)
    spare.update(name=name, host_ip=host_ip)
    spare.pop("devices_out_of_service", None)
    ip_shift = past("device_ip")
    vnic_shift = past("vnic_ip") if source["devices"][0].get("vnic_ip") else 0
    top = max((d.get("super_device_id") or 0) for n in peers for d in n["devices"])
    for dev in spare["devices"]:
        dev["device_ip"] = _shift(dev["device_ip"], ip_shift)
        if dev.get("vnic_ip"):
            dev["vnic_ip"] = _shift(dev["vnic_ip"], vnic_shift)
        if dev.get("super_device_id") is not None:
            dev["super_device_id"] = dev["super_device_id"] - source["devices"][0]["super_device_id"] + top + 1
    inv["nodes"].append(spare)
    return spare


def cm384_spares(inv: dict[str, Any], per_pod: int = 1) -> list[str]:
    """``per_pod`` spares in each of cm384-prod's two super pods (``cm384-sp<p>-spare<k>``); their names."""
    names = []
    for pod in (0, 1):
        for k in range(1, per_pod + 1):
            name = f"cm384-sp{pod}-spare{k}"
            add_spare(inv, f"cm384-sp{pod}-node12" if k == 1 else f"cm384-sp{pod}-spare{k - 1}", name,
                      f"192.0.2.{200 + 10 * pod + k}")
            names.append(name)
    return names


def local_spares(inv: dict[str, Any], count: int = 1) -> list[str]:
    """``count`` spares after the local inventory's nodes (``sim-node-<11...>`` on 127.0.1.<11...>); their names."""
    names = []
    for k in range(count):
        index = len(inv["nodes"]) + 1
        name = f"sim-node-{index:02d}"
        add_spare(inv, inv["nodes"][-1]["name"], name, f"127.0.1.{index}")
        names.append(name)
    return names
