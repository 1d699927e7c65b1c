"""How many API server processes a decode instance's leader runs: its output token target over the
measured front-end capacity (:mod:`ascend_runtime.perf.frontend_capacity`).

    streams          = dp x max_num_seqs                  every sequence slot of the instance
    target tokens/s  = streams / (slo.tpot_ms / 1000)    every slot emitting at the TPOT target
    capacity/process = API_SERVER_TOKENS_PER_CPU_S x HOST_CORE_FACTOR x TARGET_UTILISATION
    processes        = ceil(target / capacity/process), at least 1
    margin           = processes x capacity/process / target - 1   (headroom at the target)

With ``serving: rank`` every DP rank has its own API server (vLLM's external load-balancer mode), so the
same formulas size one rank: streams = max_num_seqs, and ``processes`` is per rank.

An explicit ``decode.api_server_count`` below ``processes`` is refused (planner/validation.py): the Plan
never renders a front end the measurement says cannot carry the target. Prefill answers one token per
request, so its front end is sized by request rate (render/engine_args.py).

Units: tokens/s, streams, processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascend_runtime.config.errors import Problem
from ascend_runtime.perf import frontend_capacity

#: TPOT target (ms) when a stack gives no ``slo.tpot_ms`` (the stack model's default)
DEFAULT_TPOT_MS = 100.0


@dataclass(frozen=True)
class FrontEnd:
    """The front end of one decode instance (see the module docstring for the formulas)."""

    streams: int
    target_tokens_per_s: float
    tokens_per_server: float
    needed: int
    count: int
    per_rank: bool = False  #: ``serving: rank``: the figures are one DP rank's and its own API server(s)

    @property
    def margin(self) -> float:
        """Capacity of ``count`` processes over the target, minus 1 (0.25 = 25% headroom)."""
        return self.count * self.tokens_per_server / self.target_tokens_per_s - 1.0 if self.target_tokens_per_s else 0.0

    def describe(self, role: str = "decode") -> str:
        """One line for ``ascend-deploy plan``."""
        unit = "DP rank (rank serving: an API server per rank)" if self.per_rank else "instance"
        return (f"{role} front end: {self.streams:,} streams at the TPOT target = {self.target_tokens_per_s:,.0f} "
                f"output tok/s per {unit}; one API server process is planned for {self.tokens_per_server:,.0f} "
                f"tok/s ({frontend_capacity.API_SERVER_TOKENS_PER_CPU_S:,.0f} per CPU-second measured, docs/benchmarks.md, "
                f"x {frontend_capacity.HOST_CORE_FACTOR:g} host core x {frontend_capacity.TARGET_UTILISATION:g} of a core): "
                f"{self.needed} needed, {self.count} rendered (--api-server-count), margin {self.margin:+.0%}")


def decode_front_end(config: dict[str, Any]) -> FrontEnd | None:
    """The :class:`FrontEnd` of the stack's decode instances (``config``: the stack's resolved config, as
    ``Plan.config``), None without a decode stage."""
    stage = config.get("decode")
    if not stage or not stage.get("instances"):
        return None
    per_rank = config.get("serving") == "rank"
    streams = int(stage["max_num_seqs"]) * (1 if per_rank else int(stage["dp"]))
    tpot_s = float((config.get("slo") or {}).get("tpot_ms") or DEFAULT_TPOT_MS) / 1000.0
    target = streams / tpot_s
    needed = frontend_capacity.servers_needed(target)
    explicit = stage.get("api_server_count")
    return FrontEnd(streams, target, frontend_capacity.tokens_per_server(), needed,
                    int(explicit) if explicit else needed, per_rank)


def check_front_end(config: dict[str, Any]) -> list[Problem]:
    """An explicit ``decode.api_server_count`` below what the measured capacity needs is refused."""
    front = decode_front_end(config)
    if front is None or front.count >= front.needed:
        return []
    return [Problem(
        "decode.api_server_count",
        f"{front.count} API server process(es) carry {front.count * front.tokens_per_server:,.0f} output tok/s, below "
        f"the decode {'DP rank' if front.per_rank else 'instance'}'s target of {front.target_tokens_per_s:,.0f} "
        f"({front.streams:,} streams at "
        f"slo.tpot_ms; one process carries {front.tokens_per_server:,.0f}, measured: docs/benchmarks.md)",
        front.count, f"set decode.api_server_count to {front.needed} or more, or leave it out to have it sized")]
