"""Rank tables: schemas and the invariants HCCL and vLLM-Ascend rely on.

Device addresses (facts section 3): hccl.json (v1.0 / v1.2) and the global table
carry the RoCE port IP (``device_ip``, ``hccn_tool -ip -g``) on A2 and A3; the
LLMDataDist PD table carries the VNIC IP (``vnic_ip``, ``-vnic -g``) on A3 and
the RoCE port IP on A2, as vllm-ascend v0.11.0
examples/disaggregated_prefill_v1/gen_ranktable.py does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from ascend_runtime.config.errors import ConfigError
from ascend_runtime.planner import Plan, load_plan
from ascend_runtime.render.ranktables import (
    GLOBAL_TABLE,
    PD_TABLE,
    instance_table_name,
    pd_device_ip,
    rank_tables,
    ranktables_for_rank,
    schema_name,
)
from ascend_runtime.render.schemas import load_schema
from tests.conftest import NS
from tests.conftest import STACKS as STACKS_DIR

STACKS = ("a2-staging", "cm384-prod")


def _entries(table: dict) -> list[tuple[str, dict]]:
    """(server_id, device entry) of every device in any table shape."""
    if "server_list" in table:
        return [(s["server_id"], d) for s in table["server_list"] for d in s["device"]]
    if "server_group_list" in table:
        return [(s["server_id"], d) for g in table["server_group_list"] for s in g["server_list"] for d in s["device"]]
    return [(d["server_id"], d) for key in ("prefill_device_list", "decode_device_list") for d in table[key]]


def _host_of(plan: Plan) -> dict[tuple[str, str], str]:
    """(device_ip or A3 vnic_ip, device_id) -> host IP of the rank's node, from the Plan."""
    out = {(d.device_ip, str(d.device_id)): r.host_ip for r in plan.ranks for d in r.devices}
    out.update({(d.vnic_ip, str(d.device_id)): r.host_ip for r in plan.ranks for d in r.devices if d.vnic_ip})
    return out


def _stack_copy(tmp: Path, name: str, edit_config=None, edit_inventory=None) -> Path:
    """A copy of the committed stacks with one stack's config and/or inventory edited."""
    target = tmp / "stacks"
    shutil.copytree(STACKS_DIR, target, dirs_exist_ok=True)
    stack_file = target / f"Pulumi.{name}.yaml"
    doc = yaml.safe_load(stack_file.read_text())
    if edit_config:
        cfg = {k[len(NS):]: v for k, v in doc["config"].items() if k.startswith(NS)}
        edit_config(cfg)
        others = {k: v for k, v in doc["config"].items() if not k.startswith(NS)}
        doc["config"] = {**others, **{NS + k: v for k, v in cfg.items()}}
        stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    if edit_inventory:
        inv_file = target / doc["config"][NS + "inventory"]
        inv = yaml.safe_load(inv_file.read_text())
        edit_inventory(inv)
        inv_file.write_text(yaml.safe_dump(inv, sort_keys=False))
    return target


_CORE_STAGE_KEYS = ("instances", "nodes_per_instance", "dp", "tp", "ep", "max_num_seqs", "max_num_batched_tokens",
                    "redundant_experts", "mtp", "context_len", "gpu_memory_utilization")


def _llmdatadist(cfg: dict) -> None:
    """vLLM-Ascend 0.11.0 with the LLMDataDist connector (gen_ranktable.py's release); stage shapes kept,
    release-specific stage options dropped."""
    cfg["engine"] = {"vllm_ascend_version": "0.11.0", "kv_connector": "llmdatadist"}
    for role in ("prefill", "decode"):
        cfg[role] = {k: v for k, v in cfg[role].items() if k in _CORE_STAGE_KEYS}


@pytest.fixture(scope="module")
def a3_llmdatadist(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """cm384-prod with the LLMDataDist connector: an A3 plan that renders the PD table."""
    return load_plan("cm384-prod", _stack_copy(tmp_path_factory.mktemp("a3pd"), "cm384-prod", _llmdatadist))


@pytest.fixture(scope="module")
def a2_llmdatadist(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """a2-staging with the LLMDataDist connector."""
    return load_plan("a2-staging", _stack_copy(tmp_path_factory.mktemp("a2pd"), "a2-staging", _llmdatadist))


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


def test_pd_table_prefill_first_with_cluster_ids(a2_llmdatadist: Plan) -> None:
    """gen_ranktable.py: cluster_id 1..N, prefill devices first; A2 entries carry no super pod keys."""
    plan = a2_llmdatadist
    pd = rank_tables(plan)[PD_TABLE]
    prefill_npus = sum(i.npus for i in plan.by_role("prefill"))
    assert [int(d["cluster_id"]) for d in pd["prefill_device_list"]] == list(range(1, prefill_npus + 1))
    assert pd["version"] == "1.2" and pd["server_count"] == "6"
    prefill_hosts = {r.host_ip for i in plan.by_role("prefill") for r in i.ranks}
    assert {d["server_id"] for d in pd["prefill_device_list"]} == prefill_hosts
    assert all("super_pod_id" not in d for d in pd["decode_device_list"])


def test_pd_table_only_for_llmdatadist(plans: dict[str, Plan], a2_llmdatadist: Plan) -> None:
    assert PD_TABLE in rank_tables(a2_llmdatadist)
    assert PD_TABLE not in rank_tables(plans["cm384-prod"])
    plan = plans["cm384-prod"]
    assert ranktables_for_rank(plan, plan.ranks[0]) == []  # Mooncake engines read no rank table
    a2 = a2_llmdatadist
    assert ranktables_for_rank(a2, a2.ranks[-1]) == [PD_TABLE]  # LLMDataDist reads only the PD table


def test_global_table_groups(plans: dict[str, Plan]) -> None:
    plan = plans["cm384-prod"]
    groups = rank_tables(plan)[GLOBAL_TABLE]["server_group_list"]
    assert [g["group_id"] for g in groups] == ["0", "1", "2"]
    assert groups[0]["server_list"][0]["server_id"] == plan.proxy_host
    assert int(groups[1]["server_count"]) == sum(len(i.ranks) for i in plan.by_role("prefill"))
    assert int(groups[2]["server_count"]) == sum(len(i.ranks) for i in plan.by_role("decode"))


def _ips(table: dict) -> set[str]:
    return {d["device_ip"] for _, d in _entries(table)}


def test_plan_devices_carry_both_addresses(plans: dict[str, Plan]) -> None:
    a3 = [d for r in plans["cm384-prod"].ranks for d in r.devices]
    assert a3 and all(d.vnic_ip and d.vnic_ip != d.device_ip for d in a3)
    assert all(d.vnic_ip is None for r in plans["a2-staging"].ranks for d in r.devices)
    dev = plans["cm384-prod"].to_dict()["instances"][0]["ranks"][0]["devices"][0]
    assert dev["device_ip"] == "198.51.100.1" and dev["vnic_ip"] == "198.18.0.1"


def test_a3_pd_table_lists_vnic_ips_hccl_tables_roce_ips(a3_llmdatadist: Plan) -> None:
    """gen_ranktable.py (v0.11.0, lines 82-95) reads `-vnic -g` on A3; HCCL's tables keep the RoCE port IP."""
    plan = a3_llmdatadist
    tables = rank_tables(plan)
    roce = {d.device_ip for r in plan.ranks for d in r.devices}
    vnic = {d.vnic_ip for r in plan.ranks for d in r.devices}
    assert len(vnic) == len(roce) == 384 and not roce & vnic
    pd = tables[PD_TABLE]
    assert _ips(pd) == vnic
    by_key = {(r.host_ip, str(d.device_id)): d for r in plan.ranks for d in r.devices}
    for server_id, entry in _entries(pd):
        dev = by_key[(server_id, entry["device_id"])]
        assert entry["device_ip"] == dev.vnic_ip == pd_device_ip(plan, dev)
        assert entry["super_device_id"] == str(dev.super_device_id) and entry["super_pod_id"] == str(dev.super_pod_id)
    for name, table in tables.items():
        if name != PD_TABLE:
            assert _ips(table) <= roce and not _ips(table) & vnic, name
        jsonschema.validate(table, load_schema(schema_name(plan, name)), format_checker=jsonschema.FormatChecker())
    assert _ips(tables[GLOBAL_TABLE]) == roce


def test_a2_pd_table_lists_roce_ips(a2_llmdatadist: Plan) -> None:
    plan = a2_llmdatadist
    roce = {d.device_ip for r in plan.ranks for d in r.devices}
    assert _ips(rank_tables(plan)[PD_TABLE]) == roce


def test_a3_pd_table_without_vnic_ip_is_refused(tmp_path: Path) -> None:
    def drop_vnic(inv: dict) -> None:
        del inv["nodes"][3]["devices"][2]["vnic_ip"]
        del inv["nodes"][3]["devices"][7]["vnic_ip"]

    stacks = _stack_copy(tmp_path, "cm384-prod", _llmdatadist, drop_vnic)
    with pytest.raises(ConfigError) as err:
        load_plan("cm384-prod", stacks)
    (problem,) = err.value.problems
    assert problem.path == "inventory.nodes[3].devices[2].vnic_ip"
    assert "devices 2, 7" in problem.message and "VNIC" in problem.message
    # Mooncake renders no PD table: the same inventory plans fine
    plan = load_plan("cm384-prod", _stack_copy(tmp_path / "mc", "cm384-prod", edit_inventory=drop_vnic))
    assert PD_TABLE not in rank_tables(plan)


def test_vnic_ip_on_a2_is_refused(tmp_path: Path) -> None:
    def add_vnic(inv: dict) -> None:
        inv["nodes"][4]["devices"][6]["vnic_ip"] = "203.0.113.66"

    with pytest.raises(ConfigError) as err:
        load_plan("a2-staging", _stack_copy(tmp_path, "a2-staging", edit_inventory=add_vnic))
    (problem,) = err.value.problems
    assert problem.path == "inventory.nodes[4].devices[6].vnic_ip" and "A3" in problem.message
