"""Run a playbook over the inventory's hosts: a bounded pool, one SSH session per host.

Each host runs every step in order in its own worker; a failing step or an
unreachable host never stops the other hosts. Results are handed to
``on_result`` as they arrive (from worker threads, serialised by a lock).
``compare`` steps are evaluated once all hosts are done, since they need
every host's value. The sessions of a run share one
:class:`~ascend_runtime.hosts.ssh.Connector` (known_hosts read once, one
jump-host connection); its warnings go to ``on_warning`` and the report.

Faults are results, never exceptions: a step's ``timeout_s`` is one deadline
for the step on a host, whatever number of devices it covers (a command
started after it passed is not run; a command still running at it is killed);
a refused sudo, a timeout, output over the capture cap and output a parser
rejects (an impossible address) fail the device they belong to, with the
reason. A ``set`` step whose current value could not be read fails ("could not
read"), in ``--check`` too, instead of reporting a change. Failed results
carry the device ids they cover (``failed_devices``; empty for a host-level
failure), so the facts merge can keep the other devices' facts.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import paramiko

from ascend_runtime.config.inventory import Inventory, Node
from ascend_runtime.hosts.parsers import PARSERS, key_value_file
from ascend_runtime.hosts.playbook import Playbook, Step
from ascend_runtime.hosts.quoting import TemplateError, render, render_value
from ascend_runtime.hosts.ssh import (
    CommandResult,
    ConnectOptions,
    Connector,
    Endpoint,
    HostKeyError,
    Session,
    SshError,
)
from ascend_runtime.hosts.versions import check_range

DEVICES_PER_NODE = {"atlas-800i-a2": 8, "cm384": 16}
CHIPS_PER_CARD = {"atlas-800i-a2": 1, "cm384": 2}

#: Step statuses; ``fail`` fails the host (and the run).
STATUSES = ("ok", "changed", "would_change", "skip", "fail")


def _truthy(value: Any) -> bool:
    """A playbook variable given as ``true`` (YAML) or ``"true"``/``"1"``/``"yes"``."""
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


@dataclass
class StepResult:
    """The outcome of one step on one host."""

    host: str
    step: str
    status: str
    message: str = ""
    details: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    cross_host: bool = False
    failed_devices: list[int] = field(default_factory=list)  # device ids of failed units; empty: the host failed


@dataclass
class RunReport:
    """Everything a run produced."""

    playbook: str
    hardware: str
    check: bool
    results: list[StepResult] = field(default_factory=list)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # run-wide (known_hosts lines skipped or ignored)

    def failed_hosts(self) -> list[str]:
        """Hosts with at least one failed step (unreachable and refused hosts included)."""
        return sorted({r.host for r in self.results if r.status == "fail"})

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (for ``--json``)."""
        return {
            "playbook": self.playbook,
            "hardware": self.hardware,
            "check": self.check,
            "failed_hosts": self.failed_hosts(),
            "unreachable": sorted(self.unreachable),
            "warnings": list(self.warnings),
            "results": [asdict(r) for r in self.results],
        }


@dataclass
class _Unit:
    label: str
    ctx: dict[str, Any]
    device_id: int | None = None


def _get(data: dict[str, Any], dotted: str) -> Any:
    cur: Any = data
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return None
    return cur


def _s(v: Any) -> str:
    return "" if v is None else str(v)


class Runner:
    """Runs one playbook over an inventory."""

    def __init__(
        self,
        playbook: Playbook,
        inventory: Inventory,
        hardware: str,
        connect: ConnectOptions,
        *,
        check: bool = False,
        forks: int = 8,
        vars_all: dict[str, Any] | None = None,
        vars_hosts: dict[str, dict[str, Any]] | None = None,
        on_result: Callable[[StepResult], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self.playbook = playbook
        self.inventory = inventory
        self.hardware = hardware
        self.connect = connect
        self.check = check
        self.forks = max(1, forks)
        self.vars_all = vars_all or {}
        self.vars_hosts = vars_hosts or {}
        self._on_result = on_result
        self._on_warning = on_warning
        self._lock = threading.Lock()
        self._compare: dict[str, dict[str, dict[str, Any]]] = {}

    # ----------------------------------------------------------------- running
    def run(self, limit: list[str] | None = None) -> RunReport:
        """Run on every node (or the ``limit`` names / addresses); return the report."""
        report = RunReport(self.playbook.name, self.hardware, self.check)
        nodes = [n for n in self.inventory.nodes if not limit or n.name in limit or str(n.host_ip) in limit
                 or (n.ssh_host and n.ssh_host in limit)]
        self._report = report
        nodes = self._refuse_contradicting_facts(nodes)
        self._connector = Connector(self.connect)
        try:
            for warning in self._connector.known_hosts.warnings:
                report.warnings.append(warning)
                if self._on_warning is not None:
                    self._on_warning(warning)
            with ThreadPoolExecutor(max_workers=min(self.forks, max(1, len(nodes)))) as pool:
                list(pool.map(self._run_host, nodes))
        finally:
            self._connector.close()
        self._finish_compares(nodes)
        return report

    def _refuse_contradicting_facts(self, nodes: list[Node]) -> list[Node]:
        """Hosts whose inventory entry contradicts the hardware (vnic_ip on A2) fail; nothing runs on them."""
        problems = self.inventory.hardware_problems(self.hardware)
        keep = []
        wanted = {id(n) for n in nodes}
        for i, node in enumerate(self.inventory.nodes):
            if id(node) not in wanted:
                continue
            mine = [p for p in problems if p.path.startswith(f"inventory.nodes[{i}].")]
            if mine:
                self._emit(StepResult(node.name, "inventory", "fail",
                                      "inventory refused; nothing run: " + "; ".join(map(str, mine))))
            else:
                keep.append(node)
        return keep

    def _emit(self, result: StepResult) -> None:
        with self._lock:
            self._report.results.append(result)
            if self._on_result is not None:
                self._on_result(result)

    def _endpoint(self, node: Node) -> Endpoint:
        ssh = self.inventory.ssh
        return Endpoint(host=node.ssh_host or str(node.host_ip), port=node.ssh_port or ssh.port, user=ssh.user)

    def _host_context(self, node: Node) -> dict[str, Any]:
        ctx: dict[str, Any] = dict(self.playbook.vars)
        ctx.update(self.vars_all)
        ctx.update(self.vars_hosts.get(node.name, {}))
        ctx.update(
            hardware=self.hardware,
            devices_per_node=DEVICES_PER_NODE[self.hardware],
            chips_per_card=CHIPS_PER_CARD[self.hardware],
            name=node.name,
            host_ip=str(node.host_ip),
            nic=node.nic,
            node=node.model_dump(mode="json"),
            applying=not self.check,
        )
        return ctx

    def _run_host(self, node: Node) -> None:
        start = time.monotonic()
        session = Session(self._endpoint(node), self.connect, connector=self._connector)
        try:
            session.connect()
        except HostKeyError as exc:
            self._emit(StepResult(node.name, "connect", "fail", f"host key refused; nothing run: {exc}",
                                  duration_s=time.monotonic() - start))
            with self._lock:
                self._report.unreachable.append(node.name)
            return
        except (SshError, paramiko.SSHException, OSError) as exc:
            self._emit(StepResult(node.name, "connect", "fail", f"unreachable: {exc}",
                                  duration_s=time.monotonic() - start))
            with self._lock:
                self._report.unreachable.append(node.name)
            return
        facts: dict[str, Any] = {"devices": {}}
        failed: dict[str, set[int]] = {}  # step name -> devices it failed on (for ``after``)
        try:
            ctx = self._host_context(node)
            for step in self.playbook.steps:
                if step.hardware and self.hardware not in step.hardware:
                    continue
                t0 = time.monotonic()
                try:
                    result = self._run_step(session, node, step, ctx, facts, failed)
                except (SshError, paramiko.SSHException, OSError, EOFError) as exc:
                    result = StepResult(node.name, step.name, "fail", f"ssh error: {exc}")
                except TemplateError as exc:
                    result = StepResult(node.name, step.name, "fail", f"playbook error: {exc}")
                result.duration_s = time.monotonic() - t0
                if result is not None and not (step.type == "compare" and result.status == "ok"):
                    self._emit(result)
        finally:
            session.close()
            with self._lock:
                self._report.facts[node.name] = facts

    # ------------------------------------------------------------------ units
    def _units(self, node: Node, step: Step, ctx: dict[str, Any]) -> list[_Unit]:
        if step.foreach == "host":
            return [_Unit("", ctx)]
        if step.foreach == "file":
            files = ctx.get("model_files") or {}
            return [_Unit(f"file {name}", dict(ctx, model_file=name, model_file_size=size))
                    for name, size in sorted(files.items())]
        by_id = {d.device_id: d for d in node.devices}
        chips = CHIPS_PER_CARD[self.hardware]
        units: list[_Unit] = []
        for dev_id in range(DEVICES_PER_NODE[self.hardware]):
            dev = by_id.get(dev_id)
            dctx = dict(ctx)
            dctx.update(
                device_id=dev_id,
                card=dev_id // chips,
                chip=dev_id % chips,
                device_ip=_s(dev.device_ip) if dev else None,
                netmask=_s(dev.netmask) or None if dev else None,
                gateway=_s(dev.gateway) or None if dev else None,
                netdetect=_s(dev.netdetect) or None if dev else None,
                vnic_ip=_s(dev.vnic_ip) or None if dev else None,  # A3 VNIC IP; device_ip is the RoCE port IP
            )
            if step.foreach == "device":
                units.append(_Unit(f"device {dev_id}", dctx, dev_id))
                continue
            for other in self.inventory.nodes:
                if other.name == node.name:
                    continue
                peer = next((d for d in other.devices if d.device_id == dev_id), None)
                if peer is not None:
                    pctx = dict(dctx, peer_ip=str(peer.device_ip), peer_name=other.name)
                    units.append(_Unit(f"device {dev_id} -> {other.name}", pctx, dev_id))
        return units

    def _run_step(self, session: Session, node: Node, step: Step, ctx: dict[str, Any],
                  facts: dict[str, Any], failed: dict[str, set[int]]) -> StepResult:
        """Run one step on one host. ``failed``: step name -> device ids it failed on, read for the step's
        ``after`` and updated with this step's failures."""
        deadline = time.monotonic() + step.timeout_s  # one deadline for the step on this host
        outcomes: list[tuple[str, str, str, int | None]] = []  # (status, label, message, device id)
        active: list[_Unit] = []
        for unit in self._units(node, step, ctx):
            blocked = [name for name in step.after if unit.device_id in failed.get(name, ())]
            if any(not unit.ctx.get(name) for name in step.when):
                outcomes.append(("skip", unit.label, "not applicable", unit.device_id))
            elif blocked:
                # "held": not run because of ``after``; reported as skipped, and always named
                outcomes.append(("held", unit.label, f"not run: {', '.join(blocked)} failed on this device",
                                 unit.device_id))
            else:
                active.append(unit)
        if step.type == "set":
            # read every device's current value in one exec; set (and re-read) only where it differs
            gets = (self._run_batch(session, step, [render(step.get or "", u.ctx) for u in active], deadline)
                    if len(active) > 1 else [None] * len(active))
            evaluated = [(u, self._run_set(session, step, u.ctx, deadline, g)) for u, g in zip(active, gets)]
        elif len(active) > 1:
            results = self._run_batch(session, step, [self._unit_command(step, u.ctx) for u in active], deadline)
            evaluated = [(u, self._evaluate(step, u.ctx, r)) for u, r in zip(active, results)]
        else:
            evaluated = [(u, self._evaluate(step, u.ctx, self._run_one(session, step, self._unit_command(step, u.ctx),
                                                                        deadline)))
                         for u in active]
        for unit, (status, message, parsed) in evaluated:
            outcomes.append((status, unit.label, message, unit.device_id))
            if status == "fail":
                parsed = None  # a failed device's reading is never kept as a fact or compared
                if unit.device_id is not None:
                    failed.setdefault(step.name, set()).add(unit.device_id)
            if step.register_as and parsed is not None:
                if unit.device_id is None:
                    facts[step.register_as] = parsed
                else:
                    facts["devices"].setdefault(unit.device_id, {})[step.register_as] = parsed
            if step.type == "compare" and parsed is not None:
                with self._lock:
                    self._compare.setdefault(step.name, {}).setdefault(node.name, {})[unit.label] = _get(
                        parsed, step.field or "")
        return self._aggregate(node.name, step, outcomes)

    def _run_one(self, session: Session, step: Step, command: str, deadline: float) -> CommandResult:
        """Run one command within what is left of the step's deadline (not at all once it passed)."""
        left = deadline - time.monotonic()
        if left <= 0:
            return _not_run(command, step)
        return session.run(command, timeout_s=left, become=step.become)

    def _run_batch(self, session: Session, step: Step, commands: list[str], deadline: float) -> list[CommandResult]:
        """Run the per-device commands of one step in one SSH exec (stderr merged into stdout).

        Each command runs in its own subshell between random markers, so one
        device's output or exit status can never be taken for another's. The
        batch has the step's one deadline: devices not reached by then are
        reported as not run.
        """
        token = secrets.token_hex(8)
        script = "; ".join(
            f"printf '\\n@@{token} {i}@@\\n'; ( {cmd} ) 2>&1; printf '\\n@@{token} rc %s@@\\n' \"$?\""
            for i, cmd in enumerate(commands)
        )
        res = self._run_one(session, step, script, deadline)
        found: dict[str, str] = {}
        rcs: dict[str, str] = {}
        for idx, body, rc in re.findall(rf"\n@@{token} (\d+)@@\n(.*?)\n@@{token} rc (\d+)@@", res.stdout, re.S):
            found[idx], rcs[idx] = body, rc
        started = [int(i) for i in re.findall(rf"\n@@{token} (\d+)@@\n", res.stdout)]
        running = max(started) if started and str(max(started)) not in found else None
        out = []
        for i, cmd in enumerate(commands):
            if str(i) in found:
                out.append(CommandResult(cmd, int(rcs[str(i)]), found[str(i)], "", res.duration_s))
            elif res.not_run or (res.timed_out and running is not None and i > running):
                out.append(_not_run(cmd, step))
            elif res.timed_out:
                out.append(CommandResult(cmd, None, "", "", res.duration_s, timed_out=True, notes=list(res.notes)))
            elif res.become_refused:
                out.append(CommandResult(cmd, res.rc, "", res.stderr, res.duration_s, become_refused=True))
            elif res.stdout_dropped:
                out.append(CommandResult(cmd, None, "", "", res.duration_s, stdout_dropped=res.stdout_dropped,
                                         notes=[f"output truncated before this device's result: {n}"
                                                for n in res.notes if "truncated" in n]))
            else:
                out.append(CommandResult(cmd, None, "", f"batch ended early: {_err(res, step)}", res.duration_s))
        return out

    def _unit_command(self, step: Step, ctx: dict[str, Any]) -> str:
        if step.type == "file":
            return "cat -- " + render("{_path}", {"_path": render(step.path or "", ctx, shell=False)})
        return render(step.command or "", ctx)

    def _no_output(self, step: Step, res: CommandResult, parsing: bool) -> str | None:
        """Why ``res`` gives nothing to judge (sudo refused, timed out or not run, truncated), else None."""
        if res.become_refused:
            return (f"sudo refused: {sudo_reason(res.stderr) or f'rc={res.rc}'}; fix: allow {self.inventory.ssh.user} "
                    f"passwordless sudo (NOPASSWD) on this host, or log in as root")
        if res.timed_out:
            return _err(res, step)
        if parsing and res.truncated:
            return (f"output truncated ({'; '.join(n for n in res.notes if 'truncated' in n)}); a partial output is "
                    f"not parsed: make the command print less")
        return None

    def _evaluate(self, step: Step, ctx: dict[str, Any], res: CommandResult) -> tuple[str, str, dict | None]:
        why = self._no_output(step, res, parsing=step.type != "command")
        if why:
            return "fail", why, None
        if step.type == "file":
            if not res.ok:
                return "fail", f"cannot read {render(step.path or '', ctx, shell=False)}: {_err(res, step)}", None
            observed = (PARSERS[step.parser] if step.parser else key_value_file)(res.stdout)
        elif step.type == "command":
            observed = {"rc": res.rc, "stdout": res.stdout.strip(), "stderr": res.stderr.strip()}
            problems = self._check(observed, step.expect or {"rc": 0}, ctx)
            note = "".join(f" ({n})" for n in res.notes)
            if problems:
                return "fail", "; ".join(problems) + f" from `{res.command}`: {_err(res, step)}{note}", observed
            return "ok", (_first_line(res.stdout) or "rc=0") + note, observed
        else:
            if not step.ignore_rc and "rc" not in step.expect and not res.ok:
                return "fail", f"command failed: {_err(res, step)}", None
            observed = PARSERS[step.parser or "raw"](res.stdout)
            observed.setdefault("rc", res.rc)
        unparsable = observed.pop("_problems", None)
        observed.pop("_unset", None)
        if unparsable:
            return "fail", (f"cannot parse the output of `{res.command}`: {'; '.join(unparsable)}; check the value on "
                            f"the host with that command and correct it there"), None
        problems = self._check(observed, step.expect, ctx)
        if problems:
            return "fail", "; ".join(problems), observed
        return "ok", self._summary(step, observed), observed

    @staticmethod
    def _aggregate(host: str, step: Step, outcomes: list[tuple[str, str, str, int | None]]) -> StepResult:
        def line(label: str, msg: str) -> str:
            return f"{label}: {msg}" if label else msg

        # devices held back by ``after`` are named in whatever the step reports (never folded into "ok")
        held = [line(label, msg) for s, label, msg, _ in outcomes if s == "held"]
        tail = ("; " + "; ".join(held[:4]) + (" ..." if len(held) > 4 else "")) if held else ""
        for status in ("fail", "changed", "would_change"):
            hits = [line(label, msg) for s, label, msg, _ in outcomes if s == status]
            if hits:
                failed = sorted({d for s, _, _, d in outcomes if s == "fail" and d is not None})
                if any(d is None for s, _, _, d in outcomes if s == "fail"):
                    failed = []  # a host-level unit failed: the failure is the host's
                return StepResult(host, step.name, status,
                                  "; ".join(hits[:4]) + (" ..." if len(hits) > 4 else "") + tail,
                                  details=hits + held, failed_devices=failed if status == "fail" else [])
        oks = [line(label, msg) for s, label, msg, _ in outcomes if s == "ok"]
        if oks:
            n = len(oks)
            msg = oks[0] if n == 1 else f"{n} {'devices' if step.foreach == 'device' else 'checks'} ok"
            return StepResult(host, step.name, "ok", msg + tail, details=oks + held)
        if held:
            return StepResult(host, step.name, "skip", tail[2:], details=held)
        return StepResult(host, step.name, "skip", "not applicable")

    def _summary(self, step: Step, observed: dict[str, Any]) -> str:
        keys = list(step.expect) or ([step.field] if step.field else [])
        return ", ".join(f"{k}={_get(observed, k)}" for k in keys) or "ok"

    def _run_set(self, session: Session, step: Step, ctx: dict[str, Any], deadline: float,
                 first_get: CommandResult | None = None) -> tuple[str, str, dict | None]:
        parser = PARSERS[step.parser or "raw"]
        want = {k: _s(render_value(v, ctx)) for k, v in step.want.items()}
        prefetched = [first_get] if first_get is not None else []

        def read() -> tuple[dict[str, Any] | None, str]:
            """The current values, or why they could not be read (then nothing may be set)."""
            res = prefetched.pop() if prefetched else self._run_one(session, step, render(step.get or "", ctx),
                                                                     deadline)
            why = self._no_output(step, res, parsing=True)
            if why:
                return None, f"could not read the current value: {why}"
            current = parser(res.stdout if res.ok else res.stdout + "\n" + res.stderr)
            unparsable = current.pop("_problems", None)
            if unparsable:
                return None, f"could not read the current value: cannot parse `{res.command}`: {'; '.join(unparsable)}"
            if not res.ok and not current.pop("_unset", False) and not step.ignore_rc:
                return None, f"could not read the current value: `{res.command}` failed: {_err(res, step)}"
            current.pop("_unset", None)
            return current, ""

        def diff(current: dict[str, Any]) -> dict[str, tuple[str, str]]:
            return {k: (_s(_get(current, k)), w) for k, w in want.items() if _s(_get(current, k)) != w}

        current, err = read()
        if current is None:
            return "fail", err, None
        changes = diff(current)
        if not changes:
            return "ok", "unchanged (" + ", ".join(f"{k}={w}" for k, w in want.items()) + ")", current
        text = ", ".join(f"{k} {c or '(unset)'} -> {w}" for k, (c, w) in changes.items())
        replaced = {k: c for k, (c, _) in changes.items() if c}
        if step.replace_guard and replaced and not _truthy(ctx.get(step.replace_guard)):
            why = (f"the host already has {', '.join(f'{k}={c}' for k, c in replaced.items())}; replacing it cuts "
                   f"whatever uses it: check the inventory, then re-run with --var {step.replace_guard}=true")
            if self.check:
                return "would_change", f"would set {text} (refused without --var {step.replace_guard}=true)", current
            return "fail", f"not replaced ({text}): {why}", current
        if self.check:
            return "would_change", f"would set {text}", current
        res = self._run_one(session, step, render(step.set or "", ctx), deadline)
        if not res.ok:
            why = self._no_output(step, res, parsing=False) or _err(res, step)
            return "fail", f"set failed ({text}): {why}", current
        current, err = read()
        if current is None:
            return "fail", f"verification after set failed: {err}", None
        left = diff(current)
        if left:
            still = ", ".join(f"{k}={c} (want {w})" for k, (c, w) in left.items())
            return "fail", f"verification after set failed: {still}", current
        return "changed", f"set {text}; verified", current

    # ------------------------------------------------------------ expectations
    def _check(self, observed: dict[str, Any], expect: dict[str, Any], ctx: dict[str, Any]) -> list[str]:
        problems = []
        for key, cond in expect.items():
            actual = _get(observed, key)
            problem = self._check_one(key, actual, cond, ctx)
            if problem:
                problems.append(problem)
        return problems

    def _check_one(self, key: str, actual: Any, cond: Any, ctx: dict[str, Any]) -> str | None:
        if not isinstance(cond, dict):
            want = render_value(cond, ctx)
            return None if _s(actual) == _s(want) else f"{key}={_s(actual) or '(none)'} (want {_s(want)})"
        for op, raw in cond.items():
            value = render_value(raw, ctx)
            if op == "eq" and _s(actual) != _s(value):
                return f"{key}={_s(actual) or '(none)'} (want {_s(value)})"
            if op == "ne" and _s(actual) == _s(value):
                return f"{key}={_s(actual)} (must not be {_s(value)})"
            if op == "in" and _s(actual) not in [_s(v) for v in value]:
                return f"{key}={_s(actual) or '(none)'} (want one of {', '.join(map(_s, value))})"
            if op == "not_in" and _s(actual) in [_s(v) for v in value]:
                return f"{key}={_s(actual)} (must not be one of {', '.join(map(_s, value))})"
            if op == "regex" and not re.search(str(value), _s(actual)):
                return f"{key}={_s(actual) or '(none)'} (want match /{value}/)"
            if op == "present" and bool(actual not in (None, "", [], {})) != bool(value):
                return f"{key} {'missing' if value else 'present'}"
            if op in ("ge", "le"):
                try:
                    a, v = float(actual), float(value)
                except (TypeError, ValueError):
                    return f"{key}={_s(actual) or '(none)'} (not a number)"
                if (op == "ge" and a < v) or (op == "le" and a > v):
                    return f"{key}={_s(actual)} (want {'>=' if op == 'ge' else '<='} {_s(value)})"
            if op == "version":
                rng = self.playbook.matrix.get(self.hardware, {}).get(str(value))
                if rng is None:
                    return f"{key}: no {value} range for {self.hardware} in the playbook matrix"
                reason = check_range(_s(actual) or None, rng.min, rng.max)
                if reason:
                    return f"{key}: {reason}"
            if op == "min_version" and (reason := check_range(_s(actual) or None, _s(value), None)):
                return f"{key}: {reason}"
            if op == "max_version" and (reason := check_range(_s(actual) or None, None, _s(value))):
                return f"{key}: {reason}"
            if op not in ("eq", "ne", "in", "not_in", "regex", "present", "ge", "le", "version",
                          "min_version", "max_version"):
                return f"{key}: unknown expectation operator {op!r}"
        return None

    # ------------------------------------------------------------- cross-host
    def _finish_compares(self, nodes: list[Node]) -> None:
        for step in self.playbook.steps:
            if step.type != "compare":
                continue
            per_host = self._compare.get(step.name, {})
            host_value: dict[str, str] = {}
            for host in sorted(per_host):
                values = sorted({_s(v) for v in per_host[host].values()})
                if len(values) > 1:
                    detail = ", ".join(f"{label}={_s(v)}" for label, v in sorted(per_host[host].items()))
                    self._emit(StepResult(host, step.name, "fail",
                                          f"{step.field} differs between devices of this host: {detail}",
                                          cross_host=True))
                elif values:
                    host_value[host] = values[0]
            counts = Counter(host_value.values())
            if len(counts) <= 1:
                for host, value in host_value.items():
                    self._emit(StepResult(host, step.name, "ok", f"{step.field}={value} on all hosts",
                                          cross_host=True))
                continue
            ranked = counts.most_common()
            majority = ranked[0][0] if ranked[0][1] > ranked[1][1] else None
            spread = "; ".join(
                f"{v} on {', '.join(h for h, hv in sorted(host_value.items()) if hv == v)}" for v, _ in ranked)
            for host, value in sorted(host_value.items()):
                if majority is not None and value == majority:
                    self._emit(StepResult(host, step.name, "ok", f"{step.field}={value} (majority)", cross_host=True))
                else:
                    self._emit(StepResult(host, step.name, "fail",
                                          f"{step.field} differs across hosts: {spread}", cross_host=True))


def _not_run(command: str, step: Step) -> CommandResult:
    return CommandResult(command, None, "", "", 0.0, timed_out=True, not_run=True,
                         notes=[f"not run: the step's {step.timeout_s:g}s deadline on this host had passed"])


def _err(res: CommandResult, step: Step | None = None) -> str:
    """One line on why a command failed: the timeout and what the kill did, else rc and its first output line."""
    if res.not_run:
        return "; ".join(res.notes)
    if res.timed_out:
        limit = (f"timed out after {step.timeout_s:g}s (the step's deadline on this host)" if step is not None
                 else next((n for n in res.notes if n.startswith("timed out")), "timed out"))
        rest = [n for n in res.notes if not n.startswith("timed out")]
        fix = "; raise the step's timeout_s if the command is only slow" if step is not None else ""
        return "; ".join([limit, *rest]) + fix
    text = (res.stderr.strip() or res.stdout.strip()).splitlines()
    return f"rc={res.rc} " + (text[0][:200] if text else "")


def sudo_reason(stderr: str) -> str:
    """What sudo said when it refused: its own last ``sudo: ...`` line (a login shell's profile may print
    other lines to stderr first), else the last non-empty line; at most 120 characters."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    own = [ln for ln in lines if ln.startswith("sudo:")]
    return (own or lines or [""])[-1][:120]


def _first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:120] if lines else ""
