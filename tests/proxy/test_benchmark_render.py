"""The relay-cost benchmark's report (benchmarks/proxy_overhead.py ``render_relay``): one after another and all at once."""

from __future__ import annotations

import argparse

from benchmarks.proxy_overhead import render_relay


def _run(tok_per_cpu_s: float) -> dict[str, float]:
    return {"tok_s": 3500.0, "proxy_cpu_s": 1.0, "tok_per_cpu_s": tok_per_cpu_s, "lat_p50": 1.0, "lat_p99": 2.0,
            "errors": 0.0, "events_per_write": 1.0}


def _rel(concurrent: bool) -> dict:
    pairs = []
    for proxy, nginx in ((22_000.0, 30_000.0), (24_000.0, 30_000.0), (21_000.0, 30_000.0)):
        pairs.append({"nginx": _run(nginx), "proxy": _run(proxy), "pd_floor": _run(28_000.0), "floor": _run(29_000.0),
                      "ratio": proxy / nginx, "pd_floor_ratio": 28_000.0 / nginx})
    return {"streams": 128 if concurrent else 256, "gap": 0.032, "tokens": 256, "pairs": pairs,
            "concurrent": concurrent}


def _args() -> argparse.Namespace:
    return argparse.Namespace(loadavg="0.1 / 0.1 / 0.1", duration_s=8.0, repeats=3, relay_rate=8000.0)


def test_all_at_once_run_is_reported_as_such_with_its_own_rates():
    md = render_relay(_args(), _rel(True), None)
    assert md.startswith("## PD proxy relay cost vs nginx, all relays at once")
    assert "128 streams, token gap 32.0 ms (4000 tokens/s offered)" in md  # offered rate of each relay, not the flag's
    assert "The four relays run at once" in md and "per round: 0.73, 0.80, 0.70" in md
    assert "median **0.73x**" in md
    assert "Worker scaling" not in md


def test_one_after_another_run_keeps_its_wording():
    md = render_relay(_args(), _rel(False), None)
    assert md.startswith("## PD proxy relay cost vs nginx and worker scaling")
    assert "256 streams, token gap 32.0 ms (8000 tokens/s offered)" in md
    assert "Runs alternate nginx / proxy" in md and "per pair: 0.73, 0.80, 0.70" in md
