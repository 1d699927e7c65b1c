"""Playbooks over real SSH against the fake Atlas hosts of conftest.py (one scenario per test)."""

from __future__ import annotations

import pytest
import yaml

from tests.hosts.conftest import planned_ip, results


def _fail_steps(report: dict, host: str) -> set[str]:
    return {r["step"] for r in results(report, host, "fail")}


def test_all_healthy_preflight_and_facts_stable(lab) -> None:
    rc, report = lab.run("preflight")
    assert rc == 0, results(report, status="fail")
    assert report["failed_hosts"] == []
    # facts: start from an inventory with no devices / versions and a wrong NIC
    bare = lab.inventory(with_devices=False)
    for node in bare["nodes"]:
        node["nic"] = "eth9"
    lab.write_inventory(bare)
    rc, report = lab.run("facts")
    assert rc == 0, results(report, status="fail")
    assert report["inventory_written"] is True
    first = lab.inventory_path.read_bytes()
    inv = yaml.safe_load(first)
    node = inv["nodes"][1]
    assert node["nic"] == "enp189s0f0"
    assert node["versions"] == {"driver": "24.1.rc3", "firmware": "7.5.0.1.129", "cann": "8.1.RC1"}
    assert [d["device_ip"] for d in node["devices"]] == [planned_ip(1, d) for d in range(8)]
    assert node["devices"][0]["netdetect"] == "198.51.100.1"  # host 1 prints the newer "netdetect addr:"
    mtime = lab.inventory_path.stat().st_mtime_ns
    rc, report = lab.run("facts")
    assert rc == 0 and report["inventory_written"] is False
    assert lab.inventory_path.read_bytes() == first and lab.inventory_path.stat().st_mtime_ns == mtime


def test_faults_reported_against_host_and_step(lab) -> None:
    lab.update_state(0, **{"dev.3.link": "DOWN"})
    lab.update_state(1, **{"dev.5.present": "0"})
    (lab.tmp / "root2/usr/local/Ascend/driver/version.info").write_text("Version=23.0.rc3\n")
    rc, report = lab.run("preflight")
    assert rc == 1
    assert set(report["failed_hosts"]) == {"a2-node-00", "a2-node-01", "a2-node-02"}
    assert _fail_steps(report, "a2-node-00") == {"link UP"}
    (link,) = results(report, "a2-node-00", "fail")
    assert "device 3: status=DOWN (want UP)" in link["message"]
    assert "NPU device count" in _fail_steps(report, "a2-node-01")
    (count,) = [r for r in results(report, "a2-node-01", "fail") if r["step"] == "NPU device count"]
    assert "chip_count=7 (want 8)" in count["message"]
    assert _fail_steps(report, "a2-node-02") == {"driver version"}
    (drv,) = results(report, "a2-node-02", "fail")
    assert "23.0.rc3 is below the supported minimum 24.1.rc1" in drv["message"]
    assert _fail_steps(report, "a2-node-03") == set()


def test_tls_switch_differs_is_cross_host_failure(lab) -> None:
    lab.update_state(2, **{f"dev.{d}.tls": "1" for d in range(8)})
    rc, report = lab.run("preflight")
    assert rc == 1 and report["failed_hosts"] == ["a2-node-02"]
    (tls,) = results(report, "a2-node-02", "fail")
    assert tls["step"] == "TLS switch same on all hosts" and tls["cross_host"] is True
    assert "1 on a2-node-02" in tls["message"] and "0 on a2-node-00, a2-node-01, a2-node-03" in tls["message"]


def test_unreachable_host_reported_others_complete(lab) -> None:
    inv = lab.inventory()
    dead = dict(inv["nodes"][0], name="a2-node-dead", host_ip="192.0.2.99", ssh_host="127.0.0.9", ssh_port=1)
    inv["nodes"].append(dead)
    lab.write_inventory(inv)
    rc, report = lab.run("preflight")
    assert rc == 1 and report["failed_hosts"] == ["a2-node-dead"] and report["unreachable"] == ["a2-node-dead"]
    (conn,) = results(report, "a2-node-dead")
    assert conn["step"] == "connect" and "unreachable" in conn["message"]
    for i in range(4):
        assert len(results(report, f"a2-node-0{i}", "ok")) >= 12


def test_changed_host_key_refused_nothing_run(lab, ssh_lab, capsys) -> None:
    other = lab.hosts[2].host_pub.split()
    lines = lab.known_hosts.read_text().splitlines()
    host1 = lab.hosts[1]
    lines[1] = f"[{host1.addr}]:{host1.port} {other[0]} {other[1]}"  # a different key for host 1
    lab.known_hosts.write_text("\n".join(lines) + "\n")
    lab.update_state(1, **{"dev.0.ip": "198.51.100.250"})
    rc, report = lab.run("npu-network")
    assert rc == 1 and report["failed_hosts"] == ["a2-node-01"]
    (refused,) = results(report, "a2-node-01")
    assert refused["step"] == "connect" and "HOST KEY CHANGED" in refused["message"]
    assert "SHA256:" in refused["message"] and "ssh-keygen -R" in refused["message"]
    assert lab.invocations(1) == [] and lab.calls(1) == []
    out = capsys.readouterr().out
    assert "HOST KEY CHANGED" in out
    # --accept-new-host-keys never overrides a changed key
    rc, report = lab.run("preflight", "--accept-new-host-keys", "--limit", "a2-node-01")
    assert rc == 1 and lab.invocations(1) == []


def test_unknown_host_key_refused_then_trusted_with_flag(lab) -> None:
    lines = lab.known_hosts.read_text().splitlines()
    lab.known_hosts.write_text("\n".join(lines[:3]) + "\n")  # host 3 unknown
    rc, report = lab.run("preflight", "--limit", "a2-node-03")
    assert rc == 1
    (refused,) = results(report, "a2-node-03")
    assert "not in" in refused["message"] and "SHA256:" in refused["message"] and "ssh-keyscan" in refused["message"]
    assert lab.invocations(3) == []
    rc, report = lab.run("preflight", "--limit", "a2-node-03", "--accept-new-host-keys")
    assert rc == 0, results(report, status="fail")
    assert f"[{lab.hosts[3].addr}]:{lab.hosts[3].port} ssh-ed25519" in lab.known_hosts.read_text()
    rc, _ = lab.run("preflight", "--limit", "a2-node-03")  # now known: strict mode passes
    assert rc == 0


def test_metacharacters_in_inventory_are_refused_before_any_host_runs(lab) -> None:
    """A NIC or node name that is not a plain name never reaches a shell: the inventory is refused (exit 2)."""
    marker = lab.tmp / "pwned"
    inv = lab.inventory()
    inv["nodes"][0]["nic"] = f"eth0;touch {marker}1"
    inv["nodes"][2]["name"] = f"node`touch {marker}3`"
    lab.write_inventory(inv)
    rc, _ = lab.run("preflight")
    assert rc == 2
    assert not any(lab.tmp.glob("pwned*"))
    assert all(lab.calls(i) == [] for i in range(4))


def test_shell_metacharacters_in_vars_are_quoted_never_executed(lab) -> None:
    marker = lab.tmp / "pwned"
    vars_ = yaml.safe_load(lab.vars_file.read_text())
    vars_["hosts"]["a2-node-03"]["cann_info_file"] = f"/nonexistent'; touch {marker}4; echo '"
    vars_["hosts"]["a2-node-01"]["cann_info_file"] = f"$(touch {marker}5)"
    lab.vars_file.write_text(yaml.safe_dump(vars_))
    rc, report = lab.run("preflight")
    assert rc == 1
    assert not any(lab.tmp.glob("pwned*"))
    (cann,) = results(report, "a2-node-03", "fail")
    assert cann["step"] == "CANN version" and "cannot read" in cann["message"]


def test_npu_network_check_then_apply(lab) -> None:
    lab.update_state(0, **{"dev.2.ip": "198.51.100.200"})
    lab.update_state(1, **{"dev.4.gateway": "", "dev.4.ip": ""})
    conf_before = [(h.dir / "hccn.conf").read_text() for h in lab.hosts]
    rc, report = lab.run("npu-network", "--check")
    assert rc == 0
    assert {(r["host"], r["step"]) for r in results(report, status="would_change")} == {
        ("a2-node-00", "device IP and netmask"), ("a2-node-01", "device IP and netmask"), ("a2-node-01", "gateway")}
    assert all(lab.calls(i) == [] for i in range(4))
    assert [(h.dir / "hccn.conf").read_text() for h in lab.hosts] == conf_before
    assert lab.state(0)["dev.2.ip"] == "198.51.100.200"

    assert "refused without --var replace_addresses=true" in " ".join(
        r["message"] for r in results(report, "a2-node-00", "would_change"))

    # node-00 dev 2 already has another address: replacing it needs consent; node-01's unset values are set
    rc, report = lab.run("npu-network")
    assert rc == 1
    assert _fail_steps(report, "a2-node-00") == {"device IP and netmask", "verify device IP"}
    (fail,) = [r for r in results(report, "a2-node-00", "fail") if r["step"] == "device IP and netmask"]
    assert "198.51.100.200" in fail["message"]
    assert "--var replace_addresses=true" in fail["message"]
    assert lab.calls(0) == [] and lab.state(0)["dev.2.ip"] == "198.51.100.200"
    assert sorted(lab.calls(1)) == sorted([f"-i 4 -ip -s address {planned_ip(1, 4)} netmask 255.255.255.0",
                                           "-i 4 -gateway -s gateway 198.51.100.1"])

    rc, report = lab.run("npu-network", "--var", "replace_addresses=true")
    assert rc == 0, results(report, status="fail")
    assert lab.calls(0) == [f"-i 2 -ip -s address {planned_ip(0, 2)} netmask 255.255.255.0"]
    assert sorted(lab.calls(1)) == sorted([f"-i 4 -ip -s address {planned_ip(1, 4)} netmask 255.255.255.0",
                                           "-i 4 -gateway -s gateway 198.51.100.1"])
    assert lab.calls(2) == [] and lab.calls(3) == []
    assert f"address_2={planned_ip(0, 2)}" in (lab.hosts[0].dir / "hccn.conf").read_text()
    assert {r["step"] for r in results(report, "a2-node-00", "ok")} >= {"verify device IP", "verify link UP"}
    rc, report = lab.run("npu-network")
    assert rc == 0 and results(report, status="changed") == [] and len(lab.calls(0)) == 1


def test_a3_facts_and_preflight(lab) -> None:
    lab.set_kind("a3")
    bare = lab.inventory(with_devices=False)
    lab.write_inventory(bare)
    rc, report = lab.run("facts", "--limit", "a3-node-00,a3-node-01")
    assert rc == 0, results(report, status="fail")
    inv = yaml.safe_load(lab.inventory_path.read_text())
    devs = inv["nodes"][1]["devices"]
    assert len(devs) == 16 and devs[15]["device_ip"] == planned_ip(1, 15)
    assert devs[15]["super_device_id"] == 0x1000000 + 16 + 15 and devs[15]["super_pod_id"] == 0
    assert inv["nodes"][2].get("devices", []) == []  # not in --limit: untouched
    rc, report = lab.run("preflight", "--limit", "a3-node-00,a3-node-01")
    assert rc == 0, results(report, status="fail")


def test_bad_input_exit_2(lab, capsys) -> None:
    rc, _ = lab.run("preflight", "--limit", "no-such-host")
    assert rc == 2 and "--limit" in capsys.readouterr().out
    rc, _ = lab.run("no-such-playbook")
    assert rc == 2 and "playbook" in capsys.readouterr().out


def test_staged_model_from_the_stack_checked_on_every_host(lab) -> None:
    model = lab.tmp / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model-00001.safetensors").write_bytes(b"x" * 4096)
    stack_file = lab.stacks / "Pulumi.test.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    doc["config"]["ascend-deepseek:model_staging"] = {
        "dir": str(model), "files": {"config.json": 2, "model-00001.safetensors": 4096}}
    stack_file.write_text(yaml.safe_dump(doc))
    rc, report = lab.run("preflight")
    assert rc == 0, results(report, status="fail")
    assert any("model" in r["step"] and r["status"] == "ok" for r in results(report, "a2-node-00"))
    (model / "model-00001.safetensors").write_bytes(b"x" * 100)  # a truncated copy on every host (one filesystem)
    rc, report = lab.run("preflight")
    assert rc == 1
    for host in ("a2-node-00", "a2-node-03"):
        failed = [r for r in results(report, host, "fail") if "model" in r["step"]]
        assert failed and "model-00001.safetensors" in failed[0]["message"], results(report, host, "fail")


def test_shipped_address_writes_are_guarded() -> None:
    """Every shipped set step that writes an address refuses to replace a configured one without consent."""
    from ascend_runtime.hosts import playbook as pb

    writes = [(name, s) for name in pb.available() for s in pb.load(name).steps
              if s.type == "set" and ("-ip -s" in (s.set or "") or "-gateway -s" in (s.set or ""))]
    assert writes, "no address-writing step found"
    assert all(s.replace_guard == "replace_addresses" for _, s in writes), [(n, s.name) for n, s in writes]
    assert pb.load("npu-network").vars["replace_addresses"] is False


def test_a_device_whose_address_is_refused_gets_no_netdetect_or_gateway(lab) -> None:
    """Nothing half applied: node-00 dev 2 has another RoCE address (replacing it needs consent) and no
    gateway or netdetect; without consent its address is refused and its netdetect and gateway are not set
    either (`after:` in npu-network.yaml), and the report says why; with consent all three are set."""
    lab.update_state(0, **{"dev.2.ip": "198.51.100.200", "dev.2.gateway": "", "dev.2.netdetect": ""})
    rc, report = lab.run("npu-network")
    assert rc == 1
    assert not [c for c in lab.calls(0) if c.startswith("-i 2 ")], lab.calls(0)
    held = {r["step"]: r["message"] for r in results(report, "a2-node-00") if r["step"] in ("netdetect", "gateway")}
    assert set(held) == {"netdetect", "gateway"}
    assert all("device 2: not run: device IP and netmask failed on this device" in m for m in held.values()), held
    assert lab.state(0)["dev.2.gateway"] == "" and lab.state(0)["dev.2.netdetect"] == ""

    rc, report = lab.run("npu-network", "--var", "replace_addresses=true")
    assert rc == 0, results(report, status="fail")
    sets = [c for c in lab.calls(0) if c.startswith("-i 2 ")]
    assert [c.split()[2] for c in sets] == ["-ip", "-netdetect", "-gateway"]
    assert sets[2].startswith("-i 2 -gateway -s gateway ")


def test_after_must_name_an_earlier_device_step() -> None:
    from ascend_runtime.hosts.playbook import Playbook

    base = {"name": "p", "hardware": ["cm384"]}
    first = {"name": "a", "type": "command", "foreach": "device", "command": "true"}
    with pytest.raises(ValueError, match="earlier foreach: device step"):
        Playbook(**base, steps=[{**first, "after": ["b"]}, {**first, "name": "b"}])
    with pytest.raises(ValueError, match="earlier foreach: device step"):
        Playbook(**base, steps=[{**first, "foreach": "host"}, {**first, "name": "b", "after": ["a"]}])
    with pytest.raises(ValueError, match="foreach: device steps only"):
        Playbook(**base, steps=[first, {**first, "name": "b", "foreach": "host", "after": ["a"]}])
    assert Playbook(**base, steps=[first, {**first, "name": "b", "after": ["a"]}]).steps[1].after == ["a"]
