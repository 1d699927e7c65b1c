"""How many PD proxy workers and replicas a stack needs: its expected token rate over the measured relay cost.

Every decoded token reaches the client through the proxy (one SSE event per
token at the engine's streaming granularity), so the proxy's load is the
stack's output token rate:

    capacity tokens/s = sum over decode instances of dp x b x (1 + a) / step(b)
                        b: the largest batch per DP rank within slo.tpot_ms
                           (perf.model.max_decode_batch at the throughput check's
                           mean context, input_len + output_len / 2), a: MTP acceptance
    demand tokens/s   = slo.expected_request_rate x throughput_check.output_len
    token rate        = demand when the stack gives an expected rate, capped at capacity;
                        else capacity (the proxy must not be what limits the engines)
    workers           = perf.proxy_capacity.workers_needed(token rate)
                        (RELAY_TOKENS_PER_CPU_S per worker process at TARGET_UTILISATION of a core)
    replicas          = max(kubernetes.proxy_replicas,
                            ceil(workers / MAX_WORKERS_PER_REPLICA) + 1)   one replica may be down
    workers/replica   = ceil(workers / (replicas - 1)) (replicas - 1 carry the rate), 1 replica: workers

Units: tokens/s, processes (one core each), pods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ascend_runtime.planner.plan import Plan

#: Worker processes one proxy pod runs at most (cores a pod asks for; more replicas beyond this).
MAX_WORKERS_PER_REPLICA = 8


@dataclass(frozen=True)
class ProxyPlan:
    """Proxy sizing of a stack (see the module docstring for the formulas).

    ``capacity_tokens_per_s``: what the decode instances can emit within the TPOT SLO;
    ``demand_tokens_per_s``: from ``slo.expected_request_rate`` (None without it);
    ``tokens_per_s``: the rate the proxy is sized for; ``relay_tokens_per_cpu_s``: the measured cost it
    uses; ``workers``: worker processes in all; ``replicas`` x ``workers_per_replica``: the Deployment.
    """

    capacity_tokens_per_s: float
    demand_tokens_per_s: float | None
    tokens_per_s: float
    relay_tokens_per_cpu_s: float
    workers: int
    replicas: int
    workers_per_replica: int

    def describe(self) -> str:
        """One line for ``ascend-deploy plan``."""
        expected = (f"expected {self.demand_tokens_per_s:,.0f}, " if self.demand_tokens_per_s is not None
                    else "no slo.expected_request_rate, ")
        return (f"proxy: sized for {self.tokens_per_s:,.0f} output tok/s ({expected}decode capacity "
                f"{self.capacity_tokens_per_s:,.0f}) at {self.relay_tokens_per_cpu_s:,.0f} tok per CPU-s: "
                f"{self.workers} worker(s) needed; {self.replicas} replica(s) x {self.workers_per_replica} worker(s) = "
                f"{self.replicas * self.workers_per_replica} worker(s) in all"
                + (" (the rate fits with one replica down)" if self.replicas > 1 else ""))


def decode_capacity_tokens_per_s(plan: Plan) -> float:
    """Output tokens/s the Plan's decode instances emit at the largest batch within ``slo.tpot_ms``."""
    from ascend_runtime.perf import model
    from ascend_runtime.perf.from_plan import stage_shape

    if not plan.by_role("decode"):
        return 0.0
    shape = stage_shape(plan, "decode")
    check = plan.config.get("throughput_check") or {}
    context = float(check.get("input_len", 2048)) + float(check.get("output_len", 2048)) / 2.0
    tpot_s = float((plan.config.get("slo") or {}).get("tpot_ms", 100.0)) / 1000.0
    batch = model.max_decode_batch(shape, context, tpot_s)
    if batch < 1:  # nothing meets the SLO: size for the smallest batch the instance runs
        batch = 1
    per_instance = model.decode_tokens_per_s_per_npu(shape, batch, context) * shape.npus
    return per_instance * len(plan.by_role("decode"))


def size_proxy(plan: Plan) -> ProxyPlan:
    """The :class:`ProxyPlan` of ``plan``."""
    from ascend_runtime.perf import proxy_capacity

    cap = decode_capacity_tokens_per_s(plan)
    rate = (plan.config.get("slo") or {}).get("expected_request_rate")
    demand = None
    if rate:
        out_len = float((plan.config.get("throughput_check") or {}).get("output_len", 2048))
        demand = float(rate) * out_len
    tokens = min(demand, cap) if demand is not None else cap
    workers = proxy_capacity.workers_needed(tokens)
    configured = int((plan.config.get("kubernetes") or {}).get("proxy_replicas", 2))
    replicas = max(configured, math.ceil(workers / MAX_WORKERS_PER_REPLICA) + 1)
    per_replica = workers if replicas == 1 else math.ceil(workers / (replicas - 1))
    return ProxyPlan(cap, demand, tokens, proxy_capacity.RELAY_TOKENS_PER_CPU_S, workers, replicas, per_replica)
