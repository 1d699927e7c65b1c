"""Keep freed heap memory in the process for numpy-heavy planning (glibc's malloc).

Expert placement (``balancer/placement.py``, ``selection.py``) works on batches of a few MB per array
(``[B, P]`` float64: 1392 trial problems x 288 slots at 144x2 is 3.2 MB) and makes many such
temporaries per plan. With glibc's defaults an allocation above the mmap threshold (128 KiB, raised
dynamically up to 32 MiB as large blocks are freed) is a fresh ``mmap``, and a free at the top of the
heap above the trim threshold is handed back to the kernel; either way the next temporary of that size
faults every 4 KiB page in again. On the 2-core VMs this project is developed on a page fault costs a few
microseconds, so a 3 MB temporary cost 2.5-3 ms to touch the first time against 0.2-0.4 ms when its memory
was reused, and planning at 144x2 spent 89-114 ms of CPU with the defaults against 51-64 ms with both
settings below (docs/balancer.md, "Planning time"). Either setting alone measured slower than the
defaults: setting one turns off glibc's dynamic threshold, so the other then returns or maps every block.

:func:`keep_freed_memory` sets, through ``mallopt(3)``:

- ``M_MMAP_THRESHOLD`` = 32 MiB, the largest glibc accepts on 64-bit (``HEAP_MAX_SIZE / 2``): blocks up
  to that size come from the heap;
- ``M_TRIM_THRESHOLD`` = 256 MiB: free memory at the top of the heap is returned to the kernel only
  beyond that, so a process keeps at most its peak heap plus 256 MiB.

It is called by the balancer's commands (``balance plan``, ``balance evaluate``, ``balance serve``), whose
processes plan and then exit or plan again on the same shapes. It changes only how memory is recycled,
never a result. Elsewhere (musl, macOS, Windows) it does nothing and says so.
"""

from __future__ import annotations

import ctypes
import platform

#: mallopt(3) parameter numbers (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: the values set (bytes)
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (module docstring) for this process.

    Returns True if both were set, False where the C library is not glibc or refused a value (the
    process then keeps the library's defaults)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)  # the running process's symbols, glibc's mallopt among them
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
