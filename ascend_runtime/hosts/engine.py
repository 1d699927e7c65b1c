"""Run a playbook over the inventory's hosts: a bounded pool, one SSH session per host.

Each host runs every step in order in its own worker; a failing step or an
unreachable host never stops the other hosts. Results are handed to
``on_result`` as they arrive (from worker threads, serialised by a lock).
``compare`` steps are evaluated once all hosts are done, since they need
every host's value.
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
from ascend_runtime.hosts.ssh import CommandResult, ConnectOptions, Endpoint, HostKeyError, Session, SshError
from ascend_runtime.hosts.versions import check_range

DEVICES_PER_NODE = {"atlas-800i-a2": 8, "cm384": 16}
CHIPS_PER_CARD = {"atlas-800i-a2": 1, "cm384": 2}

#: Step statuses; ``fail`` fails the host (and the run).
STATUSES = ("ok", "changed", "would_change", "skip", "fail")


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


@dataclass
class RunReport:
    """Everything a run produced."""

    playbook: str
    hardware: str
    check: bool
    results: list[StepResult] = field(default_factory=list)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)

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
        self._lock = threading.Lock()
        self._compare: dict[str, dict[str, dict[str, Any]]] = {}

    # ----------------------------------------------------------------- running
    def run(self, limit: list[str] | None = None) -> RunReport:
        """Run on every node (or the ``limit`` names / addresses); return the report."""
        report = RunReport(self.playbook.name, self.hardware, self.check)
        nodes = [n for n in self.inventory.nodes if not limit or n.name in limit or str(n.host_ip) in limit
                 or (n.ssh_host and n.ssh_host in limit)]
        self._report = report
        with ThreadPoolExecutor(max_workers=min(self.forks, max(1, len(nodes)))) as pool:
            list(pool.map(self._run_host, nodes))
        self._finish_compares(nodes)
        return report

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
        session = Session(self._endpoint(node), self.connect)
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
        try:
            ctx = self._host_context(node)
            for step in self.playbook.steps:
                if step.hardware and self.hardware not in step.hardware:
                    continue
                t0 = time.monotonic()
                try:
                    result = self._run_step(session, node, step, ctx, facts)
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
                  facts: dict[str, Any]) -> StepResult:
        outcomes: list[tuple[str, str, str]] = []  # (status, label, message)
        active: list[_Unit] = []
        for unit in self._units(node, step, ctx):
            if any(not unit.ctx.get(name) for name in step.when):
                outcomes.append(("skip", unit.label, "not applicable"))
            else:
                active.append(unit)
        if step.type == "set":
            # read every device's current value in one exec; set (and re-read) only where it differs
            gets = (self._run_batch(session, step, [render(step.get or "", u.ctx) for u in active])
                    if len(active) > 1 else [None] * len(active))
            evaluated = [(u, self._run_set(session, step, u.ctx, g)) for u, g in zip(active, gets)]
        elif len(active) > 1:
            results = self._run_batch(session, step, [self._unit_command(step, u.ctx) for u in active])
            evaluated = [(u, self._evaluate(step, u.ctx, r)) for u, r in zip(active, results)]
        else:
            evaluated = [(u, self._evaluate(step, u.ctx, session.run(self._unit_command(step, u.ctx),
                                                                      timeout_s=step.timeout_s, become=step.become)))
                         for u in active]
        for unit, (status, message, parsed) in evaluated:
            outcomes.append((status, unit.label, message))
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

    def _run_batch(self, session: Session, step: Step, commands: list[str]) -> list[CommandResult]:
        """Run the per-device commands of one step in one SSH exec (stderr merged into stdout).

        Each command runs in its own subshell between random markers, so one
        device's output or exit status can never be taken for another's.
        """
        token = secrets.token_hex(8)
        script = "; ".join(
            f"printf '\\n@@{token} {i}@@\\n'; ( {cmd} ) 2>&1; printf '\\n@@{token} rc %s@@\\n' \"$?\""
            for i, cmd in enumerate(commands)
        )
        res = session.run(script, timeout_s=step.timeout_s * len(commands), become=step.become)
        found: dict[str, str] = {}
        rcs: dict[str, str] = {}
        for idx, body, rc in re.findall(rf"\n@@{token} (\d+)@@\n(.*?)\n@@{token} rc (\d+)@@", res.stdout, re.S):
            found[idx], rcs[idx] = body, rc
        out = []
        for i, cmd in enumerate(commands):
            if str(i) in found:
                out.append(CommandResult(cmd, int(rcs[str(i)]), found[str(i)], "", res.duration_s))
            else:
                why = "timed out" if res.timed_out else f"batch ended early: {_err(res)}"
                out.append(CommandResult(cmd, None, "", why, res.duration_s, timed_out=res.timed_out))
        return out

    def _unit_command(self, step: Step, ctx: dict[str, Any]) -> str:
        if step.type == "file":
            return "cat -- " + render("{_path}", {"_path": render(step.path or "", ctx, shell=False)})
        return render(step.command or "", ctx)

    def _evaluate(self, step: Step, ctx: dict[str, Any], res: CommandResult) -> tuple[str, str, dict | None]:
        if step.type == "file":
            if not res.ok:
                return "fail", f"cannot read {render(step.path or '', ctx, shell=False)}: {_err(res)}", None
            observed = (PARSERS[step.parser] if step.parser else key_value_file)(res.stdout)
        elif step.type == "command":
            observed = {"rc": res.rc, "stdout": res.stdout.strip(), "stderr": res.stderr.strip()}
            problems = self._check(observed, step.expect or {"rc": 0}, ctx)
            if problems:
                return "fail", "; ".join(problems) + f" from `{res.command}`: {_err(res)}", observed
            return "ok", _first_line(res.stdout) or "rc=0", observed
        else:
            if res.timed_out or (not step.ignore_rc and "rc" not in step.expect and not res.ok):
                return "fail", f"command failed: {_err(res)}", None
            observed = PARSERS[step.parser or "raw"](res.stdout)
            observed.setdefault("rc", res.rc)
        problems = self._check(observed, step.expect, ctx)
        if problems:
            return "fail", "; ".join(problems), observed
        return "ok", self._summary(step, observed), observed

    @staticmethod
    def _aggregate(host: str, step: Step, outcomes: list[tuple[str, str, str]]) -> StepResult:
        def line(label: str, msg: str) -> str:
            return f"{label}: {msg}" if label else msg

        for status in ("fail", "changed", "would_change"):
            hits = [line(label, msg) for s, label, msg in outcomes if s == status]
            if hits:
                return StepResult(host, step.name, status, "; ".join(hits[:4]) + (" ..." if len(hits) > 4 else ""),
                                  details=hits)
        oks = [line(label, msg) for s, label, msg in outcomes if s == "ok"]
        if oks:
            n = len(oks)
            msg = oks[0] if n == 1 else f"{n} {'devices' if step.foreach == 'device' else 'checks'} ok"
            return StepResult(host, step.name, "ok", msg, details=oks)
        return StepResult(host, step.name, "skip", "not applicable")

    def _run_cmd(self, session: Session, step: Step, template: str, ctx: dict[str, Any]):
        return session.run(render(template, ctx), timeout_s=step.timeout_s, become=step.become)

    def _summary(self, step: Step, observed: dict[str, Any]) -> str:
        keys = list(step.expect) or ([step.field] if step.field else [])
        return ", ".join(f"{k}={_get(observed, k)}" for k in keys) or "ok"

    def _run_set(self, session: Session, step: Step, ctx: dict[str, Any],
                 first_get: CommandResult | None = None) -> tuple[str, str, dict | None]:
        parser = PARSERS[step.parser or "raw"]
        want = {k: _s(render_value(v, ctx)) for k, v in step.want.items()}
        prefetched = [first_get] if first_get is not None else []

        def diff() -> tuple[dict[str, tuple[str, str]], dict | None, str]:
            res = prefetched.pop() if prefetched else self._run_cmd(session, step, step.get or "", ctx)
            if res.timed_out:
                return {}, None, f"get timed out: {_err(res)}"
            current = parser(res.stdout)
            return {k: (_s(_get(current, k)), w) for k, w in want.items() if _s(_get(current, k)) != w}, current, ""

        changes, current, err = diff()
        if err:
            return "fail", err, None
        if not changes:
            return "ok", "unchanged (" + ", ".join(f"{k}={w}" for k, w in want.items()) + ")", current
        text = ", ".join(f"{k} {c or '(unset)'} -> {w}" for k, (c, w) in changes.items())
        if self.check:
            return "would_change", f"would set {text}", current
        res = self._run_cmd(session, step, step.set or "", ctx)
        if not res.ok:
            return "fail", f"set failed ({text}): {_err(res)}", current
        left, current, err = diff()
        if err or left:
            still = err or ", ".join(f"{k}={c} (want {w})" for k, (c, w) in left.items())
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


def _err(res: Any) -> str:
    text = (res.stderr.strip() or res.stdout.strip()).splitlines()
    return f"rc={res.rc} " + (text[0] if text else "")


def _first_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[0][:120] if lines else ""
