"""The processes a Plan needs on the local target: one simulator per instance, the proxy, the balancer.

Every simulated instance listens on its leader node's loopback address from
the inventory (127.0.1.x), so the addresses and ports are the Plan's own.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ascend_runtime.planner.plan import Plan

#: Seconds between balancer cycles on the local stack (simulated time runs faster).
LOCAL_BALANCE_INTERVAL_S = 5.0
PROXY_TOKEN_ENV = "ASCEND_PROXY_TOKEN"


@dataclass(frozen=True)
class ProcessSpec:
    """One process to start: a name, its kind, argv and the URL that answers 200 when ready."""

    name: str
    kind: str
    argv: tuple[str, ...]
    health_url: str


def _cli(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "ascend_runtime", *args)


def write_instances_file(plan: Plan, state_dir: Path) -> Path:
    """Write the instance list the proxy watches; returns its path."""
    path = state_dir / "instances.json"
    path.write_text(json.dumps({"instances": plan.endpoints()}, indent=2))
    return path


def local_processes(plan: Plan, state_dir: Path, stacks_dir: str | None = None) -> list[ProcessSpec]:
    """Simulators first (prefill, then decode), then the proxy, then the balancer."""
    if plan.target != "local":
        raise ValueError(f"stack {plan.stack} targets {plan.target!r}; the local launcher runs only target 'local' stacks")
    specs = []
    where = ("--stacks-dir", str(stacks_dir)) if stacks_dir else ()
    for inst in plan.instances:
        argv = _cli("sim", "--stack", plan.stack, *where, "--instance", inst.name)
        specs.append(ProcessSpec(inst.name, "simulator", argv, f"{inst.api_url}/health"))
    instances_file = state_dir / "instances.json"
    specs.append(
        ProcessSpec(
            "proxy",
            "proxy",
            _cli("proxy", "--host", plan.proxy_host, "--port", str(plan.proxy_port), "--instances-file", str(instances_file),
                 "--admin-token-env", PROXY_TOKEN_ENV),
            f"{plan.proxy_url}/health",
        )
    )
    decodes = plan.by_role("decode")
    if decodes:
        shape = decodes[0]
        balancer_port = plan.config["ports"]["balancer_metrics"]
        argv = ["balance", "serve", "--ranks", str(shape.ep), "--slots", str(shape.expert_slots_per_rank),
                "--interval", str(LOCAL_BALANCE_INTERVAL_S), "--publish-file", str(state_dir / "expert-map.json"),
                "--apply", "simulator", "--metrics-host", "127.0.0.1", "--metrics-port", str(balancer_port)]
        for inst in decodes:
            argv += ["--instance", f"{inst.name}={inst.api_url}"]
        specs.append(ProcessSpec("balancer", "balancer", _cli(*argv), f"http://127.0.0.1:{balancer_port}/metrics"))
    return specs
