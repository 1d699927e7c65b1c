"""serving: rank launch scripts (docs/rank-serving.md), run under bash with a stand-in ``vllm``: a node's script
starts one server per DP rank with its own --data-parallel-rank, --port and TP devices, starts the others only
once DP rank 0's --data-parallel-rpc-port accepts connections, and exits (stopping the rest) when any server
exits. The recorded argv then goes through vLLM 0.23.0's own ``vllm serve`` argument parser when the real
engine is installed."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ascend_runtime.local.vllm_engine.install import engine_env
from ascend_runtime.planner import Plan
from ascend_runtime.render.launch import launch_script, rank_servers, worker_launch_script, worker_script_name

#: The stand-in engine: one line per start (devices, then argv as JSON); the server of DP rank EXIT_RANK exits 3.
FAKE_VLLM = """#!/usr/bin/env bash
python3 -c 'import json, os, sys; print(os.environ["ASCEND_RT_VISIBLE_DEVICES"], json.dumps(sys.argv[1:]))' "$@" >> "$STUB_LOG"
for ((i = 1; i < $#; i++)); do
  if [ "${!i}" = --data-parallel-rank ]; then
    j=$((i + 1))
    if [ "${!j}" = "${EXIT_RANK:-none}" ]; then sleep 1; exit 3; fi
  fi
done
exec sleep 300
"""


@pytest.fixture
def rank_plan(edited_plan: Callable[..., Plan]) -> Plan:
    return edited_plan("local", lambda cfg: cfg.__setitem__("serving", "rank"))


def _run(script: Path, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "vllm").write_text(FAKE_VLLM)
    (tmp_path / "vllm").chmod(0o755)
    full = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "ASCEND_DEPLOY_CHECK_FILES": "0",
            "ASCEND_DEPLOY_LEADER_POLL_S": "0.2", "ASCEND_DEPLOY_STARTUP_TIMEOUT_S": "20",
            "STUB_LOG": str(tmp_path / "log"), **env}
    return subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=90)


def _started(tmp_path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for line in (tmp_path / "log").read_text().splitlines():
        devices, argv = line.split(" ", 1)
        out.append((devices, ["vllm", *json.loads(argv)]))
    return out


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        pytest.skip(f"{host}:{port} is taken: {exc}")
    sock.listen(64)
    return sock


def _expected(plan: Plan, rank) -> list[tuple[str, list[str]]]:
    return [(",".join(map(str, devices)), argv) for _, _, devices, argv in rank_servers(plan, rank)]


def test_leader_node_starts_every_rank_and_exits_with_the_first_that_exits(rank_plan: Plan, tmp_path: Path) -> None:
    inst = rank_plan.instance("decode-0")
    leader = inst.ranks[0]
    script = tmp_path / f"{leader.name}.sh"
    script.write_text(launch_script(rank_plan, leader))
    with _listen(inst.api_host, inst.dp_rpc_port):  # DP rank 0's front end (the stand-in does not bind it)
        started = time.monotonic()
        done = _run(script, tmp_path, {"EXIT_RANK": "5"})
    assert done.returncode == 3, done.stderr
    assert time.monotonic() - started < 60  # the other seven servers were stopped, not waited for
    assert "a DP rank's server exited with status 3" in done.stderr
    assert sorted(_started(tmp_path), key=lambda s: s[1]) == sorted(_expected(rank_plan, leader), key=lambda s: s[1])
    # rank 0 first: the script says so before it starts each server (the servers' own logs may interleave)
    starts = [line for line in done.stderr.splitlines() if "ascend-deploy: starting" in line]
    assert f"DP rank {leader.dp_start_rank} on port" in starts[0], starts


def test_worker_node_waits_for_rank_0_then_starts_its_ranks(rank_plan: Plan, tmp_path: Path) -> None:
    inst = rank_plan.instance("decode-0")
    worker = inst.ranks[2]
    script = tmp_path / worker_script_name(inst)
    script.write_text(worker_launch_script(rank_plan, inst))
    env = {"LWS_WORKER_INDEX": str(worker.index), "ASCEND_DEPLOY_NODE": worker.node, "ASCEND_DEPLOY_STARTUP_TIMEOUT_S": "1"}
    refused = _run(script, tmp_path, env)
    assert refused.returncode == 75 and not (tmp_path / "log").exists(), refused.stderr  # no rank 0: nothing started
    with _listen(inst.api_host, inst.dp_rpc_port):
        done = _run(script, tmp_path, {**env, "EXIT_RANK": str(worker.dp_start_rank + 7),
                                       "ASCEND_DEPLOY_STARTUP_TIMEOUT_S": "20"})
    assert done.returncode == 3, done.stderr
    assert sorted(_started(tmp_path), key=lambda s: s[1]) == sorted(_expected(rank_plan, worker), key=lambda s: s[1])


def test_rank_argv_passes_vllms_own_parser(rank_plan: Plan, tmp_path: Path) -> None:
    """Every DP rank's argv of a node through vLLM 0.23.0's ``vllm serve`` parser (make_arg_parser, with the
    JSON options parsed into their config classes): the rank, the port, no local DP size, one API server."""
    python = engine_env().python
    if not python.exists():
        pytest.skip(f"the real engine is not installed ({python})")
    inst = rank_plan.instance("decode-0")
    cases = [argv[2:] for rank in (inst.ranks[0], inst.ranks[1]) for _, _, _, argv in rank_servers(rank_plan, rank)]
    code = ("import json, sys\n"
            "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
            "from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
            "parser = make_arg_parser(FlexibleArgumentParser())\n"
            "out = []\n"
            "for argv in json.load(sys.stdin):\n"
            "    ns = parser.parse_args(argv)\n"
            "    out.append([ns.data_parallel_rank, ns.port, ns.data_parallel_size, ns.data_parallel_size_local,\n"
            "                ns.api_server_count, ns.headless, ns.kv_transfer_config.engine_id])\n"
            "print(json.dumps(out))\n")
    done = subprocess.run([str(python), "-c", code], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    want = [[dp_rank, port, inst.dp, None, None, False, f"{rank_plan.stack}-{inst.name}-dp{dp_rank}"]
            for rank in (inst.ranks[0], inst.ranks[1]) for dp_rank, port, _, _ in rank_servers(rank_plan, rank)]
    assert got == want


def test_shellcheck(rank_plan: Plan, tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is required (tests/run.sh installs it)"
    paths = []
    for inst in rank_plan.instances:
        paths.append(tmp_path / f"{inst.ranks[0].name}.sh")
        paths[-1].write_text(launch_script(rank_plan, inst.ranks[0]))
        paths.append(tmp_path / worker_script_name(inst))
        paths[-1].write_text(worker_launch_script(rank_plan, inst))
    result = subprocess.run([shellcheck, "--severity=style", *map(str, paths)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
