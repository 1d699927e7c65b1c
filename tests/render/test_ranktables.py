"""Rank tables: schemas and the invariants HCCL and vLLM-Ascend rely on."""

from __future__ import annotations

import jsonschema
import pytest

from ascend_runtime.planner import Plan
from ascend_runtime.render.ranktables import (
    GLOBAL_TABLE,
    PD_TABLE,
    instance_table_name,
    rank_tables,
    ranktables_for_rank,
    schema_name,
)
from ascend_runtime.render.schemas import load_schema

STACKS = ("a2-staging", "cm384-prod")


def _entries(table: dict) -> list[tuple[str, dict]]:
    """(server_id, device entry) of every device in any table shape."""
    if "server_list" in table:
        return [(s["server_id"], d) for s in table["server_list"] for d in s["device"]]
    if "server_group_list" in table:
        return [(s["server_id"], d) for g in table["server_group_list"] for s in g["server_list"] for d in s["device"]]
    return [(d["server_id"], d) for key in ("prefill_device_list", "decode_device_list") for d in table[key]]


def _host_of(plan: Plan) -> dict[tuple[str, str], str]:
    """(device_ip) -> host IP of the rank's node, from the Plan."""
    return {(d.device_ip, str(d.device_id)): r.host_ip for r in plan.ranks for d in r.devices}


@pytest.mark.parametrize("stack", STACKS)
def test_every_table_validates_against_its_schema(plans: dict[str, Plan], stack: str) -> None:
    plan = plans[stack]
    tables = rank_tables(plan)
    assert tables, stack
    for name, table in tables.items():
        schema = load_schema(schema_name(plan, name))
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.validate(table, schema, format_checker=jsonschema.FormatChecker())


def test_schema_rejects_a_broken_table(plans: dict[str, Plan]) -> None:
    plan = plans["cm384-prod"]
    table = rank_tables(plan)["hccl-decode-0"]
    del table["server_list"][0]["device"][0]["super_device_id"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(table, load_schema(schema_name(plan, "hccl-decode-0")))


@pytest.mark.parametrize("stack", STACKS)
def test_rank_ids_dense_and_unique_per_table(plans: dict[str, Plan], stack: str) -> None:
    for name, table in rank_tables(plans[stack]).items():
        key = "cluster_id" if name == PD_TABLE else "rank_id"
        ids = [int(d[key]) for _, d in _entries(table)]
        start = 1 if name == PD_TABLE else 0
        assert sorted(ids) == list(range(start, start + len(ids))), name
        assert ids == sorted(ids), f"{name}: ids not in node order"


@pytest.mark.parametrize("stack", STACKS)
def test_device_ips_unique_and_server_id_is_host_ip(plans: dict[str, Plan], stack: str) -> None:
    plan = plans[stack]
    host_of = _host_of(plan)
    for name, table in rank_tables(plan).items():
        entries = _entries(table)
        ips = [d["device_ip"] for _, d in entries]
        assert len(ips) == len(set(ips)), name
        for server_id, dev in entries:
            assert server_id == host_of[(dev["device_ip"], dev["device_id"])], (name, dev)


@pytest.mark.parametrize("stack", STACKS)
def test_every_plan_device_appears_exactly_once(plans: dict[str, Plan], stack: str) -> None:
    plan = plans[stack]
    tables = rank_tables(plan)
    expected = sorted((r.host_ip, str(d.device_id), d.device_ip) for r in plan.ranks for d in r.devices)
    for name in (GLOBAL_TABLE, PD_TABLE):
        if name in tables:
            got = sorted((s, d["device_id"], d["device_ip"]) for s, d in _entries(tables[name]))
            assert got == expected, name
    per_instance = sorted(
        (s, d["device_id"], d["device_ip"])
        for inst in plan.instances
        for s, d in _entries(tables[instance_table_name(inst.name)])
    )
    assert per_instance == expected
    for inst in plan.instances:
        table = tables[instance_table_name(inst.name)]
        assert [int(d["rank_id"]) for _, d in _entries(table)] == list(range(inst.npus))
        assert table["server_count"] == str(len(inst.ranks))


def test_versions_follow_hardware(plans: dict[str, Plan]) -> None:
    a2, a3 = rank_tables(plans["a2-staging"]), rank_tables(plans["cm384-prod"])
    assert a2["hccl-prefill-0"]["version"] == "1.0" and "super_pod_list" not in a2["hccl-prefill-0"]
    assert a3["hccl-prefill-0"]["version"] == "1.2"
    plan = plans["cm384-prod"]
    for inst in plan.instances:
        pods = rank_tables(plan)[instance_table_name(inst.name)]["super_pod_list"]
        listed = [s["server_id"] for p in pods for s in p["server_list"]]
        assert sorted(listed) == sorted(r.host_ip for r in inst.ranks)
        assert [p["super_pod_id"] for p in pods] == [str(inst.super_pod_id)]


def test_pd_table_prefill_first_with_cluster_ids(plans: dict[str, Plan]) -> None:
    """gen_ranktable.py: cluster_id 1..N, prefill devices first; A2 entries carry no super pod keys."""
    plan = plans["a2-staging"]
    pd = rank_tables(plan)[PD_TABLE]
    prefill_npus = sum(i.npus for i in plan.by_role("prefill"))
    assert [int(d["cluster_id"]) for d in pd["prefill_device_list"]] == list(range(1, prefill_npus + 1))
    assert pd["version"] == "1.2" and pd["server_count"] == "6"
    prefill_hosts = {r.host_ip for i in plan.by_role("prefill") for r in i.ranks}
    assert {d["server_id"] for d in pd["prefill_device_list"]} == prefill_hosts
    assert all("super_pod_id" not in d for d in pd["decode_device_list"])


def test_pd_table_only_for_llmdatadist(plans: dict[str, Plan]) -> None:
    assert PD_TABLE in rank_tables(plans["a2-staging"])
    assert PD_TABLE not in rank_tables(plans["cm384-prod"])
    plan = plans["cm384-prod"]
    assert ranktables_for_rank(plan, plan.ranks[0]) == ["hccl-prefill-0"]
    a2 = plans["a2-staging"]
    assert ranktables_for_rank(a2, a2.ranks[-1]) == ["hccl-decode-0", PD_TABLE]


def test_global_table_groups(plans: dict[str, Plan]) -> None:
    plan = plans["cm384-prod"]
    groups = rank_tables(plan)[GLOBAL_TABLE]["server_group_list"]
    assert [g["group_id"] for g in groups] == ["0", "1", "2"]
    assert groups[0]["server_list"][0]["server_id"] == plan.proxy_host
    assert int(groups[1]["server_count"]) == sum(len(i.ranks) for i in plan.by_role("prefill"))
    assert int(groups[2]["server_count"]) == sum(len(i.ranks) for i in plan.by_role("decode"))
