"""The committed stacks plan as the published deployments say, deterministically."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ascend_runtime.config.loader import available_stacks
from ascend_runtime.planner import load_plan


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ascend_runtime", *args], capture_output=True, text=True, timeout=120)


def test_a2_staging_matches_published_deployment() -> None:
    plan = load_plan("a2-staging")
    (prefill,) = plan.by_role("prefill")
    (decode,) = plan.by_role("decode")
    assert (prefill.npus, len(prefill.ranks), prefill.dp, prefill.tp, prefill.ep) == (16, 2, 2, 8, 16)
    assert (decode.npus, len(decode.ranks), decode.dp, decode.tp, decode.ep) == (32, 4, 32, 1, 32)
    assert set(prefill.nodes).isdisjoint(decode.nodes)
    assert plan.kv_connector == "mooncake" and plan.vllm_ascend_version == "0.23.0"


def test_plan_table_and_json_are_deterministic() -> None:
    table = run_cli("plan", "--stack", "a2-staging")
    assert table.returncode == 0, table.stderr
    assert "prefill: 1 instance(s), 16 NPUs on 2 nodes" in table.stdout
    assert "decode: 1 instance(s), 32 NPUs on 4 nodes" in table.stdout
    first = run_cli("plan", "--stack", "a2-staging", "--json")
    second = run_cli("plan", "--stack", "a2-staging", "--json")
    assert first.returncode == 0 and first.stdout == second.stdout
    data = json.loads(first.stdout)
    assert [i["npus"] for i in data["instances"]] == [16, 32]


def test_plan_kv_ports_are_the_instances_and_the_proxy_line_gives_the_total() -> None:
    """The KV-port column spans every rank's listening block (as DEPLOYMENT.md does), not the first node's;
    the proxy line's workers "in all" are the replicas' total, the need named as such."""
    from ascend_runtime.cli.commands.plan import plan_table, summary_lines
    from ascend_runtime.render.launch import deployment_sheet

    plan = load_plan("cm384-prod")
    table = plan_table(plan)
    kv_column = next(c for c in table.columns if c.header == "KV ports")
    deployment = deployment_sheet(plan)
    for inst, cell in zip(plan.instances, kv_column._cells):
        ports = [p for r in inst.ranks for p in r.kv_listen_ports]
        assert cell == f"{min(ports)}-{max(ports)}" and f"| {cell} |" in deployment, (inst.name, cell)
    proxy = plan.proxy
    line = summary_lines(plan)[-1]
    total = proxy.replicas * proxy.workers_per_replica
    assert f"{total} worker(s) in all" in line and f"{proxy.workers} worker(s) needed" in line, line


def test_cm384_instances_stay_in_one_super_pod() -> None:
    result = run_cli("plan", "--stack", "cm384-prod", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["instances"]) >= 4
    pods_used = set()
    for inst in data["instances"]:
        pods = {d["super_pod_id"] for r in inst["ranks"] for d in r["devices"]}
        assert len(pods) == 1, inst["name"]
        assert inst["super_pod_id"] in pods
        pods_used |= pods
    assert len(pods_used) >= 2


@pytest.mark.parametrize("name", available_stacks())
def test_every_stack_satisfies_plan_invariants(name: str) -> None:
    plan = load_plan(name)
    seen = set()
    for inst in plan.instances:
        assert sorted(d.global_rank for r in inst.ranks for d in r.devices) == list(range(inst.npus))
        assert inst.dp * inst.tp == inst.npus
        for rank in inst.ranks:
            assert rank.kv_port_count == len(rank.devices)
            for dev in rank.devices:
                assert (rank.node, dev.device_id) not in seen
                seen.add((rank.node, dev.device_id))
    roles = {}
    for rank in plan.ranks:
        assert roles.setdefault(rank.node, rank.role) == rank.role
    assert plan.to_json() == load_plan(name).to_json()


def test_dp_ranks_split_across_nodes() -> None:
    plan = load_plan("a2-staging")
    decode = plan.by_role("decode")[0]
    assert [(r.dp_start_rank, r.dp_local) for r in decode.ranks] == [(0, 8), (8, 8), (16, 8), (24, 8)]
    assert all(r.is_leader == (r.index == 0) for r in decode.ranks)
