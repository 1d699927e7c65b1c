"""The `ascend-deploy sim` command: two real processes doing a PD round trip."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import aiohttp

from ascend_runtime.config.model import ModelShape

ADMIN_TOKEN = "cli-test-admin-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(role: str, name: str, port: int, kv_port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "ascend_runtime", "sim", "--role", role, "--instance", name, "--host", "127.0.0.1",
         "--port", str(port), "--kv-port", str(kv_port), "--speedup", "100", "--admin-token-env", "SIM_ADMIN_TOKEN"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "SIM_ADMIN_TOKEN": ADMIN_TOKEN})


async def wait_healthy(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(200):
        try:
            async with http.get(f"{url}/health") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never became healthy")


async def test_pd_round_trip_between_processes(http):
    ports = [free_port() for _ in range(4)]
    procs = [launch("prefill", "p-proc", ports[0], ports[1]), launch("decode", "d-proc", ports[2], ports[3])]
    try:
        p, d = (f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[2]}")
        await asyncio.gather(wait_healthy(http, p), wait_healthy(http, d))
        prompt = " ".join(["x"] * 300)
        async with http.post(f"{p}/v1/completions", json={"prompt": prompt, "max_tokens": 1, "min_tokens": 1,
                                                          "kv_transfer_params": {"do_remote_decode": True}}) as r:
            kv = (await r.json())["kv_transfer_params"]
        assert kv["remote_port"] == ports[1]
        async with http.post(f"{d}/v1/completions", json={"prompt": prompt, "max_tokens": 3,
                                                          "kv_transfer_params": kv}) as r:
            assert r.status == 200 and r.headers["x-instance"] == "d-proc"
            assert int(r.headers["x-kv-modelled-bytes"]) == 300 * ModelShape().kv_bytes_per_token()
            assert (await r.json())["usage"]["completion_tokens"] == 3
        async with http.post(f"{d}/admin/faults", json={"exit": True}) as r:
            assert r.status == 401  # the session carries another token: no fault
        async with http.post(f"{d}/admin/faults", json={"exit": True},
                             headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
            assert r.status == 200
        assert procs[1].wait(timeout=10) != 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)


def test_invalid_shape_exits_2():
    out = subprocess.run([sys.executable, "-m", "ascend_runtime", "sim", "--role", "decode", "--instance", "x",
                          "--port", "1", "--kv-port", "2", "--npus", "8", "--dp", "8", "--tp", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "per NPU" in out.stderr


def test_an_option_out_of_range_is_named_as_the_flag_without_pydantic_noise():
    import contextlib
    import io

    from ascend_runtime.cli import main as cli_main

    argv = ["sim", "--role", "decode", "--instance", "x", "--port", "70000", "--kv-port", "30000"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli_main(argv)
    assert code == 2
    text = err.getvalue()
    assert "--port:" in text and "65535" in text and "(got 70000)" in text
    assert "errors.pydantic.dev" not in text and "validation error for" not in text
