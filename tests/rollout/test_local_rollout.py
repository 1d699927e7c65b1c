"""Rollouts of a running local stack under load: every instance replaced with zero failed requests, and a
failing post-check that stops the rollout with the instances after it untouched (one stack for both)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from ascend_runtime.faults.proxies import ProxyAdmin
from ascend_runtime.planner import load_plan
from ascend_runtime.rollout.local import LocalDriver, local_targets
from ascend_runtime.rollout.order import Target
from ascend_runtime.rollout.postcheck import EnginePostCheck, PostCheckFailed
from ascend_runtime.rollout.steps import Rollout, RolloutOptions

from .conftest import Load, RunningStack, proxy_listing, sim_stats, undrain_all
from .stack import SPEEDUP, set_config

pytestmark = pytest.mark.slow

NEW_SPEEDUP = SPEEDUP + 10


async def _cli(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "ascend_runtime", *args,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 240)
    return proc.returncode or 0, out.decode()


async def test_full_rollout_under_load_drops_no_request(running_stack: RunningStack) -> None:
    stack = running_stack
    before = stack.pids()
    assert sorted(before) == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
    sim_token = stack.token("sim-admin-token")
    plan = load_plan("local", stack.stacks)
    for inst in plan.instances:
        assert (await sim_stats(inst.api_url, sim_token))["speedup"] == SPEEDUP
    set_config(stack.stacks, simulator={"speedup": NEW_SPEEDUP})  # the new version: the stack file as edited

    load = Load(stack.state.proxy_url)
    await load.start()
    await asyncio.sleep(0.5)  # requests in flight everywhere before the first drain
    code, out = await _cli("rollout", "--stack", "local", "--stacks-dir", str(stack.stacks),
                           "--state-dir", str(stack.state_dir))
    served_during = len(load.results)
    await asyncio.sleep(0.5)  # and the new instances serve afterwards
    results = await load.stop()

    assert code == 0, out
    assert "rollout done: 4 of 4 instance(s) replaced" in out, out
    assert [line.split(":")[0] for line in out.splitlines() if "undrained; every replica routes to it" in line] == [
        "[1/4] prefill-0", "[2/4] prefill-1", "[3/4] decode-0", "[4/4] decode-1"], out
    assert "waiting for" in out, f"no step had requests in flight to wait for:\n{out}"
    assert served_during > 20 and len(results) > served_during
    assert load.failures == [], [r.error for r in load.failures][:5]

    after = stack.pids()
    assert after.keys() == before.keys()
    assert all(after[n] != before[n] for n in before), (before, after)
    for inst in plan.instances:  # the new version answers from every instance
        assert (await sim_stats(inst.api_url, sim_token))["speedup"] == NEW_SPEEDUP, inst.name
    listing = await proxy_listing(stack.state.proxy_url, stack.token("proxy-admin-token"))
    assert all(listing[n]["routable"] and not listing[n]["draining"] for n in before), listing


class PlantedCheck:
    """The real post-check, except that it fails for ``failing`` (a test double of a broken new version)."""

    def __init__(self, real: EnginePostCheck, failing: str) -> None:
        self.real, self.failing, self.calls = real, failing, []

    async def __call__(self, target: Target, partner: Target) -> str:
        self.calls.append(target.name)
        if target.name == self.failing:
            raise PostCheckFailed(f"planted failure of {target.name}")
        return await self.real(target, partner)


async def test_failed_post_check_stops_the_rollout_and_the_rest_is_untouched(running_stack: RunningStack) -> None:
    import aiohttp

    stack = running_stack
    state = stack.state
    proxy_token = stack.token("proxy-admin-token")
    await undrain_all(state.proxy_url, proxy_token)
    before = stack.pids()
    plan = load_plan("local", stack.stacks)
    load = Load(state.proxy_url)
    await load.start()
    await asyncio.sleep(0.3)
    lines: list[str] = []
    async with aiohttp.ClientSession() as session:
        check = PlantedCheck(EnginePostCheck(session, 10.0), failing="prefill-1")
        targets = local_targets(plan, state, stack.state_dir)
        rollout = Rollout(targets, targets, ProxyAdmin(session, proxy_token, [state.proxy_url]),
                          LocalDriver(plan, state, stack.state_dir, str(stack.stacks)), check,
                          RolloutOptions(drain_timeout_s=30.0), lines.append)
        outcome = await rollout.run()
    await asyncio.sleep(0.3)
    await load.stop()

    assert (outcome.failed, outcome.step, outcome.left_drained) == ("prefill-1", "post-check", True), lines
    assert outcome.done == ["prefill-0"] and outcome.untouched == ["decode-0", "decode-1"]
    assert check.calls == ["prefill-0", "prefill-1"]
    after = stack.pids()
    assert after["prefill-0"] != before["prefill-0"] and after["prefill-1"] != before["prefill-1"]
    assert after["decode-0"] == before["decode-0"] and after["decode-1"] == before["decode-1"]
    listing = await proxy_listing(state.proxy_url, proxy_token)
    assert listing["prefill-1"]["draining"] and not listing["prefill-1"]["routable"]
    assert not any(listing[n]["draining"] for n in ("prefill-0", "decode-0", "decode-1")), listing
    assert load.failures == [], [r.error for r in load.failures][:5]  # the other prefill carried the load
    assert any("post-check FAILED: planted failure of prefill-1" in line for line in lines), lines

    # the recovery the CLI prints: without --include-drained it refuses to touch what is drained
    # (nothing changes); with it, the left-drained instance is replaced, checked and serves again
    code, out = await _cli("rollout", "--stack", "local", "--stacks-dir", str(stack.stacks),
                           "--state-dir", str(stack.state_dir), "--from", "prefill-1")
    assert code == 1 and "prefill-1 already drained" in out and "nothing changed" in out, out
    assert stack.pids() == after
    code, out = await _cli("rollout", "--stack", "local", "--stacks-dir", str(stack.stacks),
                           "--state-dir", str(stack.state_dir), "--instance", "prefill-1", "--include-drained")
    assert code == 0 and "rollout done: 1 of 1" in out, out
    final = stack.pids()
    assert final["prefill-1"] != after["prefill-1"]
    assert {n: final[n] for n in ("prefill-0", "decode-0", "decode-1")} == {
        n: after[n] for n in ("prefill-0", "decode-0", "decode-1")}
    listing = await proxy_listing(state.proxy_url, proxy_token)
    assert all(i["routable"] and not i["draining"] for i in listing.values()), listing
