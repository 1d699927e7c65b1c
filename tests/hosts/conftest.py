"""Stand-in Atlas hosts: real OpenSSH servers on 127.0.0.2.. with fake npu-smi / hccn_tool / ip.

One ``sshd -D`` per fake host (session scope: started once, torn down at the
end). Each host has its own host key, its own state JSON (named by
``FAKE_NPU_STATE``) and ``PATH`` starting with ``tests/hosts/fakes/bin``; both
reach the login through the ``environment=`` option of that host's
authorized_keys (``PermitUserEnvironment yes``), so no production code path
knows about the fakes. Version files live under a per-host fake root whose
paths the tests pass as playbook variables (``--vars``), as an operator would
for a non-standard install.

A fifth sshd on 127.0.0.6 stands in for a bastion (``ssh.jump_host``); it
logs every accepted connection, so tests can count them.

Needs: /usr/sbin/sshd and ssh-keygen (Debian openssh-server), permission to
create /run/sshd, loopback addresses 127.0.0.2-6 (Linux routes 127/8 to lo).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

#: A prebuilt runtime image by registry and digest (the hosts tests never pull it)
RUNTIME_IMAGE = "registry.example.com/ascend/ascend-deploy-runtime@sha256:" + "0" * 64

from ascend_runtime.cli import main as cli_main

SSHD = "/usr/sbin/sshd"
FAKE_BIN = Path(__file__).resolve().parent / "fakes" / "bin"
N_HOSTS = 4
KIND_DEVICES = {"a2": 8, "a3": 16}
JUMP_ADDR = "127.0.0.6"
RUN_LIMIT_S = 600  # wall-clock bound of one playbook run in a test (the slowest takes well under a minute)
HARDWARE = {"a2": "atlas-800i-a2", "a3": "cm384"}


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class FakeHost:
    """One sshd standing in for an Atlas host."""

    index: int
    addr: str
    port: int
    dir: Path
    host_pub: str  # "ssh-ed25519 AAAA..."
    proc: subprocess.Popen | None = None

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    @property
    def known_hosts_line(self) -> str:
        return f"[{self.addr}]:{self.port} {self.host_pub.split()[0]} {self.host_pub.split()[1]}"


@dataclass
class SshLab:
    """The running sshds and the client key."""

    base: Path
    client_key: Path
    hosts: list[FakeHost] = field(default_factory=list)
    jump: FakeHost | None = None  # the bastion sshd (LogLevel INFO: one "Accepted publickey" line per connection)

    def jump_connections(self) -> int:
        """Connections the bastion accepted so far (counted in its sshd log)."""
        assert self.jump is not None
        return (self.jump.dir / "sshd.log").read_text().count("Accepted publickey")


def _sshd_config(hdir: Path, addr: str, port: int, log_level: str = "ERROR") -> Path:
    conf = hdir / "sshd_config"
    conf.write_text(
        f"ListenAddress {addr}\nPort {port}\nHostKey {hdir / 'ssh_host_ed25519_key'}\n"
        f"PermitRootLogin prohibit-password\nAuthorizedKeysFile {hdir / 'authorized_keys'}\n"
        f"PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        f"UsePAM no\nStrictModes no\nPermitUserEnvironment yes\nPidFile {hdir / 'sshd.pid'}\n"
        f"MaxStartups 100\nMaxSessions 50\nLogLevel {log_level}\n"
    )
    return conf


def _start_sshd(hdir: Path, addr: str, port: int, log_level: str = "ERROR") -> subprocess.Popen:
    conf = _sshd_config(hdir, addr, port, log_level)
    return subprocess.Popen([SSHD, "-D", "-e", "-f", str(conf)],
                            stdout=subprocess.DEVNULL, stderr=open(hdir / "sshd.log", "w"))


def _wait_listening(hosts: list[FakeHost], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    for host in hosts:
        while True:
            try:
                socket.create_connection((host.addr, host.port), timeout=0.5).close()
                break
            except OSError:
                if host.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sshd for {host.addr} did not start: {(host.dir / 'sshd.log').read_text()}")
                time.sleep(0.05)


@pytest.fixture(scope="session")
def ssh_lab(tmp_path_factory: pytest.TempPathFactory):
    if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
        pytest.skip("openssh-server is not installed (apt-get install -y openssh-server)")
    os.makedirs("/run/sshd", exist_ok=True)
    base = tmp_path_factory.mktemp("sshlab")
    client_key = base / "client_key"
    client_pub = _keygen(client_key)
    lab = SshLab(base, client_key)
    for i in range(N_HOSTS):
        addr = f"127.0.0.{i + 2}"
        hdir = base / f"host{i}"
        hdir.mkdir()
        host_pub = _keygen(hdir / "ssh_host_ed25519_key")
        host = FakeHost(i, addr, _free_port(addr), hdir, host_pub)
        env = f'environment="PATH={FAKE_BIN}:/usr/local/bin:/usr/bin:/bin",environment="FAKE_NPU_STATE={host.state_file}"'
        (hdir / "authorized_keys").write_text(f"{env} {client_pub}\n")
        host.proc = _start_sshd(hdir, addr, host.port)
        lab.hosts.append(host)
    # a bastion for ProxyJump-style runs: its own sshd, logging every accepted connection
    jdir = base / "jump"
    jdir.mkdir()
    jump = FakeHost(-1, JUMP_ADDR, _free_port(JUMP_ADDR), jdir, _keygen(jdir / "ssh_host_ed25519_key"))
    (jdir / "authorized_keys").write_text(f"{client_pub}\n")
    jump.proc = _start_sshd(jdir, jump.addr, jump.port, log_level="INFO")
    lab.jump = jump
    _wait_listening(lab.hosts + [jump])
    yield lab
    for host in lab.hosts + [jump]:
        if host.proc and host.proc.poll() is None:
            host.proc.terminate()
            host.proc.wait(timeout=5)


def planned_ip(i: int, d: int) -> str:
    """RoCE port IP of host i, device d (``hccn_tool -ip -g``; the inventory's device_ip)."""
    return f"198.51.100.{10 + i * 16 + d}"


def planned_vnic_ip(i: int, d: int) -> str:
    """A3 VNIC IP of host i, device d (``hccn_tool -vnic -g``; the inventory's vnic_ip): never a RoCE address."""
    return f"203.0.113.{10 + i * 16 + d}"


class Lab:
    """One test's hosts: fresh state, inventory, stack, known_hosts and vars files."""

    def __init__(self, ssh_lab: SshLab, tmp: Path, kind: str = "a2") -> None:
        self.ssh_lab = ssh_lab
        self.tmp = tmp
        self.kind = kind
        self.hosts = ssh_lab.hosts
        self.stacks = tmp / "stacks"
        (self.stacks / "inventories").mkdir(parents=True)
        self.inventory_path = self.stacks / "inventories" / "test.yaml"
        self.known_hosts = tmp / "known_hosts"
        self.known_hosts.write_text("".join(h.known_hosts_line + "\n" for h in self.hosts))
        self.vars_file = tmp / "vars.yaml"
        self.set_kind(kind)

    def name(self, i: int) -> str:
        return f"{'a2' if self.kind == 'a2' else 'a3'}-node-{i:02d}"

    def set_kind(self, kind: str) -> None:
        """Reset every host to healthy state of ``kind`` and rewrite the stack files."""
        self.kind = kind
        n = KIND_DEVICES[kind]
        host_vars = {}
        for h in self.hosts:
            root = self.tmp / f"root{h.index}"
            for sub, text in (
                ("usr/local/Ascend/driver/version.info", "Version=24.1.rc3\ncompatible_version_fw=[7.0.0,7.5.99]\n"
                 if kind == "a2" else "Version=25.2.0\npackage_version=25.2.0\n"),
                ("usr/local/Ascend/firmware/version.info", "Version=7.5.0.1.129\ncompatible_version_drv=[23.0.rc3,23.0.rc3.]\n"
                 if kind == "a2" else "Version=7.8.0.6.201\n"),
                ("usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info",
                 "package_name=Ascend-cann-toolkit\nversion=8.1.RC1\narch=aarch64\n"),
            ):
                p = root / sub
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(text)
            host_vars[self.name(h.index)] = {
                "driver_version_file": str(root / "usr/local/Ascend/driver/version.info"),
                "firmware_version_file": str(root / "usr/local/Ascend/firmware/version.info"),
                "cann_info_file": str(root / "usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info"),
            }
            state: dict[str, str] = {"kind": kind, "ndev": str(n), "hccn_conf": str(h.dir / "hccn.conf"),
                                     "server_index": str(h.index), "new_driver": str(h.index % 2),
                                     f"addr.192.0.2.{11 + h.index}": "enp189s0f0", "addr.127.0.0.1": "lo"}
            for d in range(n):
                state.update({f"dev.{d}.{k}": v for k, v in {
                    "present": "1", "ip": planned_ip(h.index, d), "netmask": "255.255.255.0",
                    "gateway": "198.51.100.1", "netdetect": "198.51.100.1", "link": "UP", "health": "Success",
                    "npu_health": "OK", "tls": "0", "sdid": str(0x1000000 + h.index * 16 + d), "spod": "0"}.items()})
                if kind == "a3":  # the VNIC is a second interface with its own address (A3 only)
                    state.update({f"dev.{d}.vnic_ip": planned_vnic_ip(h.index, d),
                                  f"dev.{d}.vnic_netmask": "255.255.255.0"})
            self._write_state(h, state)
            (h.dir / "hccn.conf").write_text("")
            for suffix in (".log", ".calls", ".hang"):
                Path(str(h.state_file) + suffix).unlink(missing_ok=True)
        self.vars_file.write_text(yaml.safe_dump({"hosts": host_vars}))
        (self.stacks / "Pulumi.test.yaml").write_text(yaml.safe_dump({"config": {
            "ascend-deepseek:hardware": HARDWARE[kind], "ascend-deepseek:inventory": "inventories/test.yaml",
            "ascend-deepseek:prefill": {}, "ascend-deepseek:decode": {},
            # a kubernetes stack names the registry its runtime image comes from (config/runtime_image.py)
            "ascend-deepseek:kubernetes": {"runtime_image": RUNTIME_IMAGE}}}))
        self.write_inventory()

    def inventory(self, with_devices: bool = True) -> dict[str, Any]:
        nodes = []
        for h in self.hosts:
            node: dict[str, Any] = {"name": self.name(h.index), "host_ip": f"192.0.2.{11 + h.index}",
                                    "nic": "enp189s0f0", "ssh_host": h.addr, "ssh_port": h.port}
            if with_devices:
                node["devices"] = [
                    {"device_id": d, "device_ip": planned_ip(h.index, d), "netmask": "255.255.255.0",
                     "gateway": "198.51.100.1", "netdetect": "198.51.100.1",
                     **({"vnic_ip": planned_vnic_ip(h.index, d)} if self.kind == "a3" else {})}
                    for d in range(KIND_DEVICES[self.kind])
                ]
            nodes.append(node)
        return {"ssh": {"user": getpass.getuser(), "key_file": str(self.ssh_lab.client_key),
                        "known_hosts": str(self.known_hosts), "connect_timeout_s": 5}, "nodes": nodes}

    def write_inventory(self, data: dict[str, Any] | None = None) -> None:
        self.inventory_path.write_text(yaml.safe_dump(data or self.inventory(), sort_keys=False))

    def state(self, i: int) -> dict[str, Any]:
        return json.loads(self.hosts[i].state_file.read_text())

    @staticmethod
    def _write_state(host: FakeHost, state: dict[str, str]) -> None:
        # flat, one "key": "value" per line: the sh fakes read and edit it with sed
        host.state_file.write_text(json.dumps({k: str(v) for k, v in state.items()}, indent=0, sort_keys=True) + "\n")

    def update_state(self, i: int, **changes: str) -> None:
        """Change keys of host i's state (``**{"dev.3.link": "DOWN"}``)."""
        state = self.state(i)
        state.update({k: str(v) for k, v in changes.items()})
        self._write_state(self.hosts[i], state)

    def calls(self, i: int) -> list[str]:
        """Every hccn_tool -s command host i received (recorded before it ran, failed ones included)."""
        p = Path(str(self.hosts[i].state_file) + ".calls")
        return p.read_text().splitlines() if p.exists() else []

    def hang_pids(self, i: int) -> list[int]:
        """Pids of the hung fake hccn_tool runs of host i and of their children."""
        p = Path(str(self.hosts[i].state_file) + ".hang")
        return [int(x) for x in p.read_text().split()] if p.exists() else []

    def playbook(self, steps: list[dict[str, Any]], name: str = "faults") -> str:
        """Write a playbook with these steps for both hardware kinds; return its path (for ``run``)."""
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"name": name, "hardware": ["atlas-800i-a2", "cm384"],
                                        "vars": {"hccn_tool": "hccn_tool"}, "steps": steps}, sort_keys=False))
        return str(path)

    def invocations(self, i: int) -> list[str]:
        log = Path(str(self.hosts[i].state_file) + ".log")
        return log.read_text().splitlines() if log.exists() else []

    def run(self, playbook: str, *extra: str) -> tuple[int, dict[str, Any]]:
        """Run the CLI in-process; return (exit code, --json report)."""
        out = self.tmp / f"report-{Path(playbook).stem}-{time.monotonic_ns()}.json"
        argv = ["playbook", "run", playbook, "--stack", "test", "--stacks-dir", str(self.stacks),
                "--vars", str(self.vars_file), "--json", str(out), "--connect-retries", "2", *extra]
        done: dict[str, Any] = {}

        def target() -> None:
            try:
                done["rc"] = cli_main(argv)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
                done["exc"] = exc

        worker = threading.Thread(target=target, daemon=True)  # a hung run fails the test, never the suite
        worker.start()
        worker.join(RUN_LIMIT_S)
        if worker.is_alive():
            pytest.fail(f"`ascend-deploy {' '.join(argv[:3])}` did not finish within {RUN_LIMIT_S} s")
        if "exc" in done:
            raise done["exc"]
        return done["rc"], (json.loads(out.read_text()) if out.exists() else {})


@pytest.fixture
def lab(ssh_lab: SshLab, tmp_path: Path) -> Lab:
    return Lab(ssh_lab, tmp_path)


def results(report: dict[str, Any], host: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
    """Filter a --json report's results."""
    return [r for r in report["results"] if (host is None or r["host"] == host) and (status is None or r["status"] == status)]
