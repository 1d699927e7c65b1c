"""The local stack's recovery onto spares: the moved instance's process restarted on the spare's address.

A local node is a loopback address and an instance is one process on its leader node's address
(``local/topology.py``), so recreating it on spares is the rollout's local replace
(``rollout/local.py`` ``LocalDriver``: stop the recorded process, start the new one, wait until it serves
from its own socket, ``state.json`` kept true) with the process the watcher's Plan gives: a simulator with
every option on its command line (``simulator_spec(..., placed=True)``; ``sim --stack`` would plan without
the nodes taken out), or vLLM's own server on the spare's address. When a decode leader moved, the balancer
is restarted with the new decode URLs. Taking a node out is recorded in ``<state>/out-of-service.json``
(``{"nodes": [{"name", "at", "instances"}]}``, oldest first), which a restarted watcher plans from; there is
no cordon (nothing schedules onto a loopback address). Once the moved instances serve again,
``<state>/instances.json`` (the proxy's watched list) is rewritten from the Plan.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from ascend_runtime.faults.spares import Move, NotReady, RecreateError
from ascend_runtime.files.read import STATE_FILE, read_text
from ascend_runtime.local.lifecycle import process_spec, record_of, replace_one
from ascend_runtime.local.runner import LocalStackError
from ascend_runtime.local.state import StackState
from ascend_runtime.local.topology import ProcessSpec, simulator_spec
from ascend_runtime.pdplanner.actuate_local import LocalBackend
from ascend_runtime.planner.plan import Plan
from ascend_runtime.rollout.local import LocalDriver
from ascend_runtime.rollout.order import Target
from ascend_runtime.rollout.steps import ReplaceError

log = logging.getLogger(__name__)
#: The record of nodes taken out, in the stack's state directory.
RECORD = "out-of-service.json"


def read_record(state_dir: Path) -> list[dict[str, Any]]:
    """The entries of ``<state>/out-of-service.json``, oldest first ([] without the file; ValueError naming the
    file when it is not the watcher's)."""
    path = state_dir / RECORD
    if not path.exists():
        return []
    try:
        doc = json.loads(read_text(path, STATE_FILE))  # the kit's one file-reading door: a regular file, capped
        nodes = [n for n in doc["nodes"] if isinstance(n, dict) and isinstance(n["name"], str)]
        if len(nodes) != len(doc["nodes"]):
            raise ValueError("an entry without a name")
        return nodes
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not the fault watcher's record of nodes taken out ({exc}); remove it if no node "
                         "is out of service") from None


def read_taken_out(state_dir: Path) -> list[str]:
    """Node names ``<state>/out-of-service.json`` lists, oldest first."""
    return [str(n["name"]) for n in read_record(state_dir)]


class LocalSpares:
    """Recreates moved instances of the local stack running from ``state_dir`` (the :class:`Actuator` of
    ``faults/spares.py``); ``ready_timeout_s`` bounds each start (s), ``grace_s`` a stop."""

    kind = "local"

    def __init__(self, state_dir: Path, stacks_dir: str | None = None, ready_timeout_s: float = 60.0,
                 grace_s: float = 2.0) -> None:
        self.state_dir, self.stacks_dir = state_dir, stacks_dir
        self.ready_timeout_s, self.grace_s = ready_timeout_s, grace_s

    def _state(self) -> StackState:
        state = StackState.load(self.state_dir)
        if state is None:
            raise RecreateError(f"no local stack runs from {self.state_dir}")
        return state

    async def taken_out(self, plan: Plan) -> list[str]:
        return read_taken_out(self.state_dir)

    def spec(self, plan: Plan, name: str) -> ProcessSpec:
        """The process of instance ``name`` where ``plan`` puts it."""
        spec = process_spec(plan, self.state_dir, name, self.stacks_dir)
        return simulator_spec(plan, name, placed=True) if spec.kind == "simulator" else spec

    async def recreate(self, move: Move, instance: str) -> str:
        state = self._state()
        before = record_of(state, instance)
        inst = move.new.instance(instance)
        if before is None:  # a flexible group's shape that does not run: placed in the Plan, nothing to start
            return f"{instance} does not run here; placed on {', '.join(inst.nodes)}"
        driver = LocalDriver(move.new, state, self.state_dir, self.stacks_dir, self.ready_timeout_s, self.grace_s,
                             spec_of=lambda name: self.spec(move.new, name))
        try:
            summary = await driver.replace(Target(inst.name, inst.role, inst.api_url))
        except ReplaceError as exc:
            after = record_of(state, instance)
            if before is not None and after is not None and after.pid == before.pid:
                raise RecreateError(str(exc)) from None
            raise NotReady(str(exc)) from None
        if inst.role == "decode" and move.url_changed(instance) and record_of(state, "balancer") is not None:
            try:  # the balancer reads expert load from, and applies maps to, the decode URLs it was started with
                await replace_one(state, self.state_dir, process_spec(move.new, self.state_dir, "balancer",
                                                                      self.stacks_dir), self.ready_timeout_s,
                                  self.grace_s)
            except LocalStackError as exc:
                log.error("restarting the balancer with %s's new URL: %s", instance, exc)
        return f"{instance} on {inst.api_host}: {summary}"

    async def take_out(self, move: Move, note: dict[str, Any]) -> None:
        path = self.state_dir / RECORD
        nodes = read_record(self.state_dir)
        known = {n["name"] for n in nodes}
        nodes += [{"name": n, **note} for n in move.nodes if n not in known]
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"nodes": nodes}, indent=2) + "\n")
        os.replace(tmp, path)

    async def serving(self, plan: Plan) -> None:
        LocalBackend(plan, self.state_dir, self.stacks_dir).write_instances_file()

