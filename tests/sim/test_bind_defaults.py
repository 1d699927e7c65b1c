"""Every server the CLI starts listens on 127.0.0.1 unless told otherwise; pods say 0.0.0.0 explicitly."""

from __future__ import annotations

import argparse

import pytest

from ascend_runtime.cli import build_parser
from ascend_runtime.cli.commands.proxy import config_from_args as proxy_config
from ascend_runtime.cli.commands.sim import config_from_args as sim_config
from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects import build_system

LOOPBACK = "127.0.0.1"


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_proxy_binds_loopback_by_default() -> None:
    args = _parse("proxy", "--decode", "http://127.0.0.1:1", "--prefill", "http://127.0.0.1:2")
    assert args.host == LOOPBACK
    assert proxy_config(args).host == LOOPBACK
    assert _parse("proxy", "--host", "0.0.0.0", "--decode", "http://x:1").host == "0.0.0.0"


def test_simulator_binds_loopback_by_default() -> None:
    args = _parse("sim", "--role", "decode", "--instance", "d", "--port", "1", "--kv-port", "2")
    assert args.host == LOOPBACK
    cfg = sim_config(args)
    assert cfg.host == LOOPBACK and cfg.resolved().kv_host == LOOPBACK


def test_balancer_metrics_bind_loopback_by_default() -> None:
    args = _parse("balance", "serve", "--ranks", "4", "--slots", "72", "--instance", "d=http://127.0.0.1:1", "--dry-run")
    assert args.metrics_host == LOOPBACK


def test_checks_start_no_server() -> None:
    """`check smoke` and `check throughput` are clients: no listen address to default."""
    for sub in (["check", "smoke", "--endpoint", "http://127.0.0.1:1"],
                ["check", "throughput", "--endpoint", "http://127.0.0.1:1", "--input-len", "1", "--output-len", "1",
                 "--num-prompts", "1", "--concurrency", "1"]):
        args = vars(_parse(*sub))
        assert not {"host", "bind_host", "metrics_host", "listen"} & set(args), sub


@pytest.mark.parametrize("stack", ["kind", "a2-staging", "cm384-prod"])
def test_pods_pass_the_listen_address_explicitly(stack: str) -> None:
    """Proxy, balancer metrics and the kind simulator must be reachable from other pods: --host 0.0.0.0 is given."""
    plan = load_plan(stack)
    seen = set()
    for obj in build_system(plan).all():
        if obj["kind"] == "LeaderWorkerSet":  # the leader serves the API
            cmd = obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["command"]
        elif obj["kind"] in ("Deployment", "Job"):
            cmd = obj["spec"]["template"]["spec"]["containers"][0]["command"]
        else:
            continue
        if cmd[:2] == ["ascend-deploy", "proxy"]:
            assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
            seen.add("proxy")
        elif cmd[:3] == ["ascend-deploy", "balance", "serve"]:
            assert cmd[cmd.index("--metrics-host") + 1] == "0.0.0.0"
            seen.add("balancer")
        elif cmd[:2] == ["ascend-deploy", "sim"]:
            assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
            seen.add("sim")
    assert "proxy" in seen and ("sim" in seen) == (plan.target == "kind")
