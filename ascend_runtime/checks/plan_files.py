"""Smoke items proving the rank tables and launch files agree with the Plan.

Without a directory the items render the Plan's tables and scripts and check
them against the Plan itself: each table valid against its shipped JSON
Schema, every Plan device exactly once with dense rank ids, every
``server_id`` the host IP of that rank's node, every launch script exporting
its node's ``HCCL_IF_IP`` and its devices in ``ASCEND_RT_VISIBLE_DEVICES``.
With ``rendered_dir`` (the output of ``ascend-deploy render``, or the
ConfigMaps mounted in a pod) the deployed files must equal what the Plan
renders now: a drifted table or script fails the item, naming the file.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema

from ascend_runtime.checks.items import CheckFailed, CheckItem, SmokeContext
from ascend_runtime.files.read import RENDER_OUTPUT, FileRefused, read_text
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.artifacts import render_artifacts
from ascend_runtime.render.launch import launch_script
from ascend_runtime.render.ranktables import (
    PD_TABLE,
    pd_device_ip,
    rank_tables,
    schema_name,
)
from ascend_runtime.render.schemas import load_schema


def _device_entries(table: dict) -> list[dict]:
    """Every device entry of a rank table, whatever its layout."""
    if "server_list" in table:
        return [dict(d, server_id=s["server_id"]) for s in table["server_list"] for d in s["device"]]
    if "prefill_device_list" in table:
        return table["prefill_device_list"] + table["decode_device_list"]
    return [dict(d, server_id=s["server_id"]) for g in table["server_group_list"] for s in g["server_list"] for d in s.get("device", [])]


def check_tables_against_plan(plan: Plan) -> str:
    """Schema and invariants of every rendered table; raises CheckFailed naming the table."""
    tables = rank_tables(plan)
    roce_ip = {(r.node, d.device_ip): r.host_ip for r in plan.ranks for d in r.devices}
    for name, table in tables.items():
        # the PD table lists the address LLMDataDist uses (VNIC on A3), the HCCL tables the RoCE port IP
        node_ip = ({(r.node, pd_device_ip(plan, d)): r.host_ip for r in plan.ranks for d in r.devices}
                   if name == PD_TABLE else roce_ip)
        plan_ips = {ip for _, ip in node_ip}
        try:
            jsonschema.validate(table, load_schema(schema_name(plan, name)))
        except jsonschema.ValidationError as exc:
            raise CheckFailed(f"ranktables/{name}.json violates its schema: {exc.message}") from None
        entries = _device_entries(table)
        ips = [e["device_ip"] for e in entries]
        if len(ips) != len(set(ips)) or not set(ips) <= plan_ips:
            raise CheckFailed(f"ranktables/{name}.json: device IPs duplicated or not in the Plan")
        by_ip = {ip: host for (_, ip), host in node_ip.items()}
        wrong = [e["device_ip"] for e in entries if by_ip[e["device_ip"]] != e["server_id"]]
        if wrong:
            raise CheckFailed(f"ranktables/{name}.json: server_id is not the rank's host IP for devices {wrong[:4]}")
        rank_ids = [int(e["rank_id"]) for e in entries if "rank_id" in e]
        if rank_ids and sorted(rank_ids) != list(range(len(rank_ids))):
            raise CheckFailed(f"ranktables/{name}.json: rank ids are not dense from 0")
    return f"{len(tables)} tables valid, {len(roce_ip)} devices as planned"


def check_scripts_against_plan(plan: Plan) -> str:
    """Every rank's script exports its node IP and devices; raises CheckFailed naming the rank."""
    for rank in plan.ranks:
        script = launch_script(plan, rank)
        devices = ",".join(str(d) for d in rank.device_ids)
        for needle in (rank.host_ip, devices):
            if needle not in script:
                raise CheckFailed(f"launch/{rank.name}.sh lacks {needle!r} from the Plan")
    return f"{len(plan.ranks)} launch scripts carry their node IP and devices"


def _text(path: Path) -> str | None:
    """The text of a rendered file (through the kit's reading door), None when it is no regular UTF-8 file of at
    most 64 MiB: such a file differs from what the Plan renders."""
    try:
        return read_text(path, RENDER_OUTPUT)
    except FileRefused:
        return None


def _compare(expected: dict[str, str], rendered_dir: Path, what: str) -> str:
    """Files under ``rendered_dir`` must equal ``expected`` ({relative path: text}); raises CheckFailed naming them."""
    missing = [rel for rel in expected if not (rendered_dir / rel).exists()]
    differing = [rel for rel, text in expected.items() if rel not in missing and _text(rendered_dir / rel) != text]
    if missing or differing:
        raise CheckFailed(f"{what} not as the Plan renders them: missing {missing or 'none'}, differing {differing or 'none'}")
    return f"{len(expected)} {what} equal the Plan's"


def rendered_files(plan: Plan, prefix: str) -> dict[str, str]:
    """Files `render` writes under ``prefix`` (``ranktables/`` or ``launch/``)."""
    return {rel: text for rel, text in render_artifacts(plan).items() if rel.startswith(prefix)}


def plan_file_items(plan: Plan, rendered_dir: Path | None = None) -> list[CheckItem]:
    """Two items: rank tables, launch files."""
    if rendered_dir is not None:

        async def tables(ctx: SmokeContext) -> str:
            return _compare(rendered_files(plan, "ranktables/"), rendered_dir, "rank tables")

        async def scripts(ctx: SmokeContext) -> str:
            return _compare(rendered_files(plan, "launch/"), rendered_dir, "launch scripts")

        where = f" in {rendered_dir}"
    else:

        async def tables(ctx: SmokeContext) -> str:
            return check_tables_against_plan(plan)

        async def scripts(ctx: SmokeContext) -> str:
            return check_scripts_against_plan(plan)

        where = ""
    return [CheckItem(f"rank tables consistent with the Plan{where}", tables),
            CheckItem(f"launch files consistent with the Plan{where}", scripts)]
