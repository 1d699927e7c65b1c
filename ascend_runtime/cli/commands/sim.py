"""`ascend-deploy sim`: run one simulated vLLM-Ascend prefill or decode instance.

Options map one to one onto :class:`ascend_runtime.perf.sim_config.SimConfig`
(``config_from_args``); a later ``--stack NAME`` only has to build that
object from the Plan. Exit codes: 0 stopped cleanly, 2 invalid options.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from pydantic import ValidationError

from ascend_runtime.config.errors import MAX_SIM_SPEEDUP
from ascend_runtime.perf.sim_config import SimConfig


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `sim` sub-command."""
    from ascend_runtime.cli.stackargs import path_arg  # noqa: PLC0415 - only when `sim` runs

    p = subparsers.add_parser("sim", help="run an engine simulator (a vLLM-Ascend instance without NPUs)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", help="Take every option of --instance from this stack's Plan (explicit flags are then ignored).")
    p.add_argument("--stacks-dir", type=path_arg, help="Stacks directory for --stack (default: the project's stacks/).")
    p.add_argument("--bind-host", help="With --stack: listen here (e.g. 0.0.0.0 in a pod) instead of the leader's host IP.")
    p.add_argument("--role", choices=["prefill", "decode"], help="Required without --stack.")
    p.add_argument("--instance", required=True, help="Instance name (x-instance header, engine id prefix).")
    p.add_argument("--host", default="127.0.0.1", help="Listen address of the API and KV ports (default 127.0.0.1).")
    p.add_argument("--port", type=int, help="Required without --stack.")
    p.add_argument("--kv-port", type=int, help="KV transfer TCP port. Required without --stack.")
    p.add_argument("--kv-host", default=None, help="Host announced in kv_transfer_params (default: --host).")
    p.add_argument("--hardware", choices=["atlas-800i-a2", "cm384"], default="atlas-800i-a2")
    for flag in ("npus", "dp", "tp", "ep", "nodes"):
        p.add_argument(f"--{flag}", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None, help="Per DP rank.")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="Per DP rank.")
    p.add_argument("--redundant-experts", type=int, default=0)
    p.add_argument("--mtp", action="store_true", help="One MTP layer (90%% draft acceptance).")
    p.add_argument("--speedup", type=float, default=1.0, help="Divides every modelled time (default 1; 0.001 to 1000).")
    p.add_argument("--startup-delay", type=float, default=0.0, help="Wall seconds /health answers 503.")
    p.add_argument("--link-gbps", type=float, default=None, help="PD KV link rate, Gbit/s (default by hardware).")
    p.add_argument("--kv-timeout-s", type=float, default=120.0, help="Prefill frees unpulled KV after this.")
    p.add_argument("--kv-wire-scale", type=float, default=1.0 / 1024,
                   help="Fraction of the modelled KV bytes really sent (default 1/1024).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="deepseek-ai/DeepSeek-R1")
    p.add_argument("--expert-map", default=None, type=path_arg, help="vLLM-Ascend expert map JSON applied at start.")
    # vLLM 0.23.0's flag names (vllm/engine/arg_utils.py; prefix caching on by default, CacheConfig in
    # vllm/config/cache.py); vLLM-Ascend sets the block size to 128 (refresh_block_size, vllm_ascend/utils.py, v0.23.0)
    p.add_argument("--block-size", type=int, default=128, help="KV block size in tokens (default 128, as vLLM-Ascend).")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="Automatic prefix caching per DP rank (default on, as vLLM 0.23.0).")
    p.add_argument("--rank-endpoints", metavar="HOST:PORT,...", default=None,
                   help="Rank serving: each DP rank's own API address, in rank order (one per DP rank; a request to "
                        "rank r's is admitted to DP rank r only, and its /metrics has rank r's series). Without it "
                        "one server on --host:--port serves the whole instance.")
    p.add_argument("--admin-token-env", metavar="VAR",
                   help="Environment variable holding the /admin bearer token; without it every /admin call is refused.")
    p.set_defaults(func=handler)


def config_from_plan(args: argparse.Namespace) -> SimConfig:
    """The SimConfig of ``--instance`` in the ``--stack`` Plan; ValueError naming the problem."""
    from ascend_runtime.config.errors import ConfigError
    from ascend_runtime.planner import load_plan
    from ascend_runtime.perf.from_plan import sim_config_from_plan

    try:
        plan = load_plan(args.stack, args.stacks_dir)
    except ConfigError as exc:
        raise ValueError(f"--stack {args.stack}: {exc}") from None
    if plan.target not in ("local", "kind"):
        raise ValueError(f"--stack {args.stack}: target {plan.target!r} runs real engines; the simulator serves only local and kind stacks")
    try:
        instance = plan.instance(args.instance)
    except KeyError:
        names = ", ".join(i.name for i in plan.instances)
        raise ValueError(f"--instance {args.instance}: not in the Plan of {args.stack} (instances: {names})") from None
    return sim_config_from_plan(plan, instance, bind_host=args.bind_host)


def admin_token_from_env(args: argparse.Namespace) -> str | None:
    """The admin token from the variable ``--admin-token-env`` names (None without the flag); ValueError if unset."""
    name = getattr(args, "admin_token_env", None)
    if not name:
        return None
    token = os.environ.get(name)
    if not token:
        raise ValueError(f"--admin-token-env {name}: variable is not set or empty")
    return token


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """The SimConfig the flags describe, or the Plan's with ``--stack``."""
    token = admin_token_from_env(args)
    if args.stack:
        return config_from_plan(args).model_copy(update={"admin_token": token})
    missing = [f"--{n.replace('_', '-')}" for n in ("role", "port", "kv_port") if getattr(args, n) is None]
    if missing:
        raise ValueError(f"{', '.join(missing)} required without --stack")
    return SimConfig(
        role=args.role, instance=args.instance, host=args.host, port=args.port, kv_port=args.kv_port,
        kv_host=args.kv_host, hardware=args.hardware, npus=args.npus, dp=args.dp, tp=args.tp, ep=args.ep,
        nodes=args.nodes, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        redundant_experts=args.redundant_experts, mtp=args.mtp, speedup=args.speedup,
        startup_delay=args.startup_delay, link_gbps=args.link_gbps, kv_timeout_s=args.kv_timeout_s,
        kv_wire_scale=args.kv_wire_scale, seed=args.seed, model=args.model, expert_map=args.expert_map,
        block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching, admin_token=token,
        rank_endpoints=rank_endpoints_arg(args.rank_endpoints),
    )


def rank_endpoints_arg(value: str | None) -> tuple[str, ...]:
    """``--rank-endpoints`` as a tuple of ``host:port`` (empty without the flag)."""
    return tuple(p.strip() for p in value.split(",") if p.strip()) if value else ()


def option_errors(exc: ValidationError) -> str:
    """``--flag: message (got value); fix`` for each field the simulator's configuration refused (the
    stack loader's translation of pydantic errors, with the field written as its flag)."""
    from dataclasses import replace  # noqa: PLC0415

    from ascend_runtime.config.loader import problems_from_validation  # noqa: PLC0415
    from ascend_runtime.perf.sim_config import SimConfig  # noqa: PLC0415

    problems = problems_from_validation(exc, SimConfig, where="the command line")
    def flag(path: str) -> str:
        field = path.split(".")[0]
        return FIELD_FLAGS.get(field, "--" + field.replace("_", "-")) if path else "options"

    return "; ".join(str(replace(p, path=flag(p.path))) for p in problems)


def check_options(args: argparse.Namespace) -> int | None:
    """The options the simulator's configuration takes as they come (exit 2 naming the flag, or None): listen
    addresses this machine resolves, ports 1..65535, names without spaces or control characters (they reach
    response headers), finite times and rates, counts within :data:`~ascend_runtime.cli.stackargs.MAX_COUNT`,
    an expert map that is a readable file."""
    from ascend_runtime.cli.stackargs import (  # noqa: PLC0415
        MAX_COUNT,
        check_bind_host,
        check_count,
        check_duration,
        check_env_name,
        check_input_file,
        check_number,
        check_port,
        check_text,
        first_error,
        input_error,
    )

    return first_error(
        check_text("--instance", args.instance, "an instance name"),
        check_text("--model", args.model, "a model name"),
        check_bind_host("--host", args.host),
        check_bind_host("--kv-host", args.kv_host) if args.kv_host is not None else None,
        check_bind_host("--bind-host", args.bind_host) if args.bind_host is not None else None,
        check_port("--port", args.port), check_port("--kv-port", args.kv_port),
        input_error("--kv-port", f"{args.kv_port} is also --port: the API and the KV transfer listen on ports of "
                    "their own; give another") if args.port is not None and args.port == args.kv_port else None,
        *(check_count(f"--{flag.replace('_', '-')}", getattr(args, flag), maximum=MAX_COUNT)
          for flag in ("npus", "dp", "tp", "ep", "nodes", "max_num_seqs", "max_num_batched_tokens", "block_size")),
        check_count("--redundant-experts", args.redundant_experts, 0, maximum=MAX_COUNT),
        check_count("--seed", args.seed, 0, maximum=2**63 - 1),  # numpy's generators take non-negative seeds
        check_number("--speedup", args.speedup, 0.001, strict=False, maximum=MAX_SIM_SPEEDUP),
        check_duration("--startup-delay", args.startup_delay, strict=False),
        check_number("--link-gbps", args.link_gbps), check_duration("--kv-timeout-s", args.kv_timeout_s),
        check_number("--kv-wire-scale", args.kv_wire_scale, maximum=1.0),
        check_input_file("--expert-map", args.expert_map),
        check_env_name("--admin-token-env", args.admin_token_env),
        _check_rank_endpoints(args.rank_endpoints),
    )


def _check_rank_endpoints(value: str | None) -> int | None:
    """``--rank-endpoints``: ``host:port`` items, each a bindable host and a port 1..65535."""
    if not value:
        return None
    from ascend_runtime.cli.stackargs import check_bind_host, input_error  # noqa: PLC0415
    from ascend_runtime.perf.sim_config import split_host_port  # noqa: PLC0415

    for item in rank_endpoints_arg(value):
        try:
            host, _ = split_host_port(item)
        except ValueError as exc:
            return input_error("--rank-endpoints", f"{exc}; give HOST:PORT,HOST:PORT,... (one per DP rank)")
        bad = check_bind_host("--rank-endpoints", host)
        if bad is not None:
            return bad
    return None


def _check_expert_map(cfg: SimConfig) -> int | None:
    """``--expert-map`` (or the Plan's map): readable JSON (:func:`~ascend_runtime.cli.stackargs.read_json`)
    that is an expert map of the instance's shape; exit code 2 naming the flag, else None."""
    if not cfg.expert_map:
        return None
    from ascend_runtime.cli.stackargs import input_error, read_json  # noqa: PLC0415
    from ascend_runtime.sim.experts import ExpertMap  # noqa: PLC0415

    doc, rc = read_json("--expert-map", cfg.expert_map, "vLLM-Ascend expert map")
    if rc:
        return rc
    resolved = cfg.resolved()
    shape = resolved.model_shape()
    try:
        ExpertMap.from_vllm_json(doc, shape.num_moe_layers, shape.num_routed_experts, int(resolved.ep or 1),
                                 resolved.slots_per_rank)
    except (ValueError, TypeError, KeyError) as exc:
        return input_error("--expert-map", f"{cfg.expert_map}: {str(exc)[:300]}; give a map of this instance's shape")
    return None


#: SimConfig fields whose flag is not ``--<field>``.
FIELD_FLAGS = {"name": "--model"}


def handler(args: argparse.Namespace) -> int:
    """Run the simulator until interrupted."""
    from ascend_runtime.sim.server import run_simulator

    bad = check_options(args)
    if bad is not None:  # before the configuration is built or anything listens
        return bad
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg = config_from_args(args)
        cfg.resolved()
        from ascend_runtime.perf.capacity import kv_capacity_tokens

        kv_capacity_tokens(cfg.resolved())
        bad = _check_expert_map(cfg)
        if bad is not None:  # read and checked now: the server would refuse it only once started
            return bad
    except ValidationError as exc:
        print(f"ascend-deploy sim: invalid options: {option_errors(exc)}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"ascend-deploy sim: invalid options: {exc}", file=sys.stderr)
        return 2
    try:
        run_simulator(cfg)
    except ValueError as exc:  # expert map file rejected
        print(f"ascend-deploy sim: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ascend-deploy sim: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0
