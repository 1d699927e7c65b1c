"""End to end on the local stack: a shift to long prompts makes the planner move a group decode -> prefill.

A copy of the stacks on free ports whose ``local`` stack has one fixed prefill and one fixed decode
instance and one flexible group (``pd_ratio: auto``, starting as decode-1; its prefill shape is
prefill-1 and prefill-2). Its TTFT SLO is set from the performance model so that short prompts fit
one prefill instance with room and 3000-token prompts at the test's rate do not. The load generator
keeps streaming through the whole change; every request must succeed, and afterwards the proxy
routes prefill requests to the group's new instances.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import aiohttp
import pytest
import yaml

from ascend_runtime.checks.loadgen import fetch_model, run_batch
from ascend_runtime.checks.prompts import random_prompt, request_body
from ascend_runtime.local.lifecycle import read_tokens
from ascend_runtime.local.state import StackState
from ascend_runtime.local.topology import PROXY_TOKEN_ENV
from ascend_runtime.pdplanner.actuate_local import LocalBackend, LocalMover
from ascend_runtime.pdplanner.daemon import DaemonConfig, PDPlanner
from ascend_runtime.pdplanner.from_plan import group_pool_from_plan, planner_config_from_plan, pool_from_plan, slo_from_plan
from ascend_runtime.planner import load_plan
from tests.local.conftest import NAMESPACE, bindable, cli, free_port_stacks, kill_recorded

pytestmark = pytest.mark.slow

CHAT = (64, 24)  # prompt words, output tokens
SUMMARY = (3000, 8)
RATE = 5.0  # requests/s in both phases


def auto_stack(tmp_path: Path) -> Path:
    """The free-port copy with decode-1's nodes as a flexible group and a tight TTFT SLO."""
    stacks = free_port_stacks(tmp_path)
    f = stacks / "Pulumi.local.yaml"
    doc = yaml.safe_load(f.read_text())
    cfg = doc["config"]
    cfg[NAMESPACE + "decode"]["instances"] = 1
    cfg[NAMESPACE + "pd_ratio"] = {"mode": "auto", "groups": 1, "interval_s": 1.0, "k_intervals": 2,
                                   "max_changes_per_hour": 10, "drain_timeout_s": 60.0, "ready_timeout_s": 60.0}
    cfg[NAMESPACE + "slo"] = {"ttft_ms": 350, "tpot_ms": 150}
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    plan = load_plan("local", stacks)
    addresses = [(i.api_host, p) for i in plan.all_instances for p in (i.api_port, i.ranks[0].kv_port)]
    if not all(bindable(h, p) for h, p in addresses + [(plan.proxy_host, plan.proxy_port)]):
        pytest.skip("the flexible instances' ports are taken")
    return stacks


def test_the_model_sees_the_phase_change(tmp_path: Path) -> None:
    """The premise, from the model alone: chat fits the starting split, the summaries need the group."""
    from ascend_runtime.pdplanner.decide import Load, headroom, requirement

    plan = load_plan("local", auto_stack(tmp_path))
    pool, slo, cfg = group_pool_from_plan(plan), slo_from_plan(plan), planner_config_from_plan(plan)
    chat = requirement(Load(RATE, *CHAT), pool.as_pool(), slo, cfg)
    summary = requirement(Load(RATE, *SUMMARY), pool.as_pool(), slo, cfg)
    assert headroom(pool, 0, chat) > 1 + cfg.margin
    assert headroom(pool, 0, summary) < 1 < headroom(pool, 1, summary)


async def _load(session: aiohttp.ClientSession, url: str, model: str, phase: tuple[int, int], seconds: float,
                seed: int) -> list:
    rng = random.Random(seed)
    n = int(RATE * seconds)
    bodies = [json.dumps(request_body("completions", model, random_prompt(rng, phase[0]), phase[1], True)).encode()
              for _ in range(n)]
    return (await run_batch(session, url + "/v1/completions", bodies, None, RATE, seed=seed)).results


async def _admin(session: aiohttp.ClientSession, url: str, token: str) -> dict:
    async with session.get(url + "/admin/instances", headers={"Authorization": f"Bearer {token}"}) as resp:
        return {i["name"]: i for i in (await resp.json())["instances"]}


def test_phase_change_moves_a_group_to_prefill_without_a_failed_request(tmp_path: Path) -> None:
    stacks = auto_stack(tmp_path)
    state_dir = tmp_path / "state"
    up = cli("up", "--stack", "local", "--stacks-dir", str(stacks), "--detach", "--state-dir", str(state_dir),
             "--no-checks")
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        asyncio.run(_scenario(stacks, state_dir))
    finally:
        cli("down", "--stack", "local", "--state-dir", str(state_dir))
        kill_recorded(state_dir)


async def _scenario(stacks: Path, state_dir: Path) -> None:
    plan = load_plan("local", stacks)
    token = read_tokens(state_dir)[PROXY_TOKEN_ENV]
    backend = LocalBackend(plan, state_dir, str(stacks))
    assert backend.layout() == {"flex-0": "decode"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        mover = LocalMover(plan, backend, session, drain_timeout_s=60.0, ready_timeout_s=60.0)
        fixed = [i.name for i in plan.by_role("prefill") if plan.flex_group_of(i.name) is None]
        urls = lambda: [plan.instance(n).api_url for n in fixed] + (  # noqa: E731
            [plan.instance(n).api_url for n in plan.flex_groups[0].prefill] if mover.layout["flex-0"] == "prefill" else [])
        cfg = DaemonConfig(metrics_url=plan.proxy_url + "/metrics", dry_run=False, interval_s=1.0)
        planner = PDPlanner(cfg, pool_from_plan(plan), slo_from_plan(plan), planner_config_from_plan(plan),
                            (1, 2), groups=group_pool_from_plan(plan), mover=mover, engine_urls=urls)
        model = await fetch_model(session, plan.proxy_url)
        stop = asyncio.Event()
        cycles = asyncio.create_task(planner.run(stop))

        chat = await _load(session, plan.proxy_url, model, CHAT, 6.0, 1)
        reasons_chat = [r["decision"].reason for r in planner.history]
        assert mover.layout == {"flex-0": "decode"}, reasons_chat
        summaries: list = []
        for i in range(12):  # summaries until the move has completed, then a little more
            summaries += await _load(session, plan.proxy_url, model, SUMMARY, 4.0, 10 + i)
            if mover.history and planner.move_task is not None and planner.move_task.done():
                break
        after = await _load(session, plan.proxy_url, model, SUMMARY, 4.0, 99)
        stop.set()
        await cycles
        listing = await _admin(session, plan.proxy_url, token)

    results = chat + summaries + after
    failed = [r.error for r in results if not r.success]
    assert not failed, f"{len(failed)} of {len(results)} requests failed: {failed[:3]}"
    reasons = [r["decision"].reason for r in planner.history]
    assert "steady" in reasons_chat and "slo_ttft" not in reasons_chat, reasons_chat
    moves = [(m.group, m.to_role, m.ok) for m in mover.history]
    assert moves == [("flex-0", "prefill", True)], (moves, reasons)
    changed = [r["decision"] for r in planner.history if r["decision"].change]
    assert changed[0].reason == "slo_ttft" and changed[0].prefill_groups == 1, reasons
    assert "acting" in reasons
    # the proxy routes prefill requests to the group's new instances, and no longer knows decode-1
    assert "decode-1" not in listing, listing.keys()
    for name in ("prefill-1", "prefill-2"):
        assert listing[name]["role"] == "prefill" and listing[name]["routable"], listing[name]
        assert listing[name]["served"] > 0, listing[name]
    state = StackState.load(state_dir)
    running = {p.name for p in state.processes}
    assert {"prefill-1", "prefill-2"} <= running and "decode-1" not in running
    assert {i["name"] for i in json.loads((state_dir / "instances.json").read_text())["instances"]} == {
        "prefill-0", "decode-0", "prefill-1", "prefill-2"}
