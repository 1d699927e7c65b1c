"""CLI start-up: `ascend-deploy --version` and `--help` against bare interpreter start-up, side by side.

Goal: each under 0.3 s on an idle machine, checked as a ratio: median at most
``GOAL_RATIO`` times the median of ``python -c pass`` measured side by side
(bare start-up is 0.03-0.04 s on the idle 2-core machine, so 3x keeps 0.3 s
with room to spare; unlike the absolute time, the ratio holds under load).
Absolute times on the shared machine drift by 2x between runs, so every repetition times,
back to back in a rotating order, the reference ``python -c pass``, the two
command-free invocations, and ``build_parser()`` with every command module
imported (what every call paid before start-up was made lazy) for scale. The
table gives medians and the ratio of each to the reference; the exit status
checks the goal.

Run: python -m benchmarks.cli_startup [--repeats 21] [--write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

GOAL_S = 0.3
GOAL_RATIO = 3.0

CASES = {
    "python -c pass (reference)": [sys.executable, "-c", "pass"],
    "python -m ascend_runtime --version": [sys.executable, "-m", "ascend_runtime", "--version"],
    "python -m ascend_runtime --help": [sys.executable, "-m", "ascend_runtime", "--help"],
    "build_parser(): every command module imported (for scale)":
        [sys.executable, "-c", "from ascend_runtime.cli import build_parser; build_parser()"],
}
REFERENCE = "python -c pass (reference)"
GOALED = ("python -m ascend_runtime --version", "python -m ascend_runtime --help")


def time_once(argv: list[str]) -> float:
    """Wall seconds of one fresh process, output discarded; raises if it fails."""
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def measure(repeats: int) -> dict[str, list[float]]:
    """Per case, ``repeats`` wall times; cases interleaved (rotating order) so drift hits all alike."""
    names = list(CASES)
    times: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm the page cache and .pyc files
        time_once(CASES[name])
    for i in range(repeats):
        for name in names[i % len(names):] + names[: i % len(names)]:
            times[name].append(time_once(CASES[name]))
    return times


def markdown(times: dict[str, list[float]], repeats: int, load_before: tuple[float, float, float]) -> str:
    from benchmarks.report import machine_line  # noqa: PLC0415

    ref = statistics.median(times[REFERENCE])
    rows = []
    for name, values in times.items():
        med = statistics.median(values)
        goal = f"<= {GOAL_RATIO:g}x: {'ok' if med / ref <= GOAL_RATIO else 'MISSED'}" if name in GOALED else ""
        rows.append(f"| `{name}` | {med:.3f} | {min(values):.3f} | {med / ref:.2f} | {goal} |")
    load = " / ".join(f"{v:.1f}" for v in load_before)
    return "\n".join([
        "## CLI start-up",
        "",
        f"Command: `python -m benchmarks.cli_startup --repeats {repeats} --write`",
        "",
        f"Wall time of a fresh process, {repeats} repetitions per case, cases interleaved in rotating order; "
        f"{machine_line()}, load average before the run {load}. The guard in CI is structural "
        "(tests/cli/test_startup.py: no heavy module imported by `--version`, `--help`).",
        "",
        f"Goal: under {GOAL_S:g} s on an idle machine, checked as at most {GOAL_RATIO:g}x the reference "
        "(bare interpreter start-up) measured side by side.",
        "",
        "| invocation | median (s) | min (s) | median / reference | goal |",
        "|---|---|---|---|---|",
        *rows,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--write", action="store_true", help="write the cli_startup section of docs/benchmarks.md")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    load_before = os.getloadavg()
    times = measure(args.repeats)
    text = markdown(times, args.repeats, load_before)
    print(text)
    if args.write:
        from benchmarks.report import write_section  # noqa: PLC0415

        write_section("cli_startup", text)
    ref = statistics.median(times[REFERENCE])
    return 0 if all(statistics.median(times[name]) / ref <= GOAL_RATIO for name in GOALED) else 1


if __name__ == "__main__":
    sys.exit(main())
