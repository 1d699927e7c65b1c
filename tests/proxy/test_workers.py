"""``--workers N``: N processes on one port, admin calls applied by every worker, metrics merged."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from ascend_runtime.proxy.workers import merge_expositions
from tests.proxy.conftest import free_port

REQ = {"model": "deepseek-r1", "prompt": "a b c d", "max_tokens": 4, "stream": True}
AUTH = {"Authorization": "Bearer s3cret"}


async def _start(args: list[str]) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ascend_runtime", "proxy", "--port", str(port), "--workers", "2",
                             "--health-interval-s", "0", "--admin-token-env", "WORKERS_TEST_TOKEN",
                             "--log-level", "WARNING", *args],
                            stderr=subprocess.PIPE, env={**os.environ, "WORKERS_TEST_TOKEN": "s3cret"}, text=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await asyncio.wait_for(loop.run_in_executor(None, proc.stderr.readline), 60)  # type: ignore[union-attr]
        assert line, "the supervisor exited before listening"
        m = re.search(r"\(2 workers; worker sockets in (\S+)\)", line)
        if m:
            return proc, f"http://127.0.0.1:{port}", Path(m.group(1))


async def _local(rundir: Path, i: int, path: str) -> bytes:
    """One worker's own answer, on its Unix socket."""
    conn = aiohttp.UnixConnector(path=str(rundir / f"worker-{i}.sock"))
    async with aiohttp.ClientSession(connector=conn) as s, s.get("http://w" + path, headers=AUTH) as r:
        assert r.status == 200
        return await r.read()


def _sum(text: bytes, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.decode().splitlines() if line.startswith(prefix))


async def _requests(url: str, n: int) -> list[str]:
    """n streamed requests, each on a new connection (so the kernel spreads them over the workers)."""
    decodes = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        for _ in range(n):
            async with s.post(url + "/v1/completions", json=REQ) as r:
                assert r.status == 200
                assert (await r.read()).endswith(b"data: [DONE]\n\n")
                decodes.append(r.headers["x-decode-instance"])
    return decodes


async def test_two_workers_admin_everywhere_and_merged_metrics(stubs):
    p = await stubs("prefill", "p0")
    d0 = await stubs("decode", "d0")
    d1 = await stubs("decode", "d1")
    proc, url, rundir = await _start(["--prefill", f"{p.url},name=p0", "--decode", f"{d0.url},name=d0",
                                      "--decode", f"{d1.url},name=d1"])
    try:
        assert (rundir.stat().st_mode & 0o777) == 0o700
        await _requests(url, 40)
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/metrics") as r:
                merged = await r.read()
        local = [await _local(rundir, i, "/metrics") for i in (0, 1)]
        ok = 'ascend_proxy_requests_total{endpoint="/v1/completions",outcome="success",status="200"}'
        per_worker = [_sum(t, ok) for t in local]
        assert all(n > 0 for n in per_worker), per_worker  # both workers took connections
        assert _sum(merged, ok) == sum(per_worker) == 40
        assert 'ascend_proxy_worker_up{worker="0"} 1.0' in merged.decode()
        assert 'ascend_proxy_worker_up{worker="1"} 1.0' in merged.decode()
        assert _sum(merged, "ascend_proxy_relayed_events_total") == sum(
            _sum(t, "ascend_proxy_relayed_events_total") for t in local) > 0

        # drain applies to every worker before the answer
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/admin/instances/drain", json={"name": "d0"}, headers=AUTH) as r:
                assert r.status == 200
                assert (await r.json())["workers"] == {"0": "ok", "1": "ok"}
        for i in (0, 1):
            listing = json.loads(await _local(rundir, i, "/admin/instances"))
            assert {x["name"]: x["draining"] for x in listing["instances"]}["d0"] is True
        assert set(await _requests(url, 20)) == {"d1"}

        # add and remove reach every worker too; the listing covers all workers
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/admin/instances/add", headers=AUTH,
                              json={"name": "d2", "role": "decode", "url": d0.url}) as r:
                assert r.status == 200
            for i in (0, 1):
                assert "d2" in {x["name"] for x in json.loads(await _local(rundir, i, "/admin/instances"))["instances"]}
            async with s.get(url + "/admin/instances", headers=AUTH) as r:
                listing = await r.json()
                assert listing["workers"] == [0, 1]
                served = {x["name"]: x["served"] for x in listing["instances"]}
                assert served["d0"] + served["d1"] == 60  # summed over both workers
            async with s.post(url + "/admin/instances/remove", json={"name": "d2"}, headers=AUTH) as r:
                assert r.status == 200
            for i in (0, 1):
                assert "d2" not in {x["name"] for x in json.loads(await _local(rundir, i, "/admin/instances"))["instances"]}
            async with s.post(url + "/admin/instances/drain", json={"name": "d0"}) as r:
                assert r.status == 401  # fan-out does not open the admin API
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.get_running_loop().run_in_executor(None, proc.wait, 30) == 0
    assert not rundir.exists()


async def test_workers_flag_validated():
    for value, expected in (("0", "must be 1 or more"), ("100000", "must be 256 or less")):
        out = subprocess.run([sys.executable, "-m", "ascend_runtime", "proxy", "--workers", value,
                              "--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (value, out.stderr)
        assert "--workers" in out.stderr and expected in out.stderr and "Traceback" not in out.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


async def test_workers_stop_when_the_supervisor_is_killed(stubs):
    """A supervisor killed with SIGKILL cannot stop its workers; they notice the re-parenting and exit."""
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    proc, url, rundir = await _start(["--prefill", f"{p.url},name=p0", "--decode", f"{d.url},name=d0"])
    children = [int(c) for t in Path(f"/proc/{proc.pid}/task").iterdir()
                for c in (t / "children").read_text().split()]
    workers = [c for c in children if "spawn_main" in Path(f"/proc/{c}/cmdline").read_text()]
    assert len(workers) == 2, children
    proc.kill()
    proc.wait()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30  # a bound for a hung worker, not a speed claim: they check every second
    while any(_alive(w) for w in workers) and loop.time() < deadline:
        await asyncio.sleep(0.2)
    left = [w for w in workers if _alive(w)]
    for w in left:
        os.kill(w, signal.SIGKILL)
    assert not left, "workers outlived their supervisor"


def test_merge_rules():
    a = (b"# HELP x_total c\n# TYPE x_total counter\nx_total{i=\"a\"} 2.0\nx_created{i=\"a\"} 100.0\n"
         b"ascend_proxy_instance_routable{i=\"a\"} 1.0\nascend_proxy_instance_ejected{i=\"a\"} 0.0\n"
         b"h_bucket{le=\"0.1\"} 3.0\n")
    b = (b"# HELP x_total c\n# TYPE x_total counter\nx_total{i=\"a\"} 5.0\nx_total{i=\"b\"} 1.0\n"
         b"x_created{i=\"a\"} 50.0\nascend_proxy_instance_routable{i=\"a\"} 0.0\n"
         b"ascend_proxy_instance_ejected{i=\"a\"} 1.0\nh_bucket{le=\"0.1\"} 4.0\n")
    out = merge_expositions({0: a, 1: b}).decode().splitlines()
    assert out.count("# HELP x_total c") == 1
    assert 'x_total{i="a"} 7.0' in out and 'x_total{i="b"} 1.0' in out
    assert 'x_created{i="a"} 50.0' in out
    assert 'ascend_proxy_instance_routable{i="a"} 0.0' in out  # routable only if routable in every worker
    assert 'ascend_proxy_instance_ejected{i="a"} 1.0' in out
    assert 'h_bucket{le="0.1"} 7.0' in out
    assert 'ascend_proxy_worker_up{worker="1"} 1.0' in out
