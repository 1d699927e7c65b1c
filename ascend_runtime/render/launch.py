"""Text artifacts from the Jinja2 templates in templates/: entrypoint scripts, hccn.conf, deployment sheet.

Every value interpolated into a shell script is quoted with :func:`shlex.quote`
here, so templates never build shell syntax from data.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from ascend_runtime.config.inventory import Inventory
from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner.plan import Plan, RankPlan
from ascend_runtime.render.engine_args import connector, engine_command, graph_mode
from ascend_runtime.render.environment import hccl_buffsize_mb, rank_env
from ascend_runtime.render.paths import (
    LAUNCH_DIR,
    LEADER_WATCH,
    RANKTABLE_DIR,
    launch_path,
    ranktable_path,
    templates_dir,
)
from ascend_runtime.render.ranktables import PD_TABLE, ranktables_for_rank

DEFAULT_STARTUP_TIMEOUT_S = 3600


@lru_cache(maxsize=4)
def _environment(directory: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        autoescape=False,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def render_template(name: str, **context: Any) -> str:
    """Render one template of the templates directory."""
    return _environment(str(templates_dir())).get_template(name).render(**context)


def _startup_timeout_s(plan: Plan) -> int:
    kube = plan.config.get("kubernetes") or {}
    return int(kube.get("startup_probe_seconds") or DEFAULT_STARTUP_TIMEOUT_S)


def leader_watch_script() -> str:
    """The shell library headless ranks source (templates/leader-watch.sh, shipped as is)."""
    return (templates_dir() / LEADER_WATCH).read_text()


def launch_script(plan: Plan, rank: RankPlan) -> str:
    """The entrypoint script of one rank (bash; passes ``bash -n`` and shellcheck)."""
    inst = plan.instance(rank.instance)
    required = [ranktable_path(name) for name in ranktables_for_rank(plan, rank)]
    return render_template(
        "entrypoint.sh.j2",
        stack=plan.stack,
        rank_name=rank.name,
        rank_name_q=shlex.quote(rank.name),
        script_name=Path(launch_path(rank.name)).name,
        instance=inst.name,
        role=inst.role,
        dp=inst.dp,
        tp=inst.tp,
        ep=inst.ep,
        index=rank.index,
        rank_count=len(inst.ranks),
        node=rank.node,
        host_ip=rank.host_ip,
        devices=",".join(str(d) for d in rank.device_ids),
        leader=rank.is_leader,
        api_port=inst.api_port,
        leader_host=inst.api_host,
        leader_host_q=shlex.quote(inst.api_host),
        dp_start=rank.dp_start_rank,
        dp_end=rank.dp_start_rank + rank.dp_local - 1,
        startup_timeout_s=_startup_timeout_s(plan),
        env=[(key, shlex.quote(value)) for key, value in rank_env(plan, rank).items()],
        required_files=[shlex.quote(p) for p in required],
        argv=[shlex.quote(arg) for arg in engine_command(plan, rank)],
    )


def _node_devices(plan: Plan, node_name: str, inventory: Inventory | None) -> list[dict[str, Any]]:
    if inventory is not None:
        for node in inventory.nodes:
            if node.name == node_name:
                return [
                    {
                        "device_id": d.device_id,
                        "device_ip": str(d.device_ip),
                        "netmask": str(d.netmask) if d.netmask else None,
                        "netdetect": str(d.netdetect) if d.netdetect else None,
                        "gateway": str(d.gateway) if d.gateway else None,
                    }
                    for d in sorted(node.devices, key=lambda d: d.device_id)
                ]
    devices = {
        d.device_id: {"device_id": d.device_id, "device_ip": d.device_ip, "netmask": None, "netdetect": None, "gateway": None}
        for r in plan.ranks
        if r.node == node_name
        for d in r.devices
    }
    return [devices[k] for k in sorted(devices)]


def hccn_conf(plan: Plan, node_name: str, inventory: Inventory | None = None) -> str:
    """``/etc/hccn.conf`` of a node: every device of the inventory (or, without one, the Plan's devices)."""
    node = next((n for n in plan.nodes if n.name == node_name), None)
    if node is None:
        raise KeyError(node_name)
    return render_template(
        "hccn.conf.j2",
        stack=plan.stack,
        node=node.name,
        host_ip=node.host_ip,
        devices=_node_devices(plan, node_name, inventory),
    )


def deployment_sheet(plan: Plan) -> str:
    """The one-page markdown sheet for operators."""
    instances = []
    for inst in plan.instances:
        first = inst.ranks[0]
        instances.append(
            {
                "name": inst.name,
                "role": inst.role,
                "dp": inst.dp,
                "tp": inst.tp,
                "ep": inst.ep,
                "npus": inst.npus,
                "nodes": ", ".join(inst.nodes),
                "api": f"{inst.api_host}:{inst.api_port}",
                "dp_rpc_port": inst.dp_rpc_port,
                "kv_ports": f"{first.kv_port}-{first.kv_port + first.kv_port_count - 1}",
                "buffsize": hccl_buffsize_mb(plan, inst.role),
                "graph": "on" if graph_mode(plan, inst.role) else "off (eager)",
                "memory": f"{inst.memory.total_gib} / {inst.memory.budget_gib}",
            }
        )
    ranks = [
        {
            "name": r.name,
            "node": r.node,
            "devices": ",".join(str(d) for d in r.device_ids),
            "dp_ranks": f"{r.dp_start_rank}..{r.dp_start_rank + r.dp_local - 1}",
            "mode": "leader (API)" if r.is_leader else "headless",
            "script": f"launch/{r.name}.sh",
            "tables": ", ".join(f"`{t}`" for t in ranktables_for_rank(plan, r)),
        }
        for r in plan.ranks
    ]
    return render_template(
        "DEPLOYMENT.md.j2",
        plan=plan,
        hardware=hardware_spec(plan.hardware),
        connector=connector(plan),
        pd_table_path=ranktable_path(PD_TABLE),
        instances=instances,
        ranks=ranks,
        ranktable_dir=RANKTABLE_DIR,
        launch_dir=LAUNCH_DIR,
    )
