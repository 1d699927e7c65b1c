"""SSH runner faults are reported per host (and device), never as a crashed run.

Real sshds of conftest.py with fake hccn_tool / sudo / id / spew: known_hosts
markers and bad lines, impossible addresses in tool output, a sudo that
refuses, hung commands (one deadline per step and host; the hung process group
is killed), huge output (capped) and a shared jump-host connection.
"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import time
from pathlib import Path

import yaml

from ascend_runtime.hosts.ssh import ConnectOptions, Endpoint, Session
from tests.hosts.conftest import planned_ip, results

MIB = 1 << 20

LINK_STEP = {"name": "link UP", "type": "parse", "foreach": "device", "command": "{hccn_tool} -i {device_id} -link -g",
             "parser": "hccn_link", "expect": {"status": "UP"}}
SET_IP_STEP = {"name": "device IP and netmask", "type": "set", "foreach": "device", "when": ["device_ip", "netmask"],
               "become": True, "get": "{hccn_tool} -i {device_id} -ip -g", "parser": "hccn_ip",
               "want": {"ipaddr": "{device_ip}", "netmask": "{netmask}"},
               "set": "{hccn_tool} -i {device_id} -ip -s address {device_ip} netmask {netmask}"}


def _alive(pid: int) -> bool:
    """True while pid runs (a zombie waiting to be reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone_within(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """The pids still running after timeout_s (polled; the margin only covers reaping)."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _kill_leftovers(lab, *hosts: int) -> None:
    for i in hosts:
        for pid in lab.hang_pids(i):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _step(report: dict, host: str, step: str) -> dict:
    (r,) = [r for r in results(report, host) if r["step"] == step]
    return r


# ------------------------------------------------------------------ known_hosts
def test_known_hosts_markers_and_bad_lines_are_per_host(lab, capsys) -> None:
    h = lab.hosts
    ca = lab.tmp / "ca_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ca)], check=True)
    lines = [
        "# fleet known_hosts",
        h[0].known_hosts_line,
        h[1].known_hosts_line,
        f"@cert-authority [{h[3].addr}]:*,*.example.com {ca.with_suffix('.pub').read_text().strip()}",  # line 4
        f"[{h[1].addr}]:{h[1].port} ssh-ed25519 !!!not-base64!!!",  # line 5: unparsable key
        h[2].known_hosts_line,
        "just-one-field",  # line 7
        f"@revoked * {h[2].host_pub}",  # line 8: host 2's key is revoked
        f"@bogus-marker * {h[0].host_pub}",  # line 9
    ]
    lab.known_hosts.write_text("\n".join(lines) + "\n")  # host 3 is known only through the CA line
    book = lab.playbook([LINK_STEP])
    rc, report = lab.run(book)
    assert rc == 1, report
    assert report["failed_hosts"] == ["a2-node-02", "a2-node-03"]
    for i in (0, 1):
        assert results(report, f"a2-node-0{i}", "fail") == [] and results(report, f"a2-node-0{i}", "ok")
    kh = str(lab.known_hosts)

    (revoked,) = results(report, "a2-node-02")
    assert revoked["step"] == "connect" and "REVOKED" in revoked["message"]
    assert f"{kh} line 8" in revoked["message"] and "SHA256:" in revoked["message"]
    assert lab.invocations(2) == []

    (unknown,) = results(report, "a2-node-03")
    assert unknown["step"] == "connect" and "not in" in unknown["message"]
    assert f"{kh} line 4" in unknown["message"] and "@cert-authority" in unknown["message"]
    assert lab.invocations(3) == []

    warnings = report["warnings"]
    assert any(f"{kh} line 4" in w and "@cert-authority" in w and "ignored" in w for w in warnings), warnings
    for n in (5, 7, 9):
        assert any(f"{kh} line {n}:" in w and "skipped" in w for w in warnings), (n, warnings)
    assert len(warnings) == 4  # once per run, not once per host
    out = capsys.readouterr().out
    assert f"{kh} line 5" in out and "REVOKED" in out and "Traceback" not in out

    # trust on first use never accepts a revoked key
    rc, report = lab.run(book, "--limit", "a2-node-02", "--accept-new-host-keys")
    assert rc == 1 and "REVOKED" in results(report, "a2-node-02")[0]["message"]
    assert lab.known_hosts.read_text().count(h[2].host_pub.split()[1]) == 2  # nothing appended


# ---------------------------------------------------------------- parse errors
def test_impossible_ip_fails_that_device_and_other_facts_are_saved(lab, capsys) -> None:
    lab.update_state(0, **{"dev.3.ip": "999.1.1.1", "dev.1.gateway": "198.51.100.254"})
    lab.update_state(2, **{"dev.6.gateway": "300.2.2.2"})
    before = yaml.safe_load(lab.inventory_path.read_text())
    rc, report = lab.run("facts")
    assert rc == 1
    assert report["failed_hosts"] == ["a2-node-00", "a2-node-02"]
    ip = _step(report, "a2-node-00", "device IP")
    assert ip["status"] == "fail" and ip["message"].startswith("device 3: ")
    assert "999.1.1.1" in ip["message"] and "not a valid IPv4 address" in ip["message"]
    assert {r["step"] for r in results(report, "a2-node-00", "fail")} == {"device IP"}
    gw = _step(report, "a2-node-02", "gateway")
    assert gw["status"] == "fail" and gw["message"].startswith("device 6: ") and "300.2.2.2" in gw["message"]
    out = capsys.readouterr().out
    assert "Traceback" not in out and "validation error" not in out
    assert report["inventory_written"] is True

    after = yaml.safe_load(lab.inventory_path.read_text())
    for i in (1, 3):
        assert after["nodes"][i] == before["nodes"][i] | {"versions": after["nodes"][i]["versions"]}
    node0 = after["nodes"][0]
    assert node0["versions"]["driver"] == "24.1.rc3"  # host facts of the failing host are saved
    assert node0["devices"][1]["gateway"] == "198.51.100.254"  # so are its other devices
    assert node0["devices"][3] == before["nodes"][0]["devices"][3]  # the failing device keeps its entry
    assert after["nodes"][2]["devices"][6] == before["nodes"][2]["devices"][6]

    # a device that never had an entry gets none; the rest of the host is written
    lab.write_inventory(lab.inventory(with_devices=False))
    rc, report = lab.run("facts")
    assert rc == 1 and report["failed_hosts"] == ["a2-node-00", "a2-node-02"]
    after = yaml.safe_load(lab.inventory_path.read_text())
    assert [d["device_id"] for d in after["nodes"][0]["devices"]] == [0, 1, 2, 4, 5, 6, 7]
    assert [d["device_ip"] for d in after["nodes"][3]["devices"]] == [planned_ip(3, d) for d in range(8)]


# ------------------------------------------------------------------------ sudo
def test_check_says_could_not_read_when_sudo_refuses(lab) -> None:
    inv = lab.inventory()
    inv["ssh"]["sudo"] = True
    lab.write_inventory(inv)
    lab.update_state(1, uid="1000", sudo="refuse")  # a non-root login whose sudo -n needs a password
    lab.update_state(2, uid="1000", **{"dev.2.ip": "198.51.100.250"})  # a non-root login with working sudo
    rc, report = lab.run("npu-network", "--check")
    assert rc == 1
    assert report["failed_hosts"] == ["a2-node-01"]
    assert results(report, "a2-node-01", "would_change") == []
    r = _step(report, "a2-node-01", "device IP and netmask")
    assert r["status"] == "fail" and len(r["details"]) == 8, r
    for line in r["details"]:
        assert "could not read" in line and "sudo refused" in line and "a password is required" in line, line
    for step in ("netdetect", "gateway"):  # held back on every device whose address step failed (`after:`)
        r = _step(report, "a2-node-01", step)
        assert r["status"] == "skip" and len(r["details"]) == 8, r
        assert all("not run: device IP and netmask failed on this device" in line for line in r["details"]), r
    assert {(r["step"], r["message"].split(":")[0]) for r in results(report, "a2-node-02", "would_change")} == {
        ("device IP and netmask", "device 2")}
    assert all(lab.calls(i) == [] for i in range(4))

    rc, report = lab.run("npu-network", "--var", "replace_addresses=true")  # dev 2 has another address
    assert rc == 1
    assert lab.calls(1) == []  # nothing is set where the current value could not be read
    assert lab.calls(2) == [f"-i 2 -ip -s address {planned_ip(2, 2)} netmask 255.255.255.0"]


# ------------------------------------------------------------- hung commands
def test_batched_step_has_one_deadline_per_host(lab) -> None:
    lab.set_kind("a3")
    lab.update_state(0, hang="-link -g")  # every device's link read hangs
    lab.update_state(1, hang="-ip -s", **{f"dev.{d}.ip": "198.51.100.250" for d in range(16)})  # every set hangs
    book = lab.playbook([dict(LINK_STEP, timeout_s=2), dict(SET_IP_STEP, timeout_s=2)])
    try:
        rc, report = lab.run(book, "--limit", "a3-node-00,a3-node-01")
    finally:
        _kill_leftovers(lab, 0, 1)
    assert rc == 1 and report["failed_hosts"] == ["a3-node-00", "a3-node-01"]
    link = _step(report, "a3-node-00", "link UP")
    ip = _step(report, "a3-node-01", "device IP and netmask")
    # one 2 s deadline for the step on the host (plus the kill); 16 devices x 2 s = 32 s before
    assert link["duration_s"] < 12 and ip["duration_s"] < 12, (link["duration_s"], ip["duration_s"])
    assert link["status"] == "fail" and "timed out after 2s" in link["message"] and len(link["details"]) == 16
    assert len([c for c in lab.invocations(0) if "-link -g" in c]) == 1
    assert ip["status"] == "fail"
    # the first set spent the step's deadline; no other device's set started (on a loaded machine the SSH
    # round trip can spend the 2 s before the first set has logged its call: at most one, never 16)
    assert len(lab.calls(1)) <= 1
    assert "timed out after" in ip["details"][0] and "deadline" in ip["details"][1], ip["details"][:2]
    assert results(report, "a3-node-02") == []


def test_timed_out_command_is_killed_before_the_step_reports(lab) -> None:
    inv = lab.inventory()
    inv["ssh"]["sudo"] = True
    lab.write_inventory(inv)
    lab.update_state(0, hang="-link -g")
    lab.update_state(1, hang="-link -g", uid="1000")  # runs under (fake) sudo: killed through sudo too
    book = lab.playbook([{"name": "link", "type": "parse", "timeout_s": 2, "become": True, "parser": "hccn_link",
                          "command": "{hccn_tool} -i 0 -link -g", "expect": {"status": "UP"}}])
    try:
        rc, report = lab.run(book, "--limit", "a2-node-00,a2-node-01")
        pids = {i: lab.hang_pids(i) for i in (0, 1)}
        left = {i: _gone_within(p) for i, p in pids.items()}
    finally:
        _kill_leftovers(lab, 0, 1)
    assert rc == 1
    for i in (0, 1):
        assert len(pids[i]) == 2, pids  # the hung hccn_tool and its child
        assert left[i] == [], f"host {i}: timed-out processes still running: {left[i]}"
        r = _step(report, f"a2-node-0{i}", "link")
        assert r["status"] == "fail" and "timed out after 2s" in r["message"] and "process group" in r["message"], r


# ---------------------------------------------------------------- huge output
def test_captured_output_is_capped_with_a_note(lab, ssh_lab) -> None:
    h = lab.hosts[0]
    opts = ConnectOptions(known_hosts=str(lab.known_hosts), key_file=str(ssh_lab.client_key), connect_timeout_s=5)
    with Session(Endpoint(h.addr, h.port, getpass.getuser()), opts) as session:
        res = session.run(f"spew {5 * MIB}; spew {3 * MIB} stderr; echo done >&2", timeout_s=120)
    assert res.rc == 0 and not res.timed_out
    assert len(res.stdout.encode()) == MIB and len(res.stderr.encode()) <= MIB
    assert res.stdout_dropped == 4 * MIB and res.stderr_dropped == 2 * MIB + len("done\n")
    assert any("stdout truncated" in n and str(MIB) in n for n in res.notes), res.notes
    assert any("stderr truncated" in n for n in res.notes), res.notes

    book = lab.playbook([
        {"name": "chatty command", "type": "command", "command": f"spew {2 * MIB}"},
        {"name": "chatty parse", "type": "parse", "command": f"spew {2 * MIB}", "parser": "raw"},
    ])
    rc, report = lab.run(book, "--limit", "a2-node-00")
    assert rc == 1
    cmd = _step(report, "a2-node-00", "chatty command")
    assert cmd["status"] == "ok" and "truncated" in cmd["message"] and len(cmd["message"]) < 1000
    parse = _step(report, "a2-node-00", "chatty parse")
    assert parse["status"] == "fail" and "truncated" in parse["message"] and len(parse["message"]) < 1000


# ------------------------------------------------------------------- jump host
def test_one_jump_connection_shared_by_all_hosts(lab, ssh_lab) -> None:
    jump = ssh_lab.jump
    inv = lab.inventory()
    inv["ssh"]["jump_host"] = f"{getpass.getuser()}@{jump.addr}:{jump.port}"
    dead = dict(inv["nodes"][0], name="a2-node-dead", host_ip="192.0.2.99", ssh_host="127.0.0.9", ssh_port=1)
    inv["nodes"].append(dead)
    lab.write_inventory(inv)
    with lab.known_hosts.open("a") as fh:
        fh.write(jump.known_hosts_line + "\n")
    before = ssh_lab.jump_connections()
    rc, report = lab.run(lab.playbook([LINK_STEP]), "--forks", "5")
    assert rc == 1 and report["failed_hosts"] == ["a2-node-dead"] and report["unreachable"] == ["a2-node-dead"]
    (conn,) = results(report, "a2-node-dead")
    assert conn["step"] == "connect" and "127.0.0.9" in conn["message"]
    for i in range(4):
        assert _step(report, f"a2-node-0{i}", "link UP")["status"] == "ok"
    assert ssh_lab.jump_connections() - before == 1
