"""`ascend-deploy playbook`: run host playbooks (preflight, npu-network, facts) over SSH.

    ascend-deploy playbook list
    ascend-deploy playbook run NAME --stack STACK [--check] [--limit HOST]
        [--known-hosts FILE] [--accept-new-host-keys] [--json FILE]
        [--inventory FILE] [--vars FILE] [--var KEY=VALUE] [--forks N]

Exit codes: 0 every host passed, 1 a host failed (or was unreachable / refused),
2 invalid input (the message names the field).

Faults are reported per host, step and device and never end the run early:
known_hosts lines that cannot be used are warnings (printed once, and under
``warnings`` in ``--json``); a facts run keeps the entries of the devices whose
steps failed and writes everything else it read.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ascend_runtime.cli.stackargs import input_error, path_arg, path_type
from ascend_runtime.config.errors import ConfigError
from ascend_runtime.hosts import playbook as pb
from ascend_runtime.hosts.engine import Runner, RunReport, StepResult
from ascend_runtime.hosts.facts import (
    HOST_NOT_UPDATED,
    apply_facts,
    dump_inventory,
    failed_devices,
    write_if_changed,
)
from ascend_runtime.hosts.ssh import ConnectOptions, Endpoint
from ascend_runtime.hosts.stackref import read_stack

_STYLE = {"ok": "green", "changed": "yellow", "would_change": "cyan", "skip": "dim", "fail": "bold red"}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `playbook list` and `playbook run`."""
    parser = subparsers.add_parser("playbook", help="run host playbooks (preflight, npu-network, facts) over SSH")
    sub = parser.add_subparsers(dest="playbook_command", metavar="ACTION")

    lst = sub.add_parser("list", help="List the playbooks and the hardware kinds they apply to.")
    lst.add_argument("--playbooks-dir", type=path_type, default=None, help="Directory of playbook files.")
    lst.set_defaults(func=cmd_list)

    run = sub.add_parser("run", help="Run a playbook on the stack's hosts.")
    run.add_argument("name", help="Playbook name (see `playbook list`) or a playbook file path.")
    run.add_argument("--stack", required=True, help="Stack name (stacks/Pulumi.<stack>.yaml).")
    run.add_argument("--stacks-dir", type=path_type, default=None, help="Stacks directory (default $ASCEND_DEPLOY_STACKS or the project's stacks/).")
    run.add_argument("--check", action="store_true", help="Change nothing; show what would change.")
    run.add_argument("--limit", action="append", default=[], metavar="HOST",
                     help="Only these hosts (node name or address; repeat or comma-separate).")
    run.add_argument("--known-hosts", default=None, metavar="FILE", type=path_arg, help="known_hosts file (default: inventory ssh.known_hosts).")
    run.add_argument("--accept-new-host-keys", action="store_true",
                     help="Trust on first use: record unknown host keys in the known_hosts file (changed keys are still refused).")
    run.add_argument("--json", type=path_type, default=None, metavar="FILE", help="Also write the results as JSON.")
    run.add_argument("--inventory", type=path_type, default=None, metavar="FILE", help="Use this inventory instead of the stack's.")
    run.add_argument("--vars", type=path_type, default=None, metavar="FILE",
                     help="YAML with playbook variables: {all: {...}, hosts: {NODE: {...}}}.")
    run.add_argument("--var", action="append", default=[], metavar="KEY=VALUE", help="Set a playbook variable (YAML value).")
    run.add_argument("--forks", type=int, default=16, help="Hosts handled in parallel (default 16).")
    run.add_argument("--connect-retries", type=int, default=3, help="Connection attempts per host (default 3).")
    run.add_argument("--playbooks-dir", type=path_type, default=None, help="Directory of playbook files.")
    run.set_defaults(func=cmd_run)
    parser.set_defaults(func=lambda args: (parser.print_help(sys.stderr), 2)[1])


def cmd_list(args: argparse.Namespace) -> int:
    """Print the available playbooks."""
    from ascend_runtime.cli.stackargs import check_input_dir  # noqa: PLC0415

    bad = check_input_dir("--playbooks-dir", str(args.playbooks_dir) if args.playbooks_dir is not None else None)
    if bad is not None:
        return bad
    console = Console()
    table = Table("playbook", "hardware", "steps", "description")
    for name in pb.available(args.playbooks_dir):
        try:
            book = pb.load(name, args.playbooks_dir)
        except ConfigError as exc:
            console.print(f"[red]{escape(str(exc))}[/red]")
            return 2
        table.add_row(name, ", ".join(book.hardware), str(len(book.steps)), book.description)
    console.print(table)
    return 0


def _parse_vars(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``--vars FILE`` (``{all: {...}, hosts: {NODE: {...}}}``) and ``--var KEY=VALUE``; ConfigError naming the
    key path (``--vars.hosts.a2-node-01``) for a file that is not that shape."""
    from ascend_runtime.config.loader import parse_yaml, read_text  # noqa: PLC0415

    vars_all: dict[str, Any] = {}
    vars_hosts: dict[str, dict[str, Any]] = {}
    if args.vars:
        source = str(args.vars)
        data = parse_yaml(read_text(args.vars, "--vars"), "--vars", source,
                          lambda path: "--vars" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path))
        if not isinstance(data, dict) or set(data) - {"all", "hosts"}:
            extra = sorted(str(k) for k in data) if isinstance(data, dict) else []
            raise ConfigError.single("--vars", "must be a mapping with the keys all and hosts"
                                     + (f" (got {', '.join(extra)[:60]})" if extra else f" (got {type(data).__name__})"),
                                     hint="e.g. {all: {model_dir: /data/models/R1}, hosts: {a2-node-01: {...}}}",
                                     source=source)
        for key in ("all", "hosts"):
            if not isinstance(data.get(key) or {}, dict):
                raise ConfigError.single(f"--vars.{key}", f"must be a mapping, got {type(data[key]).__name__}",
                                         hint="write key: value lines", source=source)
        bad = [name for name, value in (data.get("hosts") or {}).items() if not isinstance(value or {}, dict)]
        if bad:
            raise ConfigError.single(f"--vars.hosts.{bad[0]}", "must be a mapping of that node's variables",
                                     hint="write key: value lines under the node's name", source=source)
        vars_all.update(data.get("all") or {})
        vars_hosts.update({str(name): dict(value or {}) for name, value in (data.get("hosts") or {}).items()})
    for item in args.var:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError.single("--var", "expected KEY=VALUE", item)
        try:  # the value is one YAML scalar, list or mapping
            vars_all[key] = parse_yaml(value, f"--var {key}") if value.strip() else ""
        except ConfigError as exc:
            if "empty" in exc.problems[0].message:  # only a comment: no value
                vars_all[key] = ""
                continue
            raise ConfigError([replace(p, hint="quote it if it is text, e.g. --var \"KEY='a: [b'\"")
                               for p in exc.problems]) from None
    return vars_all, vars_hosts


def _print_result(console: Console, r: StepResult) -> None:
    style = _STYLE.get(r.status, "")
    tag = " (cross-host)" if r.cross_host else ""
    console.print(f"[bold]{escape(r.host)}[/bold] {escape(r.step)}{tag}: [{style}]{r.status.upper()}[/{style}] "
                  f"{escape(r.message)}", highlight=False, soft_wrap=True)


def _summary(console: Console, report: RunReport, hosts: list[str]) -> None:
    table = Table(title=f"{report.playbook} on {report.hardware}" + (" (check)" if report.check else ""))
    table.add_column("host")
    for status in ("ok", "changed", "would_change", "skip", "fail"):
        table.add_column(status, justify="right")
    table.add_column("result")
    for host in hosts:
        rows = [r for r in report.results if r.host == host]
        counts = [sum(1 for r in rows if r.status == s) for s in ("ok", "changed", "would_change", "skip", "fail")]
        if host in report.unreachable:
            verdict = "[bold red]UNREACHABLE[/bold red]"
        else:
            verdict = "[bold red]FAILED[/bold red]" if counts[-1] else "[green]PASSED[/green]"
        table.add_row(escape(host), *map(str, counts), verdict)
    console.print(table)


#: Most hosts handled at once and connection attempts per host (each fork is a thread with an SSH connection).
MAX_FORKS = 1024
MAX_CONNECT_RETRIES = 100


def _check_run_options(args: argparse.Namespace) -> int | None:
    """Options of `playbook run` checked before anything runs (exit 2 naming the option, or None)."""
    from ascend_runtime.cli.stackargs import (  # noqa: PLC0415
        check_count,
        check_input_dir,
        check_input_file,
        check_output_file,
        first_error,
    )

    return first_error(
        check_input_dir("--playbooks-dir", str(args.playbooks_dir) if args.playbooks_dir is not None else None),
        check_input_dir("--stacks-dir", str(args.stacks_dir) if args.stacks_dir is not None else None),
        check_count("--forks", args.forks, 1, MAX_FORKS),
        check_count("--connect-retries", args.connect_retries, 1, MAX_CONNECT_RETRIES),
        check_output_file("--json", str(args.json) if args.json is not None else None),
        check_input_file("--vars", str(args.vars) if args.vars is not None else None),
        check_input_file("--inventory", str(args.inventory) if args.inventory is not None else None),
        check_input_file("--known-hosts", args.known_hosts)
        if args.known_hosts is not None and Path(args.known_hosts).exists() else None,  # --accept-new-host-keys creates it
    )


def _read_inventory(path: Path, explicit: bool) -> Any:
    """The inventory a run uses: the file checks of the loader and at least one node.

    With ``--inventory FILE`` (``explicit``) every problem names the option and the key inside the file
    (``--inventory.nodes[0].host_ip``) under the file's name. Facts that contradict the stack's hardware
    (``vnic_ip`` on Atlas A2) are left to the runner, which refuses those hosts and runs the others."""
    from ascend_runtime.config.loader import read_inventory  # noqa: PLC0415

    try:
        inventory = read_inventory(path)
        if not inventory.nodes:
            raise ConfigError.single("inventory.nodes", "the inventory has no nodes", hint="list the stack's hosts",
                                     source=str(path))
    except ConfigError as exc:
        if not explicit:
            raise
        raise ConfigError([replace(p, path="--inventory" + p.path.removeprefix("inventory")) for p in exc.problems],
                          exc.source or str(path)) from None
    return inventory


def cmd_run(args: argparse.Namespace) -> int:
    """Run a playbook; 0 all hosts passed, 1 a host failed, 2 invalid input."""
    console = Console(highlight=False)
    bad = _check_run_options(args)
    if bad is not None:  # before any playbook, stack or host is read
        return bad
    try:
        book = pb.load(args.name, args.playbooks_dir)
        stack = read_stack(args.stack, args.stacks_dir)
        if stack.hardware not in book.hardware:
            raise ConfigError.single("config.ascend-deepseek:hardware", f"playbook {book.name} does not apply",
                                     stack.hardware, hint=f"it applies to {', '.join(book.hardware)}")
        inventory_path = args.inventory or stack.inventory_path
        inventory = _read_inventory(inventory_path, explicit=args.inventory is not None)
        limit = [h for item in args.limit for h in item.split(",") if h]
        known = {n.name for n in inventory.nodes} | {str(n.host_ip) for n in inventory.nodes} | {
            n.ssh_host for n in inventory.nodes if n.ssh_host}
        unknown = [h for h in limit if h not in known]
        if unknown:
            raise ConfigError.single("--limit", "no such host in the inventory", ", ".join(unknown))
        vars_all, vars_hosts = _parse_vars(args)
        vars_all = {**stack.variables, **vars_all}
        bad_hosts = sorted(set(vars_hosts) - {n.name for n in inventory.nodes})
        if bad_hosts:
            raise ConfigError.single("--vars.hosts", "no such node in the inventory", ", ".join(bad_hosts))
        if args.forks < 1:
            raise ConfigError.single("--forks", "must be at least 1", args.forks)
        ssh = inventory.ssh
        jump = Endpoint.parse(ssh.jump_host, ssh.user) if ssh.jump_host else None
    except ConfigError as exc:
        console.print(f"[red]{escape(str(exc))}[/red]", soft_wrap=True)
        return 2
    except ValueError as exc:
        console.print(f"[red]invalid input: {escape(str(exc))}[/red]", soft_wrap=True)
        return 2

    opts = ConnectOptions(
        known_hosts=args.known_hosts or ssh.known_hosts,
        accept_new=args.accept_new_host_keys,
        key_file=ssh.key_file,
        jump=jump,
        connect_timeout_s=ssh.connect_timeout_s,
        retries=max(1, args.connect_retries),
        sudo=ssh.sudo,
    )
    lock = threading.Lock()

    def on_result(r: StepResult) -> None:
        with lock:
            _print_result(console, r)

    def on_warning(text: str) -> None:
        with lock:
            console.print(f"[yellow]warning:[/yellow] {escape(text)}", highlight=False, soft_wrap=True)

    runner = Runner(book, inventory, stack.hardware, opts, check=args.check, forks=args.forks,
                    vars_all=vars_all, vars_hosts=vars_hosts, on_result=on_result, on_warning=on_warning)
    console.print(f"[bold]playbook {book.name}[/bold] on stack {args.stack} ({stack.hardware}), "
                  f"inventory {inventory_path}" + (" [cyan](check mode: nothing is changed)[/cyan]" if args.check else ""))
    report = runner.run(limit or None)

    extra: dict[str, Any] = {}
    if book.facts is not None:
        new_inventory, problems = apply_facts(inventory, report, book.facts, stack.hardware)
        kept: dict[str, list[int]] = {}
        for node in inventory.nodes:
            devices = failed_devices(report, node.name) if node.name in report.facts else None
            if devices:
                kept[node.name] = sorted(devices)
                console.print(f"[bold]{escape(node.name)}[/bold] inventory facts: device(s) "
                              f"{', '.join(map(str, sorted(devices)))} not updated (their steps failed; an existing "
                              f"entry is kept); the host's other facts are written", highlight=False, soft_wrap=True)
        extra["inventory_kept_devices"] = kept
        for host, issues in sorted(problems.items()):
            if issues != [HOST_NOT_UPDATED]:
                on_result(StepResult(host, "inventory facts", "fail", "; ".join(issues)))
                report.results.append(StepResult(host, "inventory facts", "fail", "; ".join(issues)))
        from ascend_runtime.files.read import INVENTORY, FileRefused, read_text  # noqa: PLC0415

        try:  # read and checked above; read again through the door in case it was replaced meanwhile
            current = read_text(Path(inventory_path), INVENTORY)
            text = dump_inventory(new_inventory, current)
            if args.check:
                extra["inventory_would_change"] = text != current
                console.print(f"inventory {inventory_path}: " + ("would change" if text != current else "unchanged"))
            else:
                written = write_if_changed(Path(inventory_path), text)
                extra["inventory_written"] = written
                console.print(f"inventory {inventory_path}: " + ("written" if written else "unchanged (no byte changed)"))
        except FileRefused as exc:
            return input_error("inventory", f"{exc}; the facts were not written")

    hosts = [n.name for n in inventory.nodes if not limit or n.name in limit or str(n.host_ip) in limit
             or (n.ssh_host and n.ssh_host in limit)]
    _summary(console, report, hosts)
    if args.json:
        data = report.to_json() | extra | {"stack": args.stack, "inventory": str(inventory_path)}
        from ascend_runtime.files.write import write_file  # noqa: PLC0415

        write_file(args.json, json.dumps(data, indent=2, sort_keys=True) + "\n")  # never through a planted link
    failed = report.failed_hosts()
    if failed:
        console.print(f"[bold red]failed hosts: {escape(', '.join(failed))}[/bold red]")
        return 1
    return 0
