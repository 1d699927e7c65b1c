"""Stopping a local stack's processes by their recorded identity, and telling what still serves.

:func:`stop_recorded` signals a recorded process group only when the pid is still the process `up` started
(:func:`ascend_runtime.local.identity.identify`: same start time and command line), and checks that again
before the SIGKILL. A pid that is gone, or is now another process, or was recorded without an identity, is
never signalled; whether the stack still serves is then read from the record's own port (its health URL):
an answer there means a process of the stack may still run, which the outcome says, naming the holder.
:func:`stack_ports_answering` does the same for a whole Plan when no state records it (lost or empty).
"""

from __future__ import annotations

from dataclasses import dataclass

from ascend_runtime.local.identity import Verdict, describe, identify
from ascend_runtime.local.processes import listener_inodes, listener_owner, process_line, stop_process_group
from ascend_runtime.local.state import ProcessRecord
from ascend_runtime.local.topology import listen_ports
from ascend_runtime.planner.plan import Plan


@dataclass(frozen=True)
class StopOutcome:
    """What stopping one record came to. ``down``: nothing of it runs any more (stopped now, or found gone
    with its port free); ``note``: what happened, in words for the report."""

    name: str
    down: bool
    note: str


def _answers(host: str, port: int) -> bool:
    """True when a listening socket accepts connections to host:port (read from the kernel's socket table,
    without connecting: a connection would reach the server as a request of its own)."""
    return bool(listener_inodes(host, port))


def _holder(host: str, port: int) -> str:
    owner = listener_owner(host, port)
    return f" (held by {process_line(owner)})" if owner else ""


def stop_recorded(record: ProcessRecord, grace_s: float = 5.0) -> StopOutcome:
    """Stop ``record``'s process group if, and only if, its pid is still the process `up` started."""
    verdict, now = identify(record.pid, record.start_time, record.expected_cmdline())
    if verdict is Verdict.SAME:
        def still_ours() -> bool:  # the leader may exit meanwhile (its group goes on); never a reused pid
            return identify(record.pid, record.start_time, record.expected_cmdline())[0] in (Verdict.SAME, Verdict.GONE)

        if stop_process_group(record.pid, grace_s, still_ours):
            return StopOutcome(record.name, True, "stopped")
        return StopOutcome(record.name, False, f"pid {record.pid} would not stop")
    if verdict is Verdict.GONE:
        why = f"recorded pid {record.pid} is gone"
    elif verdict is Verdict.OTHER and now is not None:
        why = f"recorded pid {record.pid} is now another process ({describe(now)}); not signalled"
    else:
        why = f"recorded pid {record.pid} shows no command line to compare, so it cannot be told from another process; not signalled"
    host, port = record.address()
    if _answers(host, port):
        return StopOutcome(record.name, False, f"{why}, but its port {host}:{port} still answers{_holder(host, port)}: "
                           "a process of the stack may still run; stop it yourself once you have checked it is the "
                           "stack's")
    return StopOutcome(record.name, True, f"{why}; its port {host}:{port} is free")


def stack_ports_answering(plan: Plan) -> list[str]:
    """One line per address of the Plan's local processes that answers now, with its stack key and holder."""
    return [f"{lp.describe()}{_holder(lp.host, lp.port)}" for lp in listen_ports(plan) if _answers(lp.host, lp.port)]
