"""`ascend-deploy faults watch`: argument errors, and a real process draining through a real proxy."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from ascend_runtime.cli import main
from ascend_runtime.proxy.config import ProxyConfig
from ascend_runtime.proxy.instances import specs_from_data
from ascend_runtime.proxy.server import start_proxy

from .conftest import ADMIN_TOKEN, TOPOLOGY
from .fake_kube import FakeKubernetesApi


@pytest.mark.parametrize("argv, message", [
    (["--stack", "kind"], "ASCEND_PROXY_TOKEN"),
    (["--stack", "local", "--state-dir", "no-stack-here"], "local stack local is not running"),
    (["--stack", "kind", "--proxy-service", "pd-proxy"], "NAMESPACE/NAME:PORT"),
    (["--topology", "/nonexistent/topology.json", "--proxy", "http://127.0.0.1:1"], "--topology"),
    (["--topology", "x.json"], "--proxy/--proxy-service"),
    (["--stack", "local", "--interval", "0"], "--interval"),
    (["--stack", "local", "--stale-after", "300"], "--stale-after: must be > 300"),  # the plugin's own period
    (["--topology", "bad-sources.json", "--proxy", "http://127.0.0.1:1"], "sources: must be a list of device-plugin"),
])
def test_bad_arguments_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ASCEND_PROXY_TOKEN", raising=False)
    (tmp_path / "x.json").write_text(json.dumps(TOPOLOGY.to_dict()))
    (tmp_path / "bad-sources.json").write_text(json.dumps({**TOPOLOGY.to_dict(), "sources": ["nodeD"]}))
    monkeypatch.chdir(tmp_path)
    assert main(["faults", "watch", *argv]) == 2
    assert message in capsys.readouterr().err


async def test_the_command_drains_a_faulted_instance(tmp_path: Path) -> None:
    fake = FakeKubernetesApi()
    await fake.start()
    for node in TOPOLOGY.nodes:
        fake.add_node(node)
    fake.set_device_info("n-p1", unhealthy=("Ascend910-6",))
    specs = specs_from_data([{"name": n, "role": r, "url": f"http://127.0.0.1:{9 + i}"}
                             for i, (n, (r, _)) in enumerate(TOPOLOGY.instances.items())])
    proxy = await start_proxy(ProxyConfig(port=0, instances=specs, admin_token=ADMIN_TOKEN, health_interval_s=0))
    topo = tmp_path / "topology.json"
    topo.write_text(json.dumps(TOPOLOGY.to_dict()))
    env = {**os.environ, "ASCEND_PROXY_TOKEN": ADMIN_TOKEN, "FAKE_KUBE_TOKEN": fake.token}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "ascend_runtime", "faults", "watch", "--topology", str(topo), "--proxy", proxy.url,
            "--kube-api", fake.url, "--kube-token-env", "FAKE_KUBE_TOKEN", "--event-namespace", "default",
            "--interval", "0.05", "--max-cycles", "3", env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        assert proxy.pool.get("prefill-1").draining  # type: ignore[union-attr]
        assert not any(s.draining for s in proxy.pool.all() if s.name != "prefill-1")
        assert "drained prefill-1" in err.decode() and "spare nodes (unused by the Plan): n-spare" in err.decode()
        assert [e["reason"] for e in fake.events] == ["AscendFaultDrained"]
    finally:
        await proxy.stop()
        await fake.stop()
