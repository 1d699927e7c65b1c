"""Tolerant parsers for the output of ``npu-smi``, ``hccn_tool``, ``ip`` and version files.

Formats: facts file section 9. Tables are split on ``|`` (never on column
positions: widths differ between driver versions); both spellings are accepted
where two exist (``netdetect address`` / ``netdetect addr``, TLS lines with or
without ``tls preconfigured``). Each parser takes the command's stdout and
returns a flat ``dict``; a missing value is ``None``, never an exception.

Two reserved keys: ``_problems`` lists values that are present but impossible
(an address such as ``999.1.1.1``): the value is ``None`` and the engine fails
that device with the problem instead of using or writing it. ``_unset`` is true
when the output says the value is not set (``-ip -g`` on a port with no
address exits non-zero with "no ip was preset"): a reading, not a failure.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

HEALTH_VALUES = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$")
_IPV4 = r"(\d{1,3}(?:\.\d{1,3}){3})"
_ADDR = r"(\d[0-9.]*)"  # an address-like token, validated by _addr (so 1.2.3.4.5 is not read as 1.2.3.4)


def _addr(text: str, prefix: str, what: str, problems: list[str], flags: int = 0) -> str | None:
    """The IPv4 address after regex ``prefix`` in ``text``; an impossible one is a problem and None."""
    m = re.search(prefix + _ADDR, text, flags)
    if not m:
        return None
    value = m.group(1).rstrip(".")
    try:
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        problems.append(f"{what} {value!r} is not a valid IPv4 address")
        return None


def _with_problems(out: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    if problems:
        out["_problems"] = problems
    return out


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def npu_smi_info(text: str) -> dict[str, Any]:
    """``npu-smi info``: one entry per chip (A2: one per NPU; A3: two dies per NPU).

    Returns ``chips`` (list of {npu_id, name, chip, phy_id, health, bus_id}),
    ``chip_count``, ``npu_count``, ``unhealthy`` (``npu/chip=health`` strings),
    ``all_healthy`` and ``version``.
    """
    chips: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    version = None
    for line in text.splitlines():
        m = re.search(r"Version:\s*(\S+)", line)
        if m and version is None:
            version = m.group(1)
        if not line.strip().startswith("|"):
            continue
        cells = _cells(line)
        if any("Process id" in c or "Process name" in c for c in cells):
            break  # the process table follows; the device table is over
        if len(cells) < 2:
            continue
        first = cells[0].split()
        if cells[1] in HEALTH_VALUES and first and first[0].isdigit():
            pending = {"npu_id": int(first[0]), "name": first[1] if len(first) > 1 else "", "health": cells[1]}
        elif _BUS_ID.match(cells[1]) and first and first[0].isdigit() and pending is not None:
            chip = dict(pending)
            chip["chip"] = int(first[0])
            chip["phy_id"] = int(first[1]) if len(first) > 1 and first[1].isdigit() else None
            chip["bus_id"] = cells[1]
            chips.append(chip)
            pending = None
    unhealthy = [f"{c['npu_id']}/{c['chip']}={c['health']}" for c in chips if c["health"] != "OK"]
    return {
        "chips": chips,
        "chip_count": len(chips),
        "npu_count": len({c["npu_id"] for c in chips}),
        "unhealthy": unhealthy,
        "all_healthy": bool(chips) and not unhealthy,
        "version": version,
    }


def npu_smi_kv(text: str) -> dict[str, Any]:
    """Key/value outputs (``-l``, ``-t board``, ``-t health``, ``-t spod-info``): ``key : value`` lines.

    Keys are kept as printed (``Super Pod ID``) and also offered in snake case
    (``super_pod_id``). A key repeated (``NPU ID`` in ``-l``) keeps its first value.
    """
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not key:
            continue
        snake = re.sub(r"[^0-9a-z]+", "_", key.lower()).strip("_")
        out.setdefault(key, value)
        out.setdefault(snake, value)
    return out


def hccn_ip(text: str) -> dict[str, Any]:
    """``hccn_tool -i N -ip -g``: the RoCE port's ``ipaddr:`` / ``netmask:`` (never a ``vnic ipaddr:`` line)."""
    problems: list[str] = []
    ip = _addr(text, r"^\s*ipaddr\s*:\s*", "ipaddr", problems, re.MULTILINE)
    mask = _addr(text, r"^\s*netmask\s*:\s*", "netmask", problems, re.MULTILINE)
    link = re.search(r"^\s*link status\s*:\s*(\w+)", text, re.MULTILINE)
    out = {"ipaddr": ip, "netmask": mask, "link": link.group(1) if link else None}
    if ip is None and not problems and re.search(r"no ip was preset", text, re.IGNORECASE):
        out["_unset"] = True
    return _with_problems(out, problems)


def hccn_vnic(text: str) -> dict[str, Any]:
    """``hccn_tool -i N -vnic -g`` (A3): ``vnic ipaddr: ...``, the VNIC IP, a different address from ``-ip -g``."""
    problems: list[str] = []
    ip = _addr(text, r"vnic ipaddr\s*:\s*", "vnic ipaddr", problems)
    mask = _addr(text, r"vnic netmask\s*:\s*", "vnic netmask", problems)
    link = re.search(r"vnic link status\s*:\s*(\w+)", text)
    return _with_problems({"ipaddr": ip, "netmask": mask, "link": link.group(1) if link else None}, problems)


def hccn_link(text: str) -> dict[str, Any]:
    """``-link -g``: ``link status: UP`` or ``DOWN``."""
    m = re.search(r"link status\s*:\s*(\w+)", text)
    return {"status": m.group(1) if m else None}


def hccn_net_health(text: str) -> dict[str, Any]:
    """``-net_health -g``: ``net health status: Success`` (or a failure such as ``Receive timeout``)."""
    m = re.search(r"net health status\s*:\s*(.+)", text)
    return {"status": m.group(1).strip() if m else None}


#: what an unset address may read as: the tool prints the stored value, all zeros when nothing was set
UNSET_ADDRESS = "0.0.0.0"


def _unset_if_zero(address: str | None) -> str | None:
    """``0.0.0.0`` is never a gateway or netdetect target: it reads as unset (so setting one is not a
    *replacement* that needs ``--var replace_addresses=true``, and preflight's ``present`` fails on it)."""
    return None if address == UNSET_ADDRESS else address


def hccn_netdetect(text: str) -> dict[str, Any]:
    """``-netdetect -g``: ``netdetect address: X`` (newer drivers ``netdetect addr: X``); 0.0.0.0 = unset."""
    problems: list[str] = []
    address = _addr(text, r"netdetect addr(?:ess)?\s*:\s*", "netdetect address", problems)
    return _with_problems({"address": _unset_if_zero(address)}, problems)


def hccn_gateway(text: str) -> dict[str, Any]:
    """``-gateway -g``: ``default gateway:X, Iface:eth0``; 0.0.0.0 = unset."""
    problems: list[str] = []
    address = _addr(text, r"default gateway\s*:\s*", "default gateway", problems)
    iface = re.search(r"Iface\s*:\s*(\S+)", text)
    return _with_problems({"address": _unset_if_zero(address), "iface": iface.group(1) if iface else None}, problems)


def hccn_tls(text: str) -> dict[str, Any]:
    """``-tls -g``: ``dev_id:0, tls switch[0](...), tls preconfigured[1](...), ...`` (preconfigured optional)."""
    sw = re.search(r"tls switch\s*\[(\d+)\]", text)
    pre = re.search(r"tls preconfigured\s*\[(\d+)\]", text)
    dev = re.search(r"dev_id\s*:\s*(\d+)", text)
    return {
        "switch": sw.group(1) if sw else None,
        "preconfigured": pre.group(1) if pre else None,
        "dev_id": int(dev.group(1)) if dev else None,
    }


def hccn_ping(text: str) -> dict[str, Any]:
    """``-ping -g address X``: packets transmitted / received; ``ok`` when every packet came back."""
    m = re.search(r"(\d+)\s+packets transmitted,\s*(\d+)\s+received", text)
    sent, recv = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    return {"transmitted": sent, "received": recv, "ok": bool(m) and sent > 0 and sent == recv}


def key_value_file(text: str) -> dict[str, Any]:
    """``key=value`` files (``version.info``, ``ascend_toolkit_install.info``, ``hccn.conf``).

    Keys are kept as written and also lower-cased (``Version`` -> ``version``).
    """
    out: dict[str, Any] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), value.strip())
        out.setdefault(key.strip().lower(), value.strip())
    return out


def ip_addr(text: str) -> dict[str, Any]:
    """``ip -o -4 addr show``: ``addresses`` maps each IPv4 address to its interface."""
    addresses: dict[str, str] = {}
    problems: list[str] = []
    for line in text.splitlines():
        m = re.match(r"\s*\d+:\s*(\S+)\s+inet\s+" + _IPV4 + r"/\d+", line)
        if m:
            try:
                ipaddress.IPv4Address(m.group(2))
            except ValueError:
                problems.append(f"{m.group(1)} address {m.group(2)!r} is not a valid IPv4 address")
                continue
            addresses.setdefault(m.group(2), m.group(1).split("@")[0])
    return _with_problems({"addresses": addresses, "interfaces": sorted(set(addresses.values()))}, problems)


def raw(text: str) -> dict[str, Any]:
    """The output itself, stripped, as ``text``."""
    return {"text": text.strip()}


PARSERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "npu_smi_info": npu_smi_info,
    "npu_smi_kv": npu_smi_kv,
    "hccn_ip": hccn_ip,
    "hccn_vnic": hccn_vnic,
    "hccn_link": hccn_link,
    "hccn_net_health": hccn_net_health,
    "hccn_netdetect": hccn_netdetect,
    "hccn_gateway": hccn_gateway,
    "hccn_tls": hccn_tls,
    "hccn_ping": hccn_ping,
    "key_value": key_value_file,
    "ip_addr": ip_addr,
    "raw": raw,
}
