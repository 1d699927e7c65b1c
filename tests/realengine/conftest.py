"""The real-engine tier: vLLM 0.23.0's own OpenAI server (CPU build) behind the kit's proxy and checks.

The engine lives in its own virtual environment (``ascend-deploy engine install``). ``tests/run.sh`` installs
it and sets ``ASCEND_DEPLOY_REAL_ENGINE=required``, so in CI a missing engine fails these tests; elsewhere
they are skipped with the command that installs it.

Servers start from the kit's own launcher (the ``local-vllm`` stack, copied onto free ports) or, for pairs
the stack does not have (no connector, ExampleConnector), from the same argv/env builders
(``ascend_runtime.local.vllm_engine.server``). Start-up waits poll /health with a generous bound, so a
busy machine makes the tier slower, never red.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.local.processes import start_process, stop_process_group
from ascend_runtime.local.vllm_engine import prepare
from ascend_runtime.local.vllm_engine.install import engine_env, missing_reason
from ascend_runtime.local.vllm_engine.server import ISOLATED_VARIABLES, server_argv, server_env
from ascend_runtime.planner import load_plan
from ascend_runtime.planner.plan import Plan
from tests.local.conftest import cli, free_port_stacks, kill_recorded

STACK = "local-vllm"
#: Seconds a vLLM server may take to serve after start (35-60 s on an idle 2-core machine).
START_TIMEOUT_S = 900.0
MODEL_NAME = "deepseek-ai/DeepSeek-R1"


def require_engine() -> None:
    reason = missing_reason()
    if reason is None:
        return
    if os.environ.get("ASCEND_DEPLOY_REAL_ENGINE") == "required":
        pytest.fail(f"the real-engine tier is required here: {reason}")
    pytest.skip(reason)


def http_json(method: str, url: str, body: Any = None, timeout: float = 120.0) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON body or text, headers) of one request."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, headers = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raw, status, headers = exc.read(), exc.code, dict(exc.headers)
    try:
        return status, json.loads(raw), headers
    except ValueError:
        return status, raw.decode(errors="replace"), headers


def wait_healthy(url: str, pid: int | None = None, log: Path | None = None, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if pid is not None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                tail = log.read_text(errors="replace")[-3000:] if log else ""
                raise AssertionError(f"the server at {url} exited during start-up:\n{tail}") from None
        time.sleep(1.0)
    raise AssertionError(f"{url} not healthy after {timeout_s:g} s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """One vLLM server started by a test."""

    url: str
    pid: int
    log: Path


def start_servers(tmp: Path, names: list[str], kv_config: str | None) -> list[Server]:
    """vLLM servers on 127.0.0.1 with the kit's argv and env builders, started together, returned healthy."""
    prepare(0)
    started = []
    for name in names:
        port, side = free_port(), free_port()
        argv = server_argv(engine_env(), prepare(0), MODEL_NAME, "127.0.0.1", port, 16, kv_config)
        log = tmp / f"{name}.log"
        pid = start_process(argv, log, server_env("127.0.0.1", side), unset=ISOLATED_VARIABLES)
        started.append(Server(f"http://127.0.0.1:{port}", pid, log))
    try:
        for server in started:
            wait_healthy(server.url, server.pid, server.log)
    except BaseException:
        for server in started:
            stop_process_group(server.pid)
        raise
    return started


@dataclass
class RealStack:
    """The local-vllm stack started by the kit's launcher on free ports."""

    plan: Plan
    stacks: Path
    state_dir: Path

    @property
    def proxy(self) -> str:
        return self.plan.proxy_url

    def url(self, name: str) -> str:
        return self.plan.instance(name).api_url


@pytest.fixture(scope="module")
def real_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack]:
    require_engine()
    tmp = tmp_path_factory.mktemp("real-stack")
    stacks = free_port_stacks(tmp, STACK)
    state_dir = tmp / "state"
    up = cli("up", "--stack", STACK, "--stacks-dir", str(stacks), "--state-dir", str(state_dir), "--detach",
             "--no-checks", timeout=START_TIMEOUT_S + 120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield RealStack(load_plan(STACK, stacks), stacks, state_dir)
    finally:
        cli("down", "--stack", STACK, "--stacks-dir", str(stacks), "--state-dir", str(state_dir), timeout=120)
        kill_recorded(state_dir)
