"""Replace one engine instance of a running local stack: restart its process from the stack file.

On the ``local`` target the engine is the simulator or, with ``local_engine.kind: vllm-cpu``, vLLM's own
server; "the new version" is the stack file as it reads now (a vLLM server is started from the Plan's
instance and ``local_engine``, so a rollout applies a new ``model_seed`` one instance at a time, and with the
file unchanged restarts each in turn). Each simulator is started with ``sim --stack S --instance NAME`` and
takes every option from the stack's Plan at start (``ascend_runtime.perf.from_plan``), so a
rollout applies an edit of ``simulator.*``, the stage's engine limits or ``engine.*``
one instance at a time; with the file unchanged it is a rolling restart. What may not
change is the topology the proxy routes to (instance names, roles, addresses): that
needs ``down`` and ``up`` (or the P:D planner), and :func:`local_targets` refuses it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from ascend_runtime.local.lifecycle import process_spec, record_of, replace_one
from ascend_runtime.local.runner import LocalStackError
from ascend_runtime.local.state import StackState
from ascend_runtime.local.topology import ENGINE_KINDS, ProcessSpec
from ascend_runtime.planner.plan import Plan
from ascend_runtime.rollout.order import RolloutInputError, Target, ordered
from ascend_runtime.rollout.steps import ReplaceError


def local_targets(plan: Plan, state: StackState, state_dir: Path) -> list[Target]:
    """The running engine instances (simulators or vLLM servers) of the stack as targets, in rollout order.

    Raises RolloutInputError when the stack file no longer describes what runs: an instance
    the Plan does not know, or an instance (under rank serving: a DP rank endpoint) whose address
    differs from the one the proxy routes to (``<state>/instances.json``).
    """
    rows = []
    endpoints: list[tuple[str, str]] = []  # (endpoint name, URL): the instance, or each DP rank (rank serving)
    for rec in state.processes:
        if rec.kind not in ENGINE_KINDS:
            continue
        try:
            inst = plan.instance(rec.name)
        except KeyError:
            raise RolloutInputError(f"--stack {plan.stack}: the running instance {rec.name} is not in the stack's "
                                    "Plan any more; a rollout keeps the topology: run `down` and `up` to change it") from None
        rows.append((inst.name, inst.role, inst.ordinal, inst.api_url))
        endpoints += [(ep.name, ep.url) for ep in inst.api_endpoints]
    if not rows:
        raise RolloutInputError(f"--stack {plan.stack}: the running stack has no engine instance (state in {state_dir})")
    routed = _routed(state_dir)
    changed = [f"{name} {routed[name]} -> {url}" for name, url in endpoints if name in routed and routed[name] != url]
    if changed:
        raise RolloutInputError(f"--stack {plan.stack}: the stack file moved instances the proxy routes to "
                                f"({'; '.join(changed)}); a rollout keeps addresses and ports: undo that edit, "
                                "or run `down` and `up`")
    return ordered(rows)


def check_stacks_dir(state: StackState, given: str | None) -> None:
    """The simulators must restart from the stacks directory they run from: ``--stacks-dir`` (or its
    default) must be the one their command lines name; RolloutInputError otherwise."""
    from ascend_runtime.config.loader import stacks_dir  # noqa: PLC0415

    for rec in state.processes:
        if rec.kind != "simulator":
            continue
        argv = list(rec.argv)
        recorded = argv[argv.index("--stacks-dir") + 1] if "--stacks-dir" in argv[:-1] else None
        if stacks_dir(recorded).resolve() != stacks_dir(given).resolve():
            raise RolloutInputError(f"--stacks-dir: stack {state.stack} runs from {stacks_dir(recorded)}, not "
                                    f"{stacks_dir(given)}; give --stacks-dir {stacks_dir(recorded)}")


def _routed(state_dir: Path) -> dict[str, str]:
    """Instance name -> URL in the instance list the local proxy watches (empty when unreadable)."""
    try:
        data = json.loads((state_dir / "instances.json").read_text())
        return {str(i["name"]): str(i["url"]).rstrip("/") for i in data.get("instances") or []}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


class LocalDriver:
    """Stops a simulator and starts it again from the stack file (``local.lifecycle.replace_one``).

    ``spec_of(name)`` gives the process to start instead of the launcher's (the fault watcher starts a moved
    instance from its own Plan: ``faults/spares_local.py``).
    """

    kind = "local"

    def __init__(self, plan: Plan, state: StackState, state_dir: Path, stacks_dir: str | None = None,
                 ready_timeout_s: float = 60.0, grace_s: float = 5.0,
                 spec_of: Callable[[str], ProcessSpec] | None = None) -> None:
        self.plan, self.state, self.state_dir, self.stacks_dir = plan, state, state_dir, stacks_dir
        self.ready_timeout_s, self.grace_s = ready_timeout_s, grace_s
        self.spec_of = spec_of or (lambda name: process_spec(self.plan, self.state_dir, name, self.stacks_dir))

    def describe(self, target: Target) -> str:
        record = record_of(self.state, target.name)
        pid = f"pid {record.pid}" if record else "not running"
        what = "vLLM server" if record is not None and record.kind == "vllm" else "simulator"
        return f"restart {what} {target.name} ({pid}) from stack {self.plan.stack}'s file"

    async def replace(self, target: Target) -> str:
        record = record_of(self.state, target.name)
        old = record.pid if record else None
        spec = self.spec_of(target.name)
        start = time.monotonic()
        try:
            new = await replace_one(self.state, self.state_dir, spec, self.ready_timeout_s, self.grace_s)
        except LocalStackError as exc:
            raise ReplaceError(str(exc)) from None
        return f"pid {old} -> {new.pid}, serving in {time.monotonic() - start:.1f} s (log {new.log})"
