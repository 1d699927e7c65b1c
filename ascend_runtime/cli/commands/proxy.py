"""`ascend-deploy proxy`: run the PD proxy in front of prefill and decode instances."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
from pathlib import Path

from ascend_runtime.cli.stackargs import MAX_COUNT
from ascend_runtime.config.errors import MIN_INTERVAL_S
from ascend_runtime.proxy.config import (
    Limits,
    OutlierPolicy,
    ProxyConfig,
    RoutingWeights,
    weight_problem,
)
from ascend_runtime.proxy.instances import (
    InstanceSpec,
    InstanceSpecError,
    check_unique,
    load_instances_file,
    parse_cli_instance,
)


def register(subparsers: argparse._SubParsersAction) -> None:  # noqa: SLF001
    p = subparsers.add_parser("proxy", help="run the PD-aware proxy (prefill -> decode, load-balanced)",
                              description="Serve /v1/completions and /v1/chat/completions through a prefill "
                                          "and a decode instance (vLLM-Ascend KV-transfer protocol).")
    p.add_argument("--host", default="127.0.0.1",
                   help="listen address (default 127.0.0.1; give 0.0.0.0 or an interface address to serve others)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=1,
                   help="proxy processes sharing the port (SO_REUSEPORT), one core each; admin calls and "
                        "/metrics cover all of them (docs/proxy.md, Workers) (default %(default)s)")
    src = p.add_argument_group("instances (command line, file, or Kubernetes)")
    src.add_argument("--prefill", action="append", default=[], metavar="URL[,name=NAME][,weight=W]")
    src.add_argument("--decode", action="append", default=[], metavar="URL[,name=NAME][,weight=W]")
    src.add_argument("--instances-file", type=Path, help="YAML/JSON list of {name, role, url}; reloaded on "
                                                         "change and on SIGHUP")
    src.add_argument("--stack", help="route to every instance of this stack's Plan (leader API URLs)")
    src.add_argument("--stacks-dir", help="stacks directory for --stack (default: the project's stacks/)")
    src.add_argument("--k8s-namespace", help="watch EndpointSlices in this namespace")
    src.add_argument("--k8s-prefill-selector", help="label selector of the prefill Service's EndpointSlices")
    src.add_argument("--k8s-decode-selector", help="label selector of the decode Service's EndpointSlices")
    src.add_argument("--k8s-port-name", default="http")
    p.add_argument("--admin-token-env", metavar="VAR",
                   help="name of the environment variable holding the admin bearer token")
    t = p.add_argument_group("timeouts and health (seconds)")
    t.add_argument("--connect-timeout-s", type=float, default=3.0)
    t.add_argument("--prefill-timeout-s", type=float, default=300.0)
    t.add_argument("--first-token-timeout-s", type=float, default=60.0)
    t.add_argument("--stream-idle-timeout-s", type=float, default=120.0)
    t.add_argument("--health-interval-s", type=float, default=2.0)
    t.add_argument("--health-timeout-s", type=float, default=1.0)
    o = OutlierPolicy()
    t.add_argument("--eject-after", type=int, default=o.consecutive_errors,
                   help="consecutive failed requests (5xx, timeout) that eject an instance (default %(default)s)")
    t.add_argument("--eject-duration-s", type=float, default=o.base_s,
                   help="base ejection time; the n-th ejection in a row lasts n times this (default %(default)s)")
    t.add_argument("--eject-max-duration-s", type=float, default=o.max_s, help="longest ejection (default %(default)s)")
    t.add_argument("--eject-after-connect-failures", type=int, default=o.consecutive_connect_failures,
                   help="consecutive refused/reset connections or broken streams that eject (default %(default)s)")
    t.add_argument("--health-failures", type=int, default=o.health_failures,
                   help="consecutive failed /health checks (refused or non-200; a timeout is not a failure) "
                        "that eject (default %(default)s)")
    t.add_argument("--success-rate-window", type=int, default=o.window,
                   help="requests per instance in the success-rate window (default %(default)s)")
    t.add_argument("--success-rate-min-requests", type=int, default=o.min_requests,
                   help="requests an instance needs in the window before rates apply (default %(default)s)")
    t.add_argument("--success-rate-min-hosts", type=int, default=o.success_rate_min_hosts,
                   help="instances of a role with enough requests for the stdev rule (default %(default)s)")
    t.add_argument("--success-rate-stdev-factor", type=float, default=o.stdev_factor,
                   help="eject below mean - factor * stdev of the role's success rates (default %(default)s)")
    t.add_argument("--failure-percent", type=float, default=o.failure_percent,
                   help="eject when this percentage of the window failed; 0 = off (default %(default)s)")
    t.add_argument("--max-ejection-percent", type=float, default=o.max_percent,
                   help="most instances of a role (percent of those up, rounded down) ejected on outlier "
                        "evidence at once; the default never ejects the last one (default %(default)s)")
    lim = Limits()
    c = p.add_argument_group("client limits")
    c.add_argument("--header-timeout-s", type=float, default=lim.header_timeout_s,
                   help="request head must arrive within this of connect / previous answer; also the "
                        "keep-alive idle timeout (default %(default)s)")
    c.add_argument("--body-timeout-s", type=float, default=lim.body_timeout_s,
                   help="longest gap while reading a request body (default %(default)s)")
    c.add_argument("--body-total-timeout-s", type=float, default=lim.body_total_timeout_s,
                   help="whole request body must arrive within this (default %(default)s)")
    c.add_argument("--max-body-bytes", type=int, default=lim.max_body_bytes,
                   help="larger bodies get 413, refused on Content-Length before reading (default %(default)s)")
    t.add_argument("--max-attempts", type=int, default=3, help="instances tried per request and role")
    w = p.add_argument_group("routing weights (lower score wins)")
    d = RoutingWeights()
    for field in d.__slots__:  # type: ignore[attr-defined]
        w.add_argument("--" + field.replace("_", "-"), type=float, default=getattr(d, field))
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=handler)


def plan_specs(stack: str, stacks_dir: str | None) -> list[InstanceSpec]:
    """Instances of a stack's Plan; a ConfigError becomes a ValueError naming the stack."""
    from ascend_runtime.config.errors import ConfigError
    from ascend_runtime.planner import load_plan
    from ascend_runtime.proxy.instances import specs_from_data

    try:
        plan = load_plan(stack, stacks_dir)
    except ConfigError as exc:
        raise ValueError(f"--stack {stack}: {exc}") from None
    return specs_from_data(plan.endpoints())


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    """Build a ProxyConfig; raises InstanceSpecError / ValueError on bad input."""
    specs: list[InstanceSpec] = [parse_cli_instance("prefill", v) for v in args.prefill]
    specs += [parse_cli_instance("decode", v) for v in args.decode]
    if args.stack:
        specs += plan_specs(args.stack, args.stacks_dir)
    check_unique(specs)
    if args.instances_file is not None:  # refused now when malformed; later reloads keep the last good list
        check_unique(specs + load_instances_file(args.instances_file))
    k8s = bool(args.k8s_namespace)
    if not specs and args.instances_file is None and not k8s:
        raise ValueError("give --prefill/--decode, --stack, --instances-file or --k8s-namespace")
    token = None
    if args.admin_token_env:
        token = os.environ.get(args.admin_token_env)
        if not token:
            raise ValueError(f"--admin-token-env {args.admin_token_env}: variable is not set or empty")
    weights = RoutingWeights(**{f: getattr(args, f) for f in RoutingWeights.__slots__})  # type: ignore[attr-defined]
    return ProxyConfig(
        host=args.host, port=args.port, instances=specs, instances_file=args.instances_file, admin_token=token,
        connect_timeout_s=args.connect_timeout_s, prefill_timeout_s=args.prefill_timeout_s,
        first_token_timeout_s=args.first_token_timeout_s, stream_idle_timeout_s=args.stream_idle_timeout_s,
        health_interval_s=args.health_interval_s, health_timeout_s=args.health_timeout_s,
        eject_after=args.eject_after, eject_duration_s=args.eject_duration_s, max_attempts=args.max_attempts,
        outlier=OutlierPolicy(
            consecutive_errors=args.eject_after, consecutive_connect_failures=args.eject_after_connect_failures,
            health_failures=args.health_failures, window=args.success_rate_window,
            min_requests=args.success_rate_min_requests, success_rate_min_hosts=args.success_rate_min_hosts,
            stdev_factor=args.success_rate_stdev_factor, failure_percent=args.failure_percent,
            base_s=args.eject_duration_s, max_s=args.eject_max_duration_s, max_percent=args.max_ejection_percent),
        limits=Limits(header_timeout_s=args.header_timeout_s, body_timeout_s=args.body_timeout_s,
                      body_total_timeout_s=args.body_total_timeout_s, max_body_bytes=args.max_body_bytes),
        weights=weights, install_sighup=True,
    )


async def _serve(cfg: ProxyConfig, args: argparse.Namespace) -> None:
    from ascend_runtime.proxy.discovery import KubernetesDiscovery
    from ascend_runtime.proxy.server import start_proxy

    k8s = None
    if args.k8s_namespace:
        selectors = {r: s for r, s in (("prefill", args.k8s_prefill_selector),
                                       ("decode", args.k8s_decode_selector)) if s}
        k8s = KubernetesDiscovery(lambda specs: None, args.k8s_namespace, selectors,  # type: ignore[arg-type]
                                  port_name=args.k8s_port_name)
    handle = await start_proxy(cfg, k8s=k8s)
    print(f"proxy listening on {handle.url}", file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await handle.stop()


#: Most proxy processes on one port: each takes a core; more than this is a typo, not a machine.
MAX_WORKERS = 256
#: Seconds flags: finite and positive, at most a day (an idle stream or a prefill longer than that is a hang).
MAX_SECONDS = 86400.0
#: ... and at least a millisecond: a shorter timeout fails every request and ejects every instance.
MIN_TIMEOUT_S = 0.001


def check_args(args: argparse.Namespace) -> int | None:
    """Every flag's value before anything is built or started (exit 2 naming the flag, stackargs' messages)."""
    from ascend_runtime.cli.stackargs import (  # noqa: PLC0415 - only when this command runs
        check_bind_host,
        check_count,
        check_dns_label,
        check_env_name,
        check_input_file,
        check_label_selector,
        check_log_level,
        check_number,
        check_port,
        first_error,
        input_error,
    )

    seconds = ("connect_timeout_s", "prefill_timeout_s", "first_token_timeout_s", "stream_idle_timeout_s",
               "health_timeout_s", "eject_duration_s", "eject_max_duration_s",
               "header_timeout_s", "body_timeout_s", "body_total_timeout_s")
    counts = ("eject_after", "eject_after_connect_failures", "health_failures", "success_rate_window",
              "success_rate_min_requests", "success_rate_min_hosts", "max_attempts")
    bad_weight = weight_problem({f: getattr(args, f) for f in RoutingWeights.__slots__})  # type: ignore[attr-defined]

    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    return first_error(
        check_log_level("--log-level", args.log_level),
        check_port("--port", args.port),
        check_bind_host("--host", args.host) if args.host else input_error("--host", "is empty; e.g. 127.0.0.1"),
        check_count("--workers", args.workers, maximum=MAX_WORKERS),
        input_error("--stack", "is empty; name a stack") if args.stack == "" else None,
        check_input_file("--instances-file", None if args.instances_file is None else str(args.instances_file)),
        check_dns_label("--k8s-namespace", args.k8s_namespace),
        check_label_selector("--k8s-prefill-selector", args.k8s_prefill_selector),
        check_label_selector("--k8s-decode-selector", args.k8s_decode_selector),
        check_dns_label("--k8s-port-name", args.k8s_port_name, "a Service port name"),
        check_env_name("--admin-token-env", args.admin_token_env),
        *(check_number(flag(n), getattr(args, n), MIN_TIMEOUT_S, strict=False, maximum=MAX_SECONDS) for n in seconds),
        # 0: no active checks; otherwise a polling interval (at least MIN_INTERVAL_S: no check loop without a pause)
        None if args.health_interval_s == 0 or (math.isfinite(args.health_interval_s) and MIN_INTERVAL_S
                                                <= args.health_interval_s <= MAX_SECONDS)
        else input_error("--health-interval-s", f"must be 0 (no active checks) or from {MIN_INTERVAL_S:g} to "
                         f"{MAX_SECONDS:g} seconds (got {args.health_interval_s!r})"),
        *(check_count(flag(n), getattr(args, n), maximum=MAX_COUNT) for n in counts),
        check_number("--success-rate-stdev-factor", args.success_rate_stdev_factor, strict=False),
        check_number("--failure-percent", args.failure_percent, strict=False, maximum=100.0),
        check_number("--max-ejection-percent", args.max_ejection_percent, strict=False, maximum=100.0),
        check_count("--max-body-bytes", args.max_body_bytes, maximum=1 << 40),
        input_error(*bad_weight) if bad_weight else None,  # proxy/config.py weight_problem, as RoutingWeights checks
        input_error("--eject-max-duration-s", f"must be at least --eject-duration-s ({args.eject_duration_s:g})")
        if args.eject_max_duration_s < args.eject_duration_s else None,
    )


def handler(args: argparse.Namespace) -> int:
    bad = check_args(args)
    if bad is not None:  # nothing built, nothing started
        return bad
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
    except (InstanceSpecError, ValueError) as exc:
        print(f"ascend-deploy proxy: {exc}", file=sys.stderr)
        return 2
    if args.workers > 1:
        from ascend_runtime.proxy.workers import serve_workers

        k8s = None
        if args.k8s_namespace:
            k8s = (args.k8s_namespace, {r: s for r, s in (("prefill", args.k8s_prefill_selector),
                                                          ("decode", args.k8s_decode_selector)) if s},
                   args.k8s_port_name)
        try:
            return serve_workers(cfg, args.workers, k8s, log_level=logging.getLogger().level)
        except OSError as exc:
            print(f"ascend-deploy proxy: {exc}", file=sys.stderr)
            return 1
    from ascend_runtime.proxy.workers import run_loop

    try:
        run_loop(_serve(cfg, args))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"ascend-deploy proxy: {exc}", file=sys.stderr)
        return 1
    return 0
