"""The A3 VNIC IP and the RoCE port IP are kept apart by facts, npu-network and preflight (real sshd, fake hccn_tool).

On A2 and A3 ``hccn_tool -i N -ip -g`` reads the RoCE port IP: the inventory's
``device_ip``, hccl.json ``device_ip`` and hccn.conf ``address_N``. On A3
``-vnic -g`` reads a different address, the VNIC IP (the inventory's
``vnic_ip``), which only the LLMDataDist PD rank table uses. A VNIC address must
never be written to a RoCE port. The fake hccn_tool holds both addresses per
device and records every ``-s`` command it receives (``Lab.calls``).
"""

from __future__ import annotations

import pytest
import yaml

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.config.inventory import Device, Inventory
from ascend_runtime.config.loader import parse_inventory
from tests.hosts.conftest import KIND_DEVICES, planned_ip, planned_vnic_ip, results

N_HOSTS = 4


def _vnic_addresses() -> set[str]:
    return {planned_vnic_ip(i, d) for i in range(N_HOSTS) for d in range(KIND_DEVICES["a3"])}


def _assert_no_vnic_on_roce(lab) -> None:
    """No -s command ever carried a VNIC address, and no RoCE port holds one."""
    vnics = _vnic_addresses()
    for i in range(N_HOSTS):
        for call in lab.calls(i):
            assert not set(call.split()) & vnics, f"host {i}: VNIC address written by `hccn_tool {call}`"
            assert "-vnic" not in call.split(), f"host {i}: VNIC set attempted: {call}"
        state = lab.state(i)
        for d in range(KIND_DEVICES[lab.kind]):
            assert state[f"dev.{d}.ip"] not in vnics, (i, d)
        conf = (lab.hosts[i].dir / "hccn.conf").read_text()
        assert not {line.partition("=")[2] for line in conf.splitlines()} & vnics, conf


def test_a3_facts_then_npu_network_leave_roce_ips_alone(lab) -> None:
    lab.set_kind("a3")
    lab.write_inventory(lab.inventory(with_devices=False))
    rc, report = lab.run("facts")
    assert rc == 0, results(report, status="fail")
    inv = yaml.safe_load(lab.inventory_path.read_text())
    for i, node in enumerate(inv["nodes"]):
        devs = node["devices"]
        assert [d["device_ip"] for d in devs] == [planned_ip(i, d) for d in range(16)], node["name"]
        assert [d["vnic_ip"] for d in devs] == [planned_vnic_ip(i, d) for d in range(16)], node["name"]
        assert devs[3]["netmask"] == "255.255.255.0"  # the RoCE netmask, from -ip -g
    assert lab.calls(0) == []  # facts never sets anything

    rc, report = lab.run("npu-network")
    assert rc == 0, results(report, status="fail")
    assert results(report, status="changed") == []
    for i, node in enumerate(inv["nodes"]):
        state = lab.state(i)
        assert lab.calls(i) == [], f"{node['name']}: npu-network changed a host whose RoCE IPs were as planned"
        for d in range(16):
            assert state[f"dev.{d}.ip"] == node["devices"][d]["device_ip"] == planned_ip(i, d)
            assert state[f"dev.{d}.vnic_ip"] == planned_vnic_ip(i, d)
    assert {r["step"] for r in results(report, "a3-node-00", "ok")} >= {
        "device IP and netmask", "verify device IP", "verify VNIC IP"}
    _assert_no_vnic_on_roce(lab)

    rc, report = lab.run("preflight")
    assert rc == 0, results(report, status="fail")
    oks = {r["step"] for r in results(report, "a3-node-02", "ok")}
    assert {"device IP as planned", "VNIC IP as planned"} <= oks


def test_a3_roce_drift_is_repaired_with_the_roce_ip(lab) -> None:
    lab.set_kind("a3")
    lab.update_state(0, **{"dev.3.ip": "198.51.100.250"})
    rc, report = lab.run("npu-network", "--check")
    assert rc == 0 and all(lab.calls(i) == [] for i in range(N_HOSTS))
    rc, report = lab.run("npu-network")  # a configured address is replaced only with consent
    assert rc == 1 and lab.calls(0) == [] and lab.state(0)["dev.3.ip"] == "198.51.100.250"
    rc, report = lab.run("npu-network", "--var", "replace_addresses=true")
    assert rc == 0, results(report, status="fail")
    assert lab.calls(0) == [f"-i 3 -ip -s address {planned_ip(0, 3)} netmask 255.255.255.0"]
    assert lab.state(0)["dev.3.ip"] == planned_ip(0, 3)
    assert lab.state(0)["dev.3.vnic_ip"] == planned_vnic_ip(0, 3)
    assert f"address_3={planned_ip(0, 3)}" in (lab.hosts[0].dir / "hccn.conf").read_text()
    _assert_no_vnic_on_roce(lab)


def test_a3_vnic_drift_is_reported_never_set(lab) -> None:
    lab.set_kind("a3")
    lab.update_state(1, **{"dev.5.vnic_ip": "203.0.113.250"})
    rc, report = lab.run("npu-network")
    assert rc == 1 and report["failed_hosts"] == ["a3-node-01"]
    (vnic,) = results(report, "a3-node-01", "fail")
    assert vnic["step"] == "verify VNIC IP" and f"device 5: ipaddr=203.0.113.250 (want {planned_vnic_ip(1, 5)})" in vnic["message"]
    assert all(lab.calls(i) == [] for i in range(N_HOSTS))
    assert lab.state(1)["dev.5.ip"] == planned_ip(1, 5)
    rc, report = lab.run("preflight")
    assert rc == 1 and report["failed_hosts"] == ["a3-node-01"]
    assert {r["step"] for r in results(report, "a3-node-01", "fail")} == {"VNIC IP as planned"}


def test_a3_facts_refuse_a_vnic_reading_the_roce_address(lab) -> None:
    lab.set_kind("a3")
    before = lab.inventory_path.read_text()
    lab.update_state(2, **{"dev.0.vnic_ip": planned_ip(2, 0)})
    rc, report = lab.run("facts")
    assert rc == 1 and report["failed_hosts"] == ["a3-node-02"]
    (bad,) = results(report, "a3-node-02", "fail")
    assert bad["step"] == "inventory facts" and "device 0" in bad["message"] and "vnic_ip" in bad["message"]
    after = yaml.safe_load(lab.inventory_path.read_text())
    assert after["nodes"][2]["devices"] == yaml.safe_load(before)["nodes"][2]["devices"]  # kept as it was
    assert after["nodes"][1]["devices"][0]["vnic_ip"] == planned_vnic_ip(1, 0)


def test_a2_runs_no_vnic_command(lab) -> None:
    lab.write_inventory(lab.inventory(with_devices=False))
    rc, report = lab.run("facts")
    assert rc == 0, results(report, status="fail")
    inv = yaml.safe_load(lab.inventory_path.read_text())
    assert all("vnic_ip" not in d for n in inv["nodes"] for d in n["devices"])
    assert [d["device_ip"] for d in inv["nodes"][2]["devices"]] == [planned_ip(2, d) for d in range(8)]
    lab.update_state(0, **{"dev.1.ip": "198.51.100.250"})
    for book, extra in (("npu-network", ("--var", "replace_addresses=true")), ("preflight", ())):
        rc, report = lab.run(book, *extra)
        assert rc == 0, (book, results(report, status="fail"))
    assert lab.calls(0) == [f"-i 1 -ip -s address {planned_ip(0, 1)} netmask 255.255.255.0"]
    for i in range(N_HOSTS):
        assert not [c for c in lab.invocations(i) if "-vnic" in c.split()], f"host {i} ran a vnic command"


def test_a2_inventory_with_vnic_ip_is_refused(lab, capsys) -> None:
    inv = lab.inventory()
    inv["nodes"][1]["devices"][4]["vnic_ip"] = "203.0.113.99"
    lab.write_inventory(inv)
    rc, _ = lab.run("preflight")
    assert rc == 2
    out = capsys.readouterr().out
    assert "nodes[1].devices[4].vnic_ip" in out and "A3" in out
    assert all(lab.invocations(i) == [] for i in range(N_HOSTS))
    # an --inventory override is not checked with the stack: the runner refuses those hosts, runs the others
    override = lab.tmp / "override.yaml"
    override.write_text(yaml.safe_dump(inv, sort_keys=False))
    lab.write_inventory(lab.inventory())
    rc, report = lab.run("preflight", "--inventory", str(override))
    assert rc == 1 and report["failed_hosts"] == ["a2-node-01"]
    (refused,) = results(report, "a2-node-01")
    assert refused["step"] == "inventory" and "nodes[1].devices[4].vnic_ip" in refused["message"]
    assert lab.invocations(1) == [] and lab.invocations(0)
    # the same check, without SSH
    problems = Inventory.model_validate(inv).hardware_problems("atlas-800i-a2")
    assert [p.path for p in problems] == ["inventory.nodes[1].devices[4].vnic_ip"]
    assert Inventory.model_validate(inv).hardware_problems("cm384") == []


def test_vnic_ip_equal_to_device_ip_is_refused() -> None:
    with pytest.raises(ValueError, match="vnic_ip"):
        Device(device_id=0, device_ip="198.51.100.10", vnic_ip="198.51.100.10")
    with pytest.raises(ConfigError) as err:
        parse_inventory({"nodes": [{"name": "n", "host_ip": "192.0.2.1", "devices": [
            {"device_id": 0, "device_ip": "198.51.100.10", "vnic_ip": "198.51.100.10"}]}]})
    assert "inventory.nodes[0].devices[0]" in str(err.value) and "vnic_ip" in str(err.value)
    assert Device(device_id=0, device_ip="198.51.100.10", vnic_ip="203.0.113.10").vnic_ip is not None
