"""ascend_runtime/allocator.py: after keep_freed_memory, repeated planning reuses the heap instead of faulting
pages in again. Page-fault counts (getrusage ru_minflt) do not depend on how busy the machine is."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PLAN_THREE_TIMES = """
import resource, sys
from ascend_runtime.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "on" else None
from ascend_runtime.balancer.placement import place_from_scratch
from ascend_runtime.balancer.trace import family_trace
hist = family_trace("random_walk", 8, layers=58, experts=256, seed=1)
place_from_scratch(hist[-1], 144, 2, history=hist)  # the first plan sizes the heap
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    place_from_scratch(hist[-1], 144, 2, history=hist)
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PLAN_THREE_TIMES, mode], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_planning_again_faults_no_pages_in_once_freed_memory_is_kept() -> None:
    applied, kept = _faults("on")
    _, default = _faults("off")
    assert applied == "True"
    assert default > 5000  # glibc's defaults hand the temporaries' pages back and fault them in again
    assert kept < default / 20, (kept, default)


def test_elsewhere_it_does_nothing_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from ascend_runtime import allocator

    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("musl", "1.2"))
    assert allocator.keep_freed_memory() is False
