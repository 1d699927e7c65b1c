"""Entrypoint scripts: syntax, shellcheck, the rank guard, the whole-instance restart watcher of per-rank
scripts, and the one worker script of a LeaderWorkerSet instance."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ascend_runtime.planner import Plan
from ascend_runtime.render.launch import (
    hccn_conf,
    launch_script,
    leader_watch_script,
    worker_launch_script,
    worker_script_name,
)
from ascend_runtime.render.paths import LEADER_WATCH

STACKS = ("a2-staging", "cm384-prod", "kind", "local")


def _write_scripts(plan: Plan, directory: Path) -> list[Path]:
    paths = []
    for rank in plan.ranks:
        path = directory / f"{rank.name}.sh"
        path.write_text(launch_script(plan, rank))
        path.chmod(0o755)
        paths.append(path)
    (directory / LEADER_WATCH).write_text(leader_watch_script())
    paths.append(directory / LEADER_WATCH)
    for inst in plan.instances:
        if len(inst.ranks) > 1:  # every committed stack's multi-node instance runs under a LeaderWorkerSet
            path = directory / worker_script_name(inst)
            path.write_text(worker_launch_script(plan, inst))
            paths.append(path)
    return paths


@pytest.mark.parametrize("stack", STACKS)
def test_scripts_pass_bash_n_and_shellcheck(plans: dict[str, Plan], stack: str, tmp_path: Path) -> None:
    paths = _write_scripts(plans[stack], tmp_path)
    for path in paths:
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is required (tests/run.sh installs it)"
    # -x follows the `source` of leader-watch.sh (resolved beside each script)
    result = subprocess.run([shellcheck, "-x", "--severity=style", *map(str, paths)], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stdout


def test_script_exports_env_and_argv_verbatim(plans: dict[str, Plan]) -> None:
    plan = plans["a2-staging"]
    text = launch_script(plan, plan.ranks[1])
    assert "export HCCL_IF_IP=192.0.2.12\n" in text
    assert "'{\"method\":\"mtp\",\"num_speculative_tokens\":1}'" in text
    assert "--headless" in text and "exec \"${engine_cmd[@]}\"" not in text
    assert "exec \"${engine_cmd[@]}\"" in launch_script(plan, plan.ranks[0])


def test_worker_script_takes_its_rank_at_run_time(plans: dict[str, Plan]) -> None:
    """One script for every headless rank: no rank's start rank, engine_id or node IP is baked in."""
    plan = plans["cm384-prod"]
    inst = plan.instance("decode-0")
    text = worker_launch_script(plan, inst)
    assert '"$DP_START_RANK"' in text and "readonly DP_START_RANK=$((worker_index * DP_LOCAL))" in text
    assert "\"engine_id\":\"cm384-prod-decode-0-'\"$worker_index\"'\"" in text
    for rank in inst.ranks[1:]:
        assert rank.engine_id not in text and f"  {rank.node})\n    export HCCL_IF_IP={rank.host_ip}\n" in text
    assert f"export HCCL_IF_IP={inst.ranks[0].host_ip}" not in text  # the leader's node is not a worker node
    assert "--headless" in text and 'exec "${engine_cmd[@]}"' in text
    assert "leader-watch" not in text and "watch_leader" not in text  # the LeaderWorkerSet restarts the group
    assert text.startswith("#!/usr/bin/env bash\n# decode-0-worker.sh: ")


def _fake_vllm(bin_dir: Path, log: Path, exit_after: float | None = None) -> None:
    body = f'echo "$$ $*" >> {log}\n' + (f"sleep {exit_after}\nexit 3\n" if exit_after else "exec sleep 300\n")
    (bin_dir / "vllm").write_text("#!/usr/bin/env bash\n" + body)
    (bin_dir / "vllm").chmod(0o755)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run(script: Path, bin_dir: Path, *args: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "ASCEND_DEPLOY_CHECK_FILES": "0",
        "ASCEND_DEPLOY_LEADER_POLL_S": "0.2",
        "ASCEND_DEPLOY_LEADER_FAILURES": "2",
        "ASCEND_DEPLOY_STARTUP_TIMEOUT_S": "20",
    }
    return subprocess.Popen(["bash", str(script), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_rank_guard_refuses_another_rank(plans: dict[str, Plan], tmp_path: Path) -> None:
    plan = plans["local"]
    script = _write_scripts(plan, tmp_path)[0]
    _fake_vllm(tmp_path, tmp_path / "log", exit_after=0.1)
    proc = _run(script, tmp_path, "decode-0-rank0")
    assert proc.wait(timeout=10) == 64
    proc = _run(script, tmp_path, plan.ranks[0].name)
    assert proc.wait(timeout=10) == 3  # the leader execs the engine: its status is the script's


def test_headless_rank_exits_when_leader_goes_away(edited_plan, tmp_path: Path) -> None:
    """Whole-instance restart: a headless rank stops its engine and exits 75 when the leader is lost."""
    leader_host = "127.0.1.1"  # the local stack's first node
    port = _free_port(leader_host)
    plan = edited_plan("local", lambda c: c["ports"].update(api_base=port))
    headless = plan.instance("prefill-0").ranks[1]
    assert plan.instance("prefill-0").api_host == leader_host and not headless.is_leader
    script = tmp_path / "headless.sh"
    script.write_text(launch_script(plan, headless))
    (tmp_path / LEADER_WATCH).write_text(leader_watch_script())
    log = tmp_path / "vllm.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_vllm(bin_dir, log)
    server = _listen(leader_host, port)
    dp_port = _listen(leader_host, plan.instance("prefill-0").dp_rpc_port)  # the leader's DP handshake port
    proc = _run(script, bin_dir)
    try:
        deadline = time.monotonic() + 10
        while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pid_text, argv = log.read_text().split(" ", 1)
        assert "--headless" in argv and "--data-parallel-start-rank 1" in argv
        time.sleep(1.0)
        assert proc.poll() is None, proc.communicate()
        server.close()
        assert proc.wait(timeout=20) == 75
        assert "leader" in proc.stderr.read()
        engine_pid = int(pid_text)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(engine_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the engine was not stopped")
    finally:
        server.close()
        dp_port.close()
        if proc.poll() is None:
            proc.kill()


def _listen(host: str, port: int) -> socket.socket:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(16)
    return server


def test_headless_rank_starts_its_engine_once_the_leaders_dp_port_opens(edited_plan, tmp_path: Path) -> None:
    """vLLM 0.23.0's engine gives up on the leader's handshake after 5 minutes (vllm/v1/engine/core.py
    HANDSHAKE_TIMEOUT_MINS): a headless rank starts its engine only once --data-parallel-rpc-port accepts
    connections, and exits 75 without starting it when the port stays closed for the startup budget."""
    leader_host = "127.0.1.1"
    plan = edited_plan("local", lambda c: c["ports"].update(api_base=_free_port(leader_host),
                                                            dp_rpc_base=_free_port(leader_host)))
    inst = plan.instance("prefill-0")
    script = tmp_path / "headless.sh"
    script.write_text(launch_script(plan, inst.ranks[1]))
    (tmp_path / LEADER_WATCH).write_text(leader_watch_script())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "vllm.log"
    _fake_vllm(bin_dir, log, exit_after=0.2)
    proc = _run(script, bin_dir)
    try:
        time.sleep(1.5)
        assert proc.poll() is None and not log.exists()  # waiting: the engine is not started before the leader
        dp_port = _listen(leader_host, inst.dp_rpc_port)
        api = _listen(leader_host, inst.api_port)
        try:
            assert proc.wait(timeout=30) == 3  # the engine ran (and exited 3): the rank ends with its status
        finally:
            dp_port.close()
            api.close()
        assert "--headless" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    log.unlink()
    env_budget = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ASCEND_DEPLOY_CHECK_FILES": "0",
                  "ASCEND_DEPLOY_LEADER_POLL_S": "0.2", "ASCEND_DEPLOY_STARTUP_TIMEOUT_S": "1"}
    done = subprocess.run(["bash", str(script)], env=env_budget, capture_output=True, text=True, timeout=60)
    assert done.returncode == 75 and "did not open" in done.stderr and not log.exists()


def test_hccn_conf_from_inventory_and_plan(plans: dict[str, Plan]) -> None:
    from ascend_runtime.config.loader import load_stack

    plan = plans["a2-staging"]
    inventory = load_stack("a2-staging").inventory
    text = hccn_conf(plan, "a2-node-01", inventory)
    assert "address_0=198.51.100.10\nnetmask_0=255.255.255.0\nnetdetect_0=198.51.100.1\ngateway_0=198.51.100.1\n" in text
    assert text.count("address_") == 8
    bare = hccn_conf(plan, "a2-node-01")
    assert "address_7=198.51.100.17" in bare and "netmask_" not in bare
    with pytest.raises(KeyError):
        hccn_conf(plan, "no-such-node")


def test_scripts_set_up_the_image_environment_first(plans: dict[str, Plan], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's set_env scripts run before the Plan's exports (which win), a missing one is skipped, one
    that trips `set -eu` does not stop the script, and LD_LIBRARY_PATH gains the release's directories in
    front (vLLM-Ascend v0.23.0 tests/e2e/nightly/multi_node/scripts/run.sh)."""
    from ascend_runtime.engine.releases import RELEASES
    from ascend_runtime.render import launch
    from ascend_runtime.render.environment import rank_env

    plan = plans["a2-staging"]
    rank = plan.ranks[0]
    text = launch_script(plan, rank)
    row = RELEASES["0.23.0"]
    for path in row.image_env_scripts:
        assert f" {path}" in text
    assert "library_path=/usr/local/lib:/usr/local/Ascend/ascend-toolkit/latest/python/site-packages\n" in text
    assert text.index("source \"$image_env_script\"") < text.index("export HCCL_IF_IP=")

    cann = tmp_path / "cann.sh"
    cann.write_text('export FROM_IMAGE_ENV="$UNSET_IN_THIS_SHELL"yes\nexport HCCL_IF_IP=203.0.113.9\nfalse\n')
    atb = tmp_path / "atb.sh"
    atb.write_text("export ATB_FROM_IMAGE=1\n")
    monkeypatch.setattr(launch, "image_environment", lambda p: {
        "scripts": [str(cann), str(tmp_path / "missing.sh"), str(atb)], "library_path": "/opt/a:/opt/b"})
    script = tmp_path / "rank.sh"
    script.write_text(launch_script(plan, rank))
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "vllm").write_text('#!/usr/bin/env bash\nenv -0 > "$STUB_OUT/env"\n')
    (tmp_path / "vllm").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASCEND_DEPLOY_") and k != "LD_LIBRARY_PATH"}
    env.update(PATH=f"{tmp_path}:/usr/bin:/bin", STUB_OUT=str(out), ASCEND_DEPLOY_CHECK_FILES="0")
    result = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    got = dict(item.split("=", 1) for item in (out / "env").read_text().split("\0") if "=" in item)
    assert got["FROM_IMAGE_ENV"] == "yes" and got["ATB_FROM_IMAGE"] == "1"
    assert got["LD_LIBRARY_PATH"] == "/opt/a:/opt/b"
    for key, value in rank_env(plan, rank).items():
        assert got[key] == value, key  # the Plan's exports come after the image's scripts
