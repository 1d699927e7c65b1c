"""Whether this host kept up during the local stack's throughput check, and who used its CPUs.

Two measurements taken around the check:

- the simulators' clock: each decode simulator publishes the modelled time
  of the steps it ran (``ascend_sim:step_modelled_seconds`` sum and count on
  ``/metrics``). A decode step gives every running sequence one token (plus
  the accepted MTP draft token), so on time the client's TPOT would be
  ``modelled step / speedup / tokens per step``. The *lag* is the measured
  TPOT over that: 1.0 means the simulators kept their sped-up clock; 5 means
  a step that models 15 ms of NPU time took 5x its 1.5 ms wall budget,
  because this host could not run the Python processes fast enough.
- the CPUs: busy time of the whole host (``/proc/stat``, including steal)
  and of the stack's own processes plus this one (``/proc/<pid>/stat``), so
  a lag can be put down to other work on the host or to the stack's own
  processes needing more CPU than the host has.

All figures are best effort: None where /proc or a simulator cannot tell.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

#: Above this lag the simulated latencies are bound by the host, not by the model.
HOST_BOUND_LAG = 2.0
#: Other processes using at least this share of the CPUs count as an overloaded host.
OTHERS_BUSY_SHARE = 0.25

_METRIC = re.compile(r"^ascend_sim:step_modelled_seconds_(sum|count)\{[^}]*\}\s+(\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class CpuSample:
    """Clock ticks (USER_HZ) at one moment: all CPUs, busy CPUs, the stack's processes; CPU count."""

    at: float
    total: int
    busy: int
    ours: int
    cpus: int


def _stat_ticks(pid: int | str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    # utime, stime, cutime, cstime are fields 14-17 of proc(5); here 0-based after the name
    return sum(int(v) for v in fields[11:15])


def cpu_sample(pids: Iterable[int]) -> CpuSample | None:
    """Host-wide and the given processes' CPU ticks now (this process included); None without /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    values = [int(v) for v in lines[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait; steal counts as busy
    total = sum(values[:8])  # guest time is already in user
    cpus = sum(1 for line in lines if re.match(r"cpu\d", line))
    ours = _stat_ticks("self") + sum(_stat_ticks(pid) for pid in set(pids) if pid != os.getpid())
    return CpuSample(time.monotonic(), total, total - idle, ours, cpus or (os.cpu_count() or 1))


@dataclass(frozen=True)
class CpuUse:
    """Average CPUs busy between two samples: by the stack (and `up`), by everything else; out of ``cpus``."""

    ours: float
    others: float
    cpus: int

    @classmethod
    def between(cls, before: CpuSample | None, after: CpuSample | None) -> CpuUse | None:
        """The CPU use between two samples, or None when either is missing or no time passed."""
        if before is None or after is None or after.total <= before.total:
            return None
        scale = after.cpus / (after.total - before.total)  # ticks -> CPUs busy on average
        ours = max(0.0, (after.ours - before.ours) * scale)
        busy = max(0.0, (after.busy - before.busy) * scale)
        return cls(ours=min(ours, busy), others=max(0.0, busy - ours), cpus=after.cpus)


def parse_step_totals(text: str) -> tuple[float, float] | None:
    """(modelled seconds, steps) from a simulator's /metrics text; None when absent."""
    found = dict(_METRIC.findall(text))
    if "sum" not in found or "count" not in found:
        return None
    return float(found["sum"]), float(found["count"])


def step_totals(urls: Iterable[str], timeout_s: float = 5.0) -> dict[str, tuple[float, float]]:
    """URL -> (modelled seconds, steps) of every simulator that answers /metrics."""
    import urllib.request  # noqa: PLC0415

    totals = {}
    for url in urls:
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=timeout_s) as resp:  # noqa: S310 - loopback URLs of the Plan
                parsed = parse_step_totals(resp.read().decode(errors="replace"))
        except (OSError, ValueError):
            continue
        if parsed:
            totals[url] = parsed
    return totals


def mean_modelled_step(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> float | None:
    """Mean modelled step (s) over the steps run between two :func:`step_totals`; None if none ran."""
    seconds = steps = 0.0
    for url, (s1, n1) in after.items():
        s0, n0 = before.get(url, (0.0, 0.0))
        seconds, steps = seconds + s1 - s0, steps + n1 - n0
    return seconds / steps if steps > 0 else None


@dataclass(frozen=True)
class HostLoad:
    """How the host fared during the throughput check."""

    #: measured TPOT / the TPOT the simulators' modelled steps give at ``speedup``; None if unknown
    lag: float | None
    modelled_step_ms: float | None
    cpu: CpuUse | None
    load_average: tuple[float, float, float] | None

    @property
    def host_bound(self) -> bool:
        """True when the simulators ran clearly behind their modelled clock."""
        return self.lag is not None and self.lag > HOST_BOUND_LAG

    @property
    def others_busy(self) -> bool:
        """True when processes outside the stack kept a notable share of the CPUs busy."""
        return self.cpu is not None and self.cpu.others >= OTHERS_BUSY_SHARE * self.cpu.cpus

    def cause(self) -> str:
        """Who kept the host busy, in words."""
        if self.cpu is None:
            return "this host could not run the simulators on time"
        use = f"other processes kept {self.cpu.others:.1f} and the stack {self.cpu.ours:.1f} of {self.cpu.cpus} CPUs busy"
        if self.others_busy:
            return f"the host is overloaded by other work ({use})"
        return f"the stack's own processes need more CPU than this host has at this speedup ({use})"

    def line(self, speedup: float) -> str | None:
        """The report line on the simulators' clock, or None when it could not be measured."""
        if self.lag is None or self.modelled_step_ms is None:
            return None
        wall_budget = self.modelled_step_ms / speedup
        text = (f"simulator clock: a decode step models {self.modelled_step_ms:.1f} ms, {wall_budget:.2f} ms wall at "
                f"speedup {speedup:g}x; the measured TPOT was {self.lag:.1f}x that")
        if self.host_bound:
            text += (f" -> latencies are bound by this host, not by the modelled NPUs: {self.cause()}"
                     f"; a lower simulator.speedup or an idle host gives modelled figures")
        elif self.cpu is not None:
            text += (f" (under {HOST_BOUND_LAG:g}x: the figures are the model's; other processes kept {self.cpu.others:.1f} "
                     f"and the stack {self.cpu.ours:.1f} of {self.cpu.cpus} CPUs busy)")
        return text


def load_average() -> tuple[float, float, float] | None:
    """os.getloadavg() where available."""
    try:
        return os.getloadavg()
    except OSError:
        return None
