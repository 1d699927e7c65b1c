"""``serving: rank``: the Plan gives every DP rank its own API server and port, and says which instance
each belongs to; ``serving: instance`` plans one server per instance as before."""

from __future__ import annotations

from collections import Counter

import pytest

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner import load_plan


def _rank(config: dict) -> None:
    config["ascend-deepseek:serving"] = "rank"


@pytest.mark.parametrize("stack", ["a2-staging", "cm384-prod", "local"])
def test_every_dp_rank_is_an_endpoint_of_its_instance(stack: str, stack_copy) -> None:
    plan = load_plan(stack, str(stack_copy(stack, edit_config=_rank)))
    endpoints = plan.endpoints()
    for inst in plan.instances:
        mine = [e for e in endpoints if e.get("instance") == inst.name]
        assert len(mine) == inst.dp, (inst.name, len(mine))
        assert {e["name"] for e in mine} == {f"{inst.name}-dp{r}" for r in range(inst.dp)}
        assert all(e["role"] == inst.role for e in mine)
        assert mine[0]["url"] == inst.api_url  # DP rank 0 keeps the instance's own port
        for rank in inst.ranks:  # each node runs its own ranks, on its own host
            urls = {e["url"] for e in mine if int(e["name"].rsplit("dp", 1)[1]) in rank.dp_ranks}
            assert len(urls) == rank.dp_local and all(f"//{rank.host_ip}:" in u for u in urls)
    hosts_ports = Counter(e["url"] for e in endpoints)
    assert max(hosts_ports.values()) == 1, [u for u, n in hosts_ports.items() if n > 1]  # no two servers share one
    lo, hi = plan.config["ports"]["api_base"], plan.config["ports"]["dp_rpc_base"]
    assert all(lo <= int(e["url"].rsplit(":", 1)[1]) for e in endpoints)
    assert not (lo <= hi < lo + len(endpoints)) or all(int(e["url"].rsplit(":", 1)[1]) < hi for e in endpoints)


def test_instance_serving_is_one_endpoint_per_instance(stack_copy) -> None:
    plan = load_plan("cm384-prod", str(stack_copy("cm384-prod")))
    assert [e["name"] for e in plan.endpoints()] == [i.name for i in plan.instances]
    assert all("instance" not in e for e in plan.endpoints())
    assert all(not r.api_ports for r in plan.ranks)
    assert "serving" not in plan.to_json()


def test_rank_ports_that_run_into_another_range_are_refused(stack_copy) -> None:
    def crowd(config: dict) -> None:
        _rank(config)
        base = config.get("ascend-deepseek:ports", {}).get("api_base", 8000)
        config.setdefault("ascend-deepseek:ports", {})["proxy"] = base + 40  # inside the rank ports, free without
    stacks = stack_copy("cm384-prod", edit_config=crowd)
    with pytest.raises(ConfigError) as refused:
        load_plan("cm384-prod", str(stacks))
    assert "ports." in str(refused.value)
    plan = load_plan("cm384-prod", str(stack_copy("cm384-prod", edit_config=lambda c: c.setdefault(
        "ascend-deepseek:ports", {}).update(proxy=c.get("ascend-deepseek:ports", {}).get("api_base", 8000) + 40))))
    assert plan.endpoints()  # the same ports are fine with one server per instance


def test_rank_serving_with_the_dense_cpu_engine_is_refused_naming_the_key(stack_copy) -> None:
    with pytest.raises(ConfigError) as refused:
        load_plan("local-vllm", str(stack_copy("local-vllm", edit_config=_rank)))
    text = str(refused.value)
    assert "serving" in text and "dense" in text and "serving: instance" in text


def test_plan_prints_every_rank_server(stack_copy) -> None:
    from ascend_runtime.cli.commands.plan import summary_lines

    plan = load_plan("a2-staging", str(stack_copy("a2-staging", edit_config=_rank)))
    lines = summary_lines(plan)
    for inst in plan.instances:
        (line,) = [x for x in lines if x.startswith(f"{inst.name} API servers")]
        assert all(f"dp{e.dp_rank} {e.host}:{e.port}" in line for e in inst.api_endpoints), line
    assert not [x for x in summary_lines(load_plan("a2-staging")) if "API servers" in x]  # instance serving: none


def test_rank_serving_on_kind_is_refused_naming_the_key(stack_copy) -> None:
    with pytest.raises(ConfigError) as refused:
        load_plan("kind", str(stack_copy("kind", edit_config=_rank)))
    text = str(refused.value)
    assert "serving" in text and "kind" in text and "target: local" in text
