"""Text artifacts from the Jinja2 templates in templates/: entrypoint scripts, hccn.conf, deployment sheet.

Entrypoints: one script per rank (:func:`launch_script`: bare metal, rank Deployments, the leader of a
LeaderWorkerSet) and one script for all headless ranks of a LeaderWorkerSet instance
(:func:`worker_launch_script`), which takes the rank from ``LWS_WORKER_INDEX`` at run time.

Shell templates (``*.sh.j2``, ``*.conf.j2``) are compiled by the strict
environment of :mod:`ascend_runtime.render.shell`: every ``{{ ... }}`` in them
ends with ``| sh`` (one shell word, on one line) or the template does not
compile. The context below therefore carries raw values, never pre-quoted text.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from ascend_runtime.config.inventory import Inventory
from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner.modules import ModuleDegrees, seed_layout_notes
from ascend_runtime.planner.plan import InstancePlan, Plan, RankPlan
from ascend_runtime.render.engine_args import (
    connector,
    engine_command,
    engine_release,
    graph_mode,
    rank_engine_id,
    rank_serving_command,
)
from ascend_runtime.render.environment import (
    hccl_buffsize_mb,
    rank_env,
    secret_env_names,
    startup_budget_s,
)
from ascend_runtime.render.paths import (
    LAUNCH_DIR,
    LEADER_WATCH,
    RANKTABLE_DIR,
    launch_path,
    ranktable_path,
    templates_dir,
)
from ascend_runtime.render.ranktables import PD_TABLE, rank_tables, ranktables_for_rank
from ascend_runtime.render.shell import (
    is_shell_template,
    shell_environment,
    text_environment,
)


@lru_cache(maxsize=8)
def _environment(directory: str, shell: bool) -> jinja2.Environment:
    loader = jinja2.FileSystemLoader(directory)
    return shell_environment(loader) if shell else text_environment(loader)


def render_template_in(directory: str | Path, name: str, /, **context: Any) -> str:
    """Render template ``name`` of ``directory``.

    Shell templates go through the strict environment: an interpolation without
    ``| sh`` raises :class:`jinja2.TemplateAssertionError` when the template is compiled.
    """
    return _environment(str(directory), is_shell_template(name)).get_template(name).render(**context)


def render_template(name: str, /, **context: Any) -> str:
    """Render one template of the templates directory."""
    return render_template_in(templates_dir(), name, **context)


def _startup_timeout_s(plan: Plan) -> int:
    return startup_budget_s(plan)


def image_environment(plan: Plan) -> dict[str, Any]:
    """What the launch scripts do first so the engine sees the image's runtime environment.

    ``{"scripts": [path, ...], "library_path": "dir:dir" | ""}``: the CANN / ATB / BiSheng IR environment
    scripts the release's image ENTRYPOINT sources (a pod ``command:`` replaces that ENTRYPOINT; vLLM-Ascend's
    FAQ answers "Failed to infer device type" / "libatb.so: cannot open" with sourcing them) and the
    directories put in front of LD_LIBRARY_PATH, as vLLM-Ascend v0.23.0's own LeaderWorkerSet entrypoint does
    (tests/e2e/nightly/multi_node/scripts/run.sh: each directory prepended in turn, so the last is first).
    A script missing from the image is skipped at run time; the Plan's variables are exported afterwards
    and always win.
    """
    row = engine_release(plan)
    return {"scripts": list(row.image_env_scripts), "library_path": ":".join(reversed(row.image_library_dirs))}


def leader_watch_script() -> str:
    """The shell library headless ranks source (templates/leader-watch.sh, shipped as is)."""
    return (templates_dir() / LEADER_WATCH).read_text()


def launch_script(plan: Plan, rank: RankPlan) -> str:
    """The entrypoint script of one rank (bash; passes ``bash -n`` and shellcheck)."""
    inst = plan.instance(rank.instance)
    required = [ranktable_path(name) for name in ranktables_for_rank(plan, rank)]
    return render_template(
        "entrypoint.sh.j2",
        worker=False,
        stack=plan.stack,
        rank_name=rank.name,
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
        dp_rpc_port=inst.dp_rpc_port,
        dp_start=rank.dp_start_rank,
        dp_end=rank.dp_start_rank + rank.dp_local - 1,
        dp_local=rank.dp_local,
        startup_timeout_s=_startup_timeout_s(plan),
        image_env=image_environment(plan),
        env=list(rank_env(plan, rank).items()),
        secret_env=secret_env_names(plan),
        required_files=required,
        argv=rank_serving_words(plan, inst, [rank]) if serves_ranks(inst) else [[(TEXT, arg)] for arg in engine_command(plan, rank)],
        **_rank_serving_context(inst, rank),
    )


#: Kinds of the pieces a launch script's argv words are made of (``(kind, text)``): literal text, or a
#: shell variable the worker script sets at run time (``"$worker_index"``, ``"$DP_START_RANK"``), or, under
#: ``serving: rank``, one a node's script sets for each DP rank it starts (``"$dp_rank"``, ``"$api_port"``).
TEXT, WORKER_INDEX, DP_START_RANK, DP_RANK, API_PORT = "text", "worker_index", "dp_start_rank", "dp_rank", "api_port"


def serves_ranks(inst: InstancePlan) -> bool:
    """True when every DP rank of the instance runs its own API server (``serving: rank``, docs/rank-serving.md)."""
    return inst.serving == "rank"


def rank_devices(inst: InstancePlan, rank: RankPlan, local_rank: int) -> tuple[int, ...]:
    """The devices of one DP rank of a node group: its TP's slice of the group's devices, in order (the
    ``ASCEND_RT_VISIBLE_DEVICES`` of its server, as examples/external_online_dp/launch_online_dp.py of
    vLLM-Ascend v0.23.0 gives each rank ``i * tp .. (i + 1) * tp - 1``)."""
    return rank.device_ids[local_rank * inst.tp:(local_rank + 1) * inst.tp]


def rank_servers(plan: Plan, rank: RankPlan) -> list[tuple[int, int, tuple[int, ...], list[str]]]:
    """(DP rank, API port, devices, argv) of every server a node group runs under ``serving: rank``."""
    inst = plan.instance(rank.instance)
    return [(dp_rank, port, rank_devices(inst, rank, j), rank_serving_command(plan, rank, dp_rank, port))
            for j, (dp_rank, port) in enumerate(zip(rank.dp_ranks, rank.api_ports, strict=True))]


def expand_rank_word(word: list[tuple[str, str]], dp_rank: int, api_port: int) -> str:
    """An argv word of a ``serving: rank`` script as the script expands it for one DP rank."""
    values = {DP_RANK: str(dp_rank), API_PORT: str(api_port)}
    return "".join(values.get(kind, text) for kind, text in word)


def rank_serving_words(plan: Plan, inst: InstancePlan, ranks: list[RankPlan]) -> list[list[tuple[str, str]]]:
    """The per-DP-rank ``vllm serve`` argv of ``serving: rank`` with the words that differ between ranks taken
    from the script's ``$dp_rank`` and ``$api_port``: the values of ``--data-parallel-rank`` and ``--port`` and
    the rank in the engine_id inside ``--kv-transfer-config`` (:func:`rank_engine_id`). Checked against
    :func:`rank_serving_command` of every DP rank of ``ranks``; any other difference raises
    :class:`WorkerTemplateError`."""
    first = ranks[0]
    dp0, port0 = first.dp_ranks[0], first.api_ports[0]
    engine_id = json.dumps(rank_engine_id(plan, inst.name, dp0))
    id_prefix = engine_id[: -len(str(dp0)) - 1]
    words = _templated(rank_serving_command(plan, first, dp0, port0),
                       {"--data-parallel-rank": DP_RANK, "--port": API_PORT}, engine_id, id_prefix, DP_RANK)
    for rank in ranks:
        for dp_rank, port, _, expected in rank_servers(plan, rank):
            if [expand_rank_word(w, dp_rank, port) for w in words] != expected:
                raise WorkerTemplateError(f"{rank.name}: DP rank {dp_rank}'s argv is not its script's")
    return words


def _rank_serving_context(inst: InstancePlan, rank: RankPlan) -> dict[str, Any]:
    """Template values of ``serving: rank`` (``serving_ranks`` false and nothing else under ``serving: instance``)."""
    if not serves_ranks(inst):
        return {"serving_ranks": False}
    return {"serving_ranks": True, "api_ports": list(rank.api_ports)}
#: Container variable naming the node a worker pod runs on (the Pulumi program sets it from
#: ``spec.nodeName``); the worker script looks the node's Plan values up with it.
WORKER_NODE_ENV = "ASCEND_DEPLOY_NODE"


class WorkerTemplateError(ValueError):
    """The headless ranks of an instance cannot share one worker script (a planner/renderer invariant broke)."""


def worker_script_name(inst: InstancePlan) -> str:
    """File name of an instance's worker script (``<instance>-worker.sh``)."""
    return f"{inst.name}-worker.sh"


def _expand(word: list[tuple[str, str]], index: int, dp_local: int) -> str:
    """An argv word as the worker script expands it for worker ``index``."""
    values = {WORKER_INDEX: str(index), DP_START_RANK: str(index * dp_local)}
    return "".join(values.get(kind, text) for kind, text in word)


def _templated(argv: list[str], values: dict[str, str], engine_id: str, id_prefix: str,
               id_kind: str) -> list[list[tuple[str, str]]]:
    """``argv`` as words of pieces: the value of each option of ``values`` becomes that kind's variable, and
    the engine_id (``engine_id`` as JSON spells it) inside ``--kv-transfer-config`` becomes ``id_prefix`` then
    ``id_kind``'s variable."""
    words: list[list[tuple[str, str]]] = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] in values:
            words.append([(values[argv[i - 1]], "")])
        elif engine_id in arg and arg.count(engine_id) == 1:
            before, after = arg.split(engine_id)
            words.append([(TEXT, before + id_prefix), (id_kind, ""), (TEXT, '"' + after)])
        else:
            words.append([(TEXT, arg)])
    return words


def worker_argv(plan: Plan, inst: InstancePlan) -> list[list[tuple[str, str]]]:
    """The headless ranks' ``vllm serve`` argv with the per-rank words taken from the worker index.

    Two words differ between headless ranks: the value of ``--data-parallel-start-rank``
    (``index x dp_local``) and the ``engine_id`` inside ``--kv-transfer-config`` (the Plan's
    ``<stack>-<instance>-<index>``). The result is checked against :func:`engine_command` of every
    headless rank; any other difference raises :class:`WorkerTemplateError`.
    """
    workers = inst.ranks[1:]
    if not workers:
        raise WorkerTemplateError(f"{inst.name}: a single-rank instance has no worker ranks")
    first = workers[0]
    suffix = str(first.index)
    if not first.engine_id.endswith(suffix):
        raise WorkerTemplateError(f"{inst.name}: engine_id {first.engine_id!r} does not end in its rank index")
    engine_id = json.dumps(first.engine_id)  # how _json spells it inside --kv-transfer-config
    id_prefix = engine_id[: -len(suffix) - 1]  # up to the index: '"<stack>-<instance>-'
    words = _templated(engine_command(plan, first), {"--data-parallel-start-rank": DP_START_RANK},
                       engine_id, id_prefix, WORKER_INDEX)
    for rank in workers:
        got = [_expand(w, rank.index, rank.dp_local) for w in words]
        if got != engine_command(plan, rank):
            raise WorkerTemplateError(f"{rank.name}: its argv is not the worker script's for index {rank.index}")
    return words


def worker_env(plan: Plan, inst: InstancePlan) -> tuple[list[tuple[str, str]], list[tuple[str, list[tuple[str, str]]]]]:
    """(variables equal on every headless rank, [(node, its own variables)]) of an instance.

    What differs between the headless ranks' environments is what the Plan knows per node: HCCL_IF_IP,
    the socket interfaces (the node's NIC) and ASCEND_RT_VISIBLE_DEVICES.
    """
    envs = [rank_env(plan, r) for r in inst.ranks[1:]]
    keys = set(envs[0])
    if any(set(e) != keys for e in envs):
        raise WorkerTemplateError(f"{inst.name}: the headless ranks set different variables")
    common = sorted(k for k in keys if all(e[k] == envs[0][k] for e in envs))
    per_node = sorted(keys - set(common))
    return ([(k, envs[0][k]) for k in common],
            [(r.node, [(k, e[k]) for k in per_node]) for r, e in zip(inst.ranks[1:], envs)])


def worker_launch_script(plan: Plan, inst: InstancePlan) -> str:
    """The one entrypoint of every headless rank of a multi-node instance under a LeaderWorkerSet (bash).

    The rank comes from ``$LWS_WORKER_INDEX`` at run time (``--data-parallel-start-rank`` = index x
    dp_local, the engine_id's index), the node's HCCL_IF_IP, NIC and devices from ``$ASCEND_DEPLOY_NODE``
    looked up in the Plan. Raises :class:`WorkerTemplateError` when the headless ranks differ in
    anything else (rank tables to read, variables), which the Pulumi program then deploys per rank.
    """
    workers = inst.ranks[1:]
    tables = {tuple(ranktables_for_rank(plan, r)) for r in workers}
    if len(tables) != 1 or len({r.dp_local for r in workers}) != 1:
        raise WorkerTemplateError(f"{inst.name}: the headless ranks read different files or drive different NPU counts")
    if serves_ranks(inst) and len({r.api_ports for r in workers}) != 1:
        raise WorkerTemplateError(f"{inst.name}: the worker nodes' DP ranks serve on different ports")
    common, per_node = worker_env(plan, inst)
    return render_template(
        "entrypoint.sh.j2",
        worker=True,
        stack=plan.stack,
        script_name=worker_script_name(inst),
        instance=inst.name,
        role=inst.role,
        dp=inst.dp,
        tp=inst.tp,
        ep=inst.ep,
        rank_count=len(inst.ranks),
        last_index=len(inst.ranks) - 1,
        dp_local=workers[0].dp_local,
        leader_host=inst.api_host,
        dp_rpc_port=inst.dp_rpc_port,
        startup_timeout_s=_startup_timeout_s(plan),
        image_env=image_environment(plan),
        env=common,
        node_env=per_node,
        secret_env=secret_env_names(plan),
        required_files=[ranktable_path(name) for name in next(iter(tables))],
        argv=rank_serving_words(plan, inst, list(workers)) if serves_ranks(inst) else worker_argv(plan, inst),
        **_rank_serving_context(inst, workers[0]),
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


def file_readers(plan: Plan) -> list[dict[str, str]]:
    """Every rendered file kind and the process that reads it (DEPLOYMENT.md's file table)."""
    engine_reads = set(ranktables_for_rank(plan, plan.ranks[0])) if plan.ranks else set()
    rows = [
        {"path": "plan.json", "reader": "people and review tools (the validated Plan); `ascend-deploy check smoke --endpoint URL --stack NAME --rendered DIR` cross-checks the files against the stack"},
        {"path": "launch/<rank>.sh", "reader": "the engine container's entrypoint (bash), one per rank"},
        {"path": "hccn/<node>.conf", "reader": "the NPU driver's hccn_tool on the host (/etc/hccn.conf; the npu-network playbook applies it)"},
        {"path": "manifests/", "reader": "kubectl / GitOps (exactly what `pulumi up` registers)"},
    ]
    for name in rank_tables(plan):
        if name in engine_reads:
            reader = f"the {connector(plan).kv_connector} connector of every engine rank (DISAGGREGATED_PREFILL_RANK_TABLE_PATH)"
        elif name == PD_TABLE:
            reader = "nothing in this release (kept for reference)"
        else:
            reader = (f"MindCluster / MindIE tooling (HCCL rank table); vLLM-Ascend {plan.vllm_ascend_version} "
                      "reads none, so engine pods do not mount it")
        rows.append({"path": f"ranktables/{name}.json", "reader": reader})
    return rows


def deployment_sheet(plan: Plan) -> str:
    """The one-page markdown sheet for operators."""
    instances = []
    for inst in plan.instances:
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
                "kv_ports": inst.kv_ports,
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
            "mode": (f"API per DP rank: ports {', '.join(map(str, r.api_ports))}" if r.api_ports
                     else "leader (API)" if r.is_leader else "headless"),
            "script": f"launch/{r.name}.sh",
            "tables": ", ".join(f"`{t}`" for t in ranktables_for_rank(plan, r)),
        }
        for r in plan.ranks
    ]
    return render_template(
        "DEPLOYMENT.md.j2",
        files=file_readers(plan),
        plan=plan,
        hardware=hardware_spec(plan.hardware),
        connector=connector(plan),
        pd_table_path=ranktable_path(PD_TABLE),
        instances=instances,
        ranks=ranks,
        ranktable_dir=RANKTABLE_DIR,
        launch_dir=LAUNCH_DIR,
        modules=[(role, ModuleDegrees.from_json(plan.config[role].get("modules")).describe()) for role in ("prefill", "decode")
                 if not ModuleDegrees.from_json(plan.config[role].get("modules")).uniform],
        seed_notes=seed_layout_notes(plan.config, plan.hardware),
    )
