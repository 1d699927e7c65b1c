"""The processes a Plan needs on the local target: one simulator per instance, the proxy, the balancer.

Every simulated instance listens on its leader node's loopback address from
the inventory (127.0.1.x), so the addresses and ports are the Plan's own; with
``serving: rank`` it listens on every DP rank's own API address (each on its
node's loopback address), and the proxy's instances.json lists those.

Two admin tokens guard the admin APIs: the proxy's (``PROXY_TOKEN_ENV``) and the
simulators' (``SIM_TOKEN_ENV``; the balancer applies expert maps with it). Each
process is given only the variables its :attr:`ProcessSpec.tokens` names.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ascend_runtime.files.write import write_file
from ascend_runtime.planner.plan import Plan

#: ProcessSpec kinds that serve a Plan instance (the proxy is ready only once these are).
ENGINE_KINDS = ("simulator", "vllm")
#: Seconds between balancer cycles on the local stack (simulated time runs faster).
LOCAL_BALANCE_INTERVAL_S = 5.0
PROXY_TOKEN_ENV = "ASCEND_PROXY_TOKEN"
SIM_TOKEN_ENV = "ASCEND_SIM_ADMIN_TOKEN"
#: Token variable -> the file in the state directory holding it (mode 0600, see runner.write_tokens).
TOKEN_FILES = {PROXY_TOKEN_ENV: "proxy-admin-token", SIM_TOKEN_ENV: "sim-admin-token"}


@dataclass(frozen=True)
class ProcessSpec:
    """One process to start: a name, its kind, argv, the URL that answers 200 when ready, and its tokens."""

    name: str
    kind: str
    argv: tuple[str, ...]
    health_url: str
    #: Token variables (keys of TOKEN_FILES) the process reads; it gets no others.
    tokens: tuple[str, ...] = ()
    #: Variables set for the process on top of the inherited environment, and inherited ones it must not see.
    env: tuple[tuple[str, str], ...] = ()
    unset: tuple[str, ...] = ()


@dataclass(frozen=True)
class ListenPort:
    """One address a local process listens on, and the stack key whose value sets the port."""

    host: str
    port: int
    key: str
    process: str

    def describe(self) -> str:
        """``port 18000 on 127.0.1.1 (ports.api_base, prefill-0 API)``."""
        return f"port {self.port} on {self.host} ({self.key}, {self.process})"


def _cli(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "ascend_runtime", *args)


def write_instances_file(plan: Plan, state_dir: Path) -> Path:
    """Write the instance list the proxy watches; returns its path."""
    return write_file(state_dir / "instances.json", json.dumps({"instances": plan.endpoints()}, indent=2))


def listen_ports(plan: Plan) -> list[ListenPort]:
    """Every address the local stack's processes bind, in start order, with the key that sets each port.

    Simulators bind their API port and their leader rank's KV port on the leader's loopback address (with
    ``serving: rank``, every DP rank's API port on its node's address);
    the proxy and the balancer's metrics bind 127.0.0.1-style addresses of their own keys. The keys
    are those of the planner's port ranges (ascend_runtime.planner.validation.port_ranges).
    """
    ports = []
    for inst in plan.instances:
        if inst.serving == "rank":  # the simulator listens on every DP rank's own API address
            ports.extend(ListenPort(ep.host, ep.port, "ports.api_base", f"{ep.name} API") for ep in inst.api_endpoints)
        else:
            ports.append(ListenPort(inst.api_host, inst.api_port, "ports.api_base", f"{inst.name} API"))
        ports.append(ListenPort(inst.api_host, inst.ranks[0].kv_port, "ports.kv_base", f"{inst.name} KV transfer"))
    ports.append(ListenPort(plan.proxy_host, plan.proxy_port, "ports.proxy", "proxy"))
    if plan.by_role("decode") and engine_kind(plan) == "simulator":
        ports.append(ListenPort("127.0.0.1", int(plan.config["ports"]["balancer_metrics"]), "ports.balancer_metrics",
                                "balancer metrics"))
    return ports


def simulator_spec(plan: Plan, name: str, stacks_dir: str | None = None, placed: bool = False) -> ProcessSpec:
    """The simulator of instance ``name`` (a running or, with ``pd_ratio: auto``, a standby instance).

    It reads its options from the stack's Plan when it starts (``sim --stack``); ``placed``: every option on
    its command line instead, from ``plan``, for a Plan the stack file alone does not give (the fault
    watcher's, with faulted nodes taken out and spares in their place: ``faults/spares_local.py``).
    """
    inst = plan.instance(name)
    if placed:
        from ascend_runtime.perf.from_plan import sim_config_from_plan  # noqa: PLC0415 - only a moved instance
        from ascend_runtime.perf.sim_flags import argv_from_config  # noqa: PLC0415

        options: tuple[str, ...] = tuple(argv_from_config(sim_config_from_plan(plan, inst)))
    else:
        where = ("--stacks-dir", str(stacks_dir)) if stacks_dir else ()
        options = ("--stack", plan.stack, *where, "--instance", inst.name)
    argv = _cli("sim", *options, "--admin-token-env", SIM_TOKEN_ENV)
    return ProcessSpec(inst.name, "simulator", argv, f"{inst.api_url}/health", (SIM_TOKEN_ENV,))


def real_engine_spec(plan: Plan, name: str) -> ProcessSpec:
    """vLLM's own server for instance ``name`` (``local_engine.kind: vllm-cpu``; ascend_runtime/local/vllm_engine/).
    The engine must be installed and the model generated (:func:`ascend_runtime.local.vllm_engine.prepare`)."""
    from ascend_runtime.local.vllm_engine import server  # noqa: PLC0415 - only for this engine
    from ascend_runtime.local.vllm_engine.install import engine_env  # noqa: PLC0415
    from ascend_runtime.local.vllm_engine.model import model_dir  # noqa: PLC0415

    inst = plan.instance(name)
    argv = server.server_argv(engine_env(), model_dir(int(plan.config["local_engine"]["model_seed"])),
                              str(plan.config["model"]["name"]), inst.api_host, inst.api_port,
                              int(plan.config[inst.role]["max_num_seqs"]))
    env = server.server_env(inst.api_host, inst.ranks[0].kv_port)
    return ProcessSpec(inst.name, "vllm", tuple(argv), f"{inst.api_url}/health", (),
                       tuple(env.items()), server.ISOLATED_VARIABLES)


def engine_kind(plan: Plan) -> str:
    """What serves the Plan's instances on the local target: ``simulator`` or ``vllm-cpu``."""
    return str(plan.config.get("local_engine", {}).get("kind", "simulator"))


def local_processes(plan: Plan, state_dir: Path, stacks_dir: str | None = None) -> list[ProcessSpec]:
    """Engines first (prefill, then decode), then the proxy, then (with simulated engines) the balancer."""
    if plan.target != "local":
        raise ValueError(f"stack {plan.stack} targets {plan.target!r}; the local launcher runs only target 'local' stacks")
    real = engine_kind(plan) == "vllm-cpu"
    specs = [real_engine_spec(plan, inst.name) if real else simulator_spec(plan, inst.name, stacks_dir)
             for inst in plan.instances]
    instances_file = state_dir / "instances.json"
    specs.append(
        ProcessSpec(
            "proxy",
            "proxy",
            _cli("proxy", "--host", plan.proxy_host, "--port", str(plan.proxy_port), "--instances-file", str(instances_file),
                 "--admin-token-env", PROXY_TOKEN_ENV),
            f"{plan.proxy_url}/health",
            (PROXY_TOKEN_ENV,),
        )
    )
    decodes = plan.by_role("decode")
    if decodes and not real:  # the balancer reads expert load from and applies maps to simulators
        shape = decodes[0]
        balancer_port = plan.config["ports"]["balancer_metrics"]
        argv = ["balance", "serve", "--ranks", str(shape.ep), "--slots", str(shape.expert_slots_per_rank),
                "--interval", str(LOCAL_BALANCE_INTERVAL_S), "--publish-file", str(state_dir / "expert-map.json"),
                "--apply", "simulator", "--sim-token-env", SIM_TOKEN_ENV,
                "--metrics-host", "127.0.0.1", "--metrics-port", str(balancer_port)]
        for inst in decodes:
            argv += ["--instance", f"{inst.name}={inst.api_url}"]
        # it reads load from and applies maps to the simulators; it never calls the proxy's admin API
        specs.append(ProcessSpec("balancer", "balancer", _cli(*argv), f"http://127.0.0.1:{balancer_port}/metrics",
                                 (SIM_TOKEN_ENV,)))
    return specs
