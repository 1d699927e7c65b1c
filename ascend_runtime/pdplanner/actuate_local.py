"""The local stack's actuator: flexible groups as simulator processes (``ascend-deploy up --stack S``).

Stops and starts one simulator per instance with ``local/lifecycle.py`` (``stop_one``,
``start_one``, ``wait_one_ready``), so ``state.json`` always lists what runs and ``status`` /
``down`` see it; drains and re-registers through the local proxy's admin API with the token the
stack was started with (``<state dir>/proxy-admin-token``). After each completed move the proxy's
``instances.json`` is rewritten to the running instances, so a proxy reload agrees with it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from ascend_runtime.files.write import write_file
from ascend_runtime.local.lifecycle import read_tokens, record_of, start_one, stop_one, wait_one_ready
from ascend_runtime.local.runner import LocalStackError
from ascend_runtime.local.state import StackState
from ascend_runtime.local.topology import PROXY_TOKEN_ENV, simulator_spec
from ascend_runtime.pdplanner.actuate import ActuationError, GroupMover, MoveResult, PlannerProxyAdmin
from ascend_runtime.planner.plan import Plan

log = logging.getLogger(__name__)


class LocalBackend:
    """Simulator processes of a running local stack (its state directory)."""

    def __init__(self, plan: Plan, state_dir: Path, stacks_dir: str | None = None) -> None:
        state = StackState.load(state_dir)
        if state is None:
            raise ActuationError(f"no running local stack {plan.stack} under {state_dir}; run `ascend-deploy up --stack "
                                 f"{plan.stack} --detach` first")
        self.plan, self.state_dir, self.stacks_dir, self.state = plan, state_dir, stacks_dir, state

    def running(self, name: str) -> bool:
        """True when ``state.json`` records instance ``name``."""
        return record_of(self.state, name) is not None

    def layout(self) -> dict[str, str]:
        """Group name -> the role whose instances all run (the group's initial role when neither shape is whole)."""
        out = {}
        for g in self.plan.flex_groups:
            if all(self.running(n) for n in g.prefill):
                out[g.name] = "prefill"
            elif all(self.running(n) for n in g.decode):
                out[g.name] = "decode"
            else:
                raise ActuationError(f"{g.name}: neither shape runs whole ({', '.join((*g.prefill, *g.decode))}); "
                                     f"restart the stack")
        return out

    async def stop(self, names: Sequence[str]) -> None:
        for name in names:
            if not stop_one(self.state, self.state_dir, name):
                raise ActuationError(f"{name} would not stop; it is still recorded, `down` will retry")

    async def start(self, names: Sequence[str], timeout_s: float) -> None:
        try:
            records = [start_one(self.state, self.state_dir, simulator_spec(self.plan, n, self.stacks_dir)) for n in names]
            for record in records:
                await wait_one_ready(record, timeout_s)
        except LocalStackError as exc:
            raise ActuationError(str(exc)) from None

    def write_instances_file(self) -> None:
        """The proxy's watched instance list = the instances running now (under rank serving, one entry per DP
        rank with the ``instance`` it belongs to, as ``Plan.endpoints()`` lists them)."""
        running = [i for i in self.plan.all_instances if self.running(i.name)]
        entries: list[dict[str, str]] = []
        for inst in running:
            for ep in inst.api_endpoints:
                entry = {"name": ep.name, "role": ep.role, "url": ep.url}
                if ep.dp_rank is not None:
                    entry["instance"] = ep.instance
                entries.append(entry)
        write_file(self.state_dir / "instances.json",  # temporary file and rename, never through a link
                   json.dumps({"instances": entries}, indent=2))


class LocalMover(GroupMover):
    """:class:`GroupMover` over a :class:`LocalBackend`, keeping ``instances.json`` in step."""

    def __init__(self, plan: Plan, backend: LocalBackend, session: aiohttp.ClientSession,
                 drain_timeout_s: float, ready_timeout_s: float, poll_s: float = 0.2) -> None:
        token = read_tokens(backend.state_dir).get(PROXY_TOKEN_ENV)
        if not token:
            raise ActuationError(f"no proxy admin token under {backend.state_dir}; restart the stack")
        proxy = PlannerProxyAdmin(session, token, static=[plan.proxy_url], timeout_s=5.0)
        super().__init__(plan, backend, proxy, backend.layout(), lambda n: plan.instance(n).api_url,
                         drain_timeout_s, ready_timeout_s, poll_s)
        self.local = backend

    async def move(self, group, to_role):  # type: ignore[no-untyped-def,override]
        result: MoveResult = await super().move(group, to_role)
        if result.ok:
            self.local.write_instances_file()
        return result
