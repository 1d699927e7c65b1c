"""Every panel of the dashboard has data in a real Prometheus scraping the local stack.

`up --detach` starts a copy of the local stack on free ports and writes `<state>/prometheus.yml` and
`<state>/grafana-dashboard.json`; Prometheus (Debian's `prometheus` package, which tests/run.sh installs)
scrapes the stack with that config at a 1 s interval while the test sends streamed and invalid requests
through the proxy. Then every query of every panel is evaluated over the run through Prometheus's HTTP API;
a query that returns no finite value (no series, or only NaN) fails the test, naming its panel.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from ascend_runtime.local.monitoring import DASHBOARD_FILE, PROMETHEUS_FILE
from ascend_runtime.local.state import StackState

from .conftest import assert_checks_passed, cli, free_port_stacks, kill_recorded, wait_for

pytestmark = pytest.mark.slow

#: Generous bounds: polls end as soon as the condition holds, so a fast machine never waits them out.
UP_TIMEOUT_S = 240
SCRAPED_TIMEOUT_S = 60
DATA_TIMEOUT_S = 90


def prometheus_binary() -> str:
    """Prometheus on PATH; a skip only where it cannot be installed (not root), else a failure."""
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip("prometheus is not installed and installing it needs root: run tests/run.sh as root, or "
                    "apt-get install prometheus")
    pytest.fail("prometheus is not on PATH: tests/run.sh installs Debian's prometheus package")


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (loopback)
        return json.loads(resp.read())


def post(url: str, body: dict[str, Any], timeout: float = 60) -> int:
    """POST a JSON body, read the whole answer (a stream to its end); the HTTP status."""
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback)
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.read()
        return int(exc.code)


def panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, expression) of every query; the expressions are final (no Grafana variable left)."""
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert "$" not in target["expr"], (panel["title"], target["expr"])
            out.append((panel["title"], target["refId"], target["expr"]))
    return out


def has_data(api: str, expr: str, start: float) -> bool:
    """Whether ``expr`` has a finite value anywhere from ``start`` to now (what a Grafana panel would draw)."""
    query = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{time.time():.3f}", "step": "1"})
    answer = get_json(f"{api}/query_range?{query}")
    assert answer["status"] == "success", (expr, answer)
    return any(math.isfinite(float(v)) for series in answer["data"]["result"] for _, v in series["values"])


def send_traffic(proxy: str, model: str, stop: threading.Event) -> list[int]:
    """Streamed and whole completions and chats until ``stop``, then one invalid request (for the errors panel);
    the statuses. The load lasts, as the balancer's heat needs windows with load after its first map."""
    streamed = {"model": model, "prompt": "one two three four five six seven eight", "max_tokens": 24, "stream": True}
    chat = {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 16, "stream": True}
    whole = {"model": model, "prompt": "one two three", "max_tokens": 8}
    statuses: list[int] = []
    with ThreadPoolExecutor(4) as pool:
        while not stop.is_set():
            jobs = [pool.submit(post, f"{proxy}/v1/completions", streamed) for _ in range(2)]
            jobs.append(pool.submit(post, f"{proxy}/v1/chat/completions", chat))
            jobs.append(pool.submit(post, f"{proxy}/v1/completions", whole))
            statuses += [j.result() for j in jobs]
    statuses.append(post(f"{proxy}/v1/completions", {"model": model, "prompt": "x", "max_tokens": -1}))
    return statuses


@pytest.fixture
def local_stack_with_prometheus(tmp_path: Path):
    binary = prometheus_binary()
    stacks = free_port_stacks(tmp_path)
    state_dir = tmp_path / "state"
    up = subprocess.Popen([sys.executable, "-m", "ascend_runtime", "up", "--stack", "local", "--stacks-dir", str(stacks),
                           "--detach", "--state-dir", str(state_dir), "--num-prompts", "16"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    prometheus = None
    log = tmp_path / "prometheus.log"
    try:
        # up writes the scrape config before it starts anything: Prometheus watches the stack come up
        config_file = state_dir / PROMETHEUS_FILE
        wait_for(lambda: config_file.exists() or up.poll() is not None, UP_TIMEOUT_S, "up to write prometheus.yml")
        assert config_file.exists(), up.communicate()
        config = yaml.safe_load(config_file.read_text())
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_loopback_port()
        with log.open("w") as sink:
            prometheus = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                                           f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                           f"--web.listen-address=127.0.0.1:{port}"],
                                          stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)
        out, err = up.communicate(timeout=UP_TIMEOUT_S)
        assert_checks_passed(subprocess.CompletedProcess(up.args, up.returncode, out, err))
        yield f"http://127.0.0.1:{port}/api/v1", state_dir, config, log
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        if prometheus is not None:
            os.killpg(prometheus.pid, signal.SIGKILL)
            prometheus.wait(10)
        cli("down", "--stack", "local", "--state-dir", str(state_dir))
        kill_recorded(state_dir)


def test_every_dashboard_panel_has_data(local_stack_with_prometheus) -> None:
    api, state_dir, config, log = local_stack_with_prometheus
    expected = sum(len(c["targets"]) for job in config["scrape_configs"] for c in job["static_configs"])
    assert {job["job_name"] for job in config["scrape_configs"]} == {"engines", "proxy", "balancer"}

    def all_targets_up() -> bool:
        try:
            targets = get_json(f"{api}/targets")["data"]["activeTargets"]
        except (OSError, ValueError):
            return False
        return len(targets) == expected and all(t["health"] == "up" for t in targets)

    wait_for(all_targets_up, SCRAPED_TIMEOUT_S, f"Prometheus to scrape all {expected} targets (log: {log})", poll_s=0.5)
    start = time.time() - 1
    state = StackState.load(state_dir)
    assert state is not None
    proxy = state.proxy_url
    model = get_json(f"{proxy}/v1/models")["data"][0]["id"]
    stop = threading.Event()
    with ThreadPoolExecutor(1) as background:
        traffic = background.submit(send_traffic, proxy, model, stop)
        try:
            dashboard = json.loads((state_dir / DASHBOARD_FILE).read_text())
            queries = panel_queries(dashboard)
            titles = {title for title, _, _ in queries}
            assert any("(proxy)" in t for t in titles) and any("balancer" in t for t in titles)
            empty = queries
            deadline = time.monotonic() + DATA_TIMEOUT_S
            while empty and time.monotonic() < deadline:
                empty = [q for q in empty if not has_data(api, q[2], start)]
                if empty:
                    time.sleep(1)
        finally:
            stop.set()
        statuses = traffic.result()
    assert statuses[-1] == 400 and statuses[:-1] == [200] * (len(statuses) - 1), statuses
    assert not empty, "panels without data after %d s of load:\n%s" % (DATA_TIMEOUT_S, "\n".join(
        f"  {title} [{ref}]: {expr}" for title, ref, expr in empty))
