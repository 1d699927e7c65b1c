"""Helpers of the local-stack tests: the CLI in a subprocess, a copy of the stacks on free ports, tiny servers.

Tests that start a whole stack use :func:`free_port_stacks`, a copy of stacks/ whose
``local`` stack listens on ports nobody holds, so they never meet a local stack a
developer has running on the standard ports (the newcomer test alone uses those,
as the README does).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ascend_runtime.local.processes import is_alive
from ascend_runtime.local.state import StackState
from ascend_runtime.local.topology import listen_ports
from ascend_runtime.planner import load_plan

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "ascend-deepseek:"
#: The standard local stack's port blocks (dp_rpc 23355.., KV 28000..) and the NodePort range the planner refuses.
_RESERVED = (range(23355, 23360), range(28000, 28080), range(30000, 32768))
#: Port bases tried for the copied stack (it uses base .. base + 180), clear of those and of Linux's ephemeral ports.
BASES = [b for b in range(20000, 29800, 200) if not any(set(range(b, b + 180)) & set(r) for r in _RESERVED)]


def cli(*args: str, timeout: float = 240, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m ascend_runtime ARGS` in a subprocess; output captured."""
    return subprocess.run([sys.executable, "-m", "ascend_runtime", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def bindable(host: str, port: int) -> bool:
    """True when host:port can be bound now (checked independently of the code under test)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def plan_addresses(stacks: Path, stack: str = "local") -> list[tuple[str, int]]:
    """Every address ``stack`` of ``stacks`` binds: API and KV port per instance, proxy, balancer metrics."""
    plan = load_plan(stack, stacks)
    addresses = [(i.api_host, p) for i in plan.instances for p in (i.api_port, i.ranks[0].kv_port)]
    return addresses + [(plan.proxy_host, plan.proxy_port), ("127.0.0.1", int(plan.config["ports"]["balancer_metrics"]))]


def free_port_stacks(tmp_path: Path, stack: str = "local") -> Path:
    """A copy of stacks/ whose ``stack`` uses ports that are free right now; returns the directory."""
    stacks = tmp_path / "stacks"
    shutil.copytree(ROOT / "stacks", stacks)
    stack_file = stacks / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    for base in random.sample(BASES, len(BASES)):
        # API ports take api_base .. api_base + instances (x DP ranks per node under serving: rank, at most 40
        # in the committed stacks); the other ports sit above them
        doc["config"][NAMESPACE + "ports"] = {"api_base": base, "proxy": base + 40, "balancer_metrics": base + 41,
                                              "dp_rpc_base": base + 50, "kv_base": base + 100}
        stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
        addresses = {*plan_addresses(stacks, stack), *((lp.host, lp.port) for lp in listen_ports(load_plan(stack, stacks)))}
        if all(bindable(host, port) for host, port in addresses):
            return stacks
    pytest.skip(f"no free block of ports for a copy of the {stack} stack")


def assert_checks_passed(up: subprocess.CompletedProcess[str]) -> str:
    """`up --detach` passed its checks: PASS (exit 0), or INCONCLUSIVE because the host lagged (exit 1).

    INCONCLUSIVE is only given when the smoke check passed and no request failed, and it names the
    host as the cause; so a busy CI machine cannot fail this, while a broken deployment still does.
    """
    verdicts = [line for line in up.stdout.splitlines() if line.startswith("checks: ")]
    assert len(verdicts) == 1, up.stdout + up.stderr
    if verdicts[0] == "checks: PASS":
        assert up.returncode == 0, up.stdout + up.stderr
    else:
        assert verdicts[0].startswith("checks: INCONCLUSIVE") and "not the deployment" in verdicts[0], up.stdout + up.stderr
        assert up.returncode == 1, up.stdout + up.stderr
    return verdicts[0]


def kill_recorded(state_dir: Path) -> None:
    """SIGKILL every process group a state file records (cleanup after a failed test)."""
    state = StackState.load(state_dir)
    for record in state.processes if state else []:
        if is_alive(record.pid):
            try:
                os.killpg(record.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes whose arguments contain ``text`` (e.g. a test's tmp path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and is_alive(int(entry.name)):
            found.append(f"{entry.name}: {cmd}")
    return found


HTTP_SERVER = textwrap.dedent("""
    import http.server, sys

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer((sys.argv[1], 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
""")


class Proc:
    """A child process started by a test; killed (by its pid) at the end."""

    def __init__(self, argv: list[str]) -> None:
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.pid = self.popen.pid

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(10)


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Processes a test starts; every one is killed afterwards."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


def http_server(procs: list[Proc], host: str = "127.0.0.1") -> tuple[Proc, int]:
    """A process answering 200 to every GET on host:<free port>; (process, port)."""
    proc = Proc([sys.executable, "-c", HTTP_SERVER, host])
    procs.append(proc)
    port = int(proc.popen.stdout.readline())  # type: ignore[union-attr]
    return proc, port


def sleeper(procs: list[Proc]) -> Proc:
    """A process that only sleeps (alive, listens nowhere)."""
    proc = Proc([sys.executable, "-c", "import time; time.sleep(120)"])
    procs.append(proc)
    return proc


def wait_for(predicate, timeout_s: float, what: str, poll_s: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns a true value; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
