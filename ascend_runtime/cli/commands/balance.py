"""`ascend-deploy balance plan|serve`: expert placement and the balancing daemon."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``balance`` with sub-commands ``plan`` and ``serve``."""
    p = subparsers.add_parser("balance", help="expert load balancing: plan a map, or run the daemon")
    sub = p.add_subparsers(dest="balance_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])

    plan = sub.add_parser("plan", help="plan an expert map from a load file")
    plan.add_argument("--load", required=True, help='JSON {"expert_load": [[...]]} (layers x experts, tokens)')
    plan.add_argument("--ranks", type=int, required=True, help="EP ranks (devices) per instance")
    plan.add_argument("--slots", type=int, required=True, help="expert slots per rank")
    plan.add_argument("--groups", type=int, help="expert groups (hierarchical policy, with --nodes)")
    plan.add_argument("--nodes", type=int, help="nodes (hierarchical policy, with --groups)")
    plan.add_argument("--previous", help="expert map now in service (moves are minimised against it)")
    plan.add_argument("--min-gain", type=float, default=0.01, help="keep --previous unless balancedness gains this much (relative)")
    plan.add_argument("--algorithm", choices=["ours", "eplb", "trivial"], default="ours")
    plan.add_argument("--out", required=True, help="where to write the vLLM-Ascend expert map (atomically)")
    plan.set_defaults(func=cmd_plan)

    serve = sub.add_parser("serve", help="run the balancing daemon")
    serve.add_argument("--instance", action="append", default=[], metavar="NAME=URL",
                       help="an instance whose GET URL/admin/expert_load is polled (repeat)")
    serve.add_argument("--dump-dir", action="append", default=[], metavar="NAME=DIR",
                       help="an instance whose per-rank dump files are in DIR (repeat)")
    serve.add_argument("--experts", type=int, default=256, help="logical experts per layer")
    serve.add_argument("--ranks", type=int, required=True)
    serve.add_argument("--slots", type=int, required=True)
    serve.add_argument("--groups", type=int)
    serve.add_argument("--nodes", type=int)
    serve.add_argument("--interval", type=float, default=30.0, help="seconds between cycles")
    serve.add_argument("--decay", type=float, help="weight of the newest window in (0, 1]; default adaptive")
    serve.add_argument("--min-windows", type=int, default=2)
    serve.add_argument("--min-gain", type=float, default=0.01)
    serve.add_argument("--publish-file", help="expert map file to replace atomically")
    serve.add_argument("--configmap", metavar="NAMESPACE/NAME[:KEY]", help="ConfigMap to update (in-cluster or kubeconfig)")
    serve.add_argument("--apply", choices=["simulator", "drain-restart", "none"], default="simulator")
    serve.add_argument("--proxy", help="proxy URL for drain-restart")
    serve.add_argument("--token-env", default="ASCEND_PROXY_TOKEN", help="env var holding the proxy admin token")
    serve.add_argument("--namespace", default="default", help="namespace of the instance pods (drain-restart)")
    serve.add_argument("--pod-selector", default="app.kubernetes.io/instance={name}",
                       help="label selector of an instance's pods; {name} is replaced")
    serve.add_argument("--dry-run", action="store_true", help="plan and report only; never publish or apply")
    serve.add_argument("--metrics-host", default="127.0.0.1")
    serve.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics here")
    serve.add_argument("--max-cycles", type=int, help="stop after this many cycles")
    serve.add_argument("--log-level", default="INFO")
    serve.set_defaults(func=cmd_serve)


def _bad(field: str, message: str) -> int:
    print(f"error: {field}: {message}", file=sys.stderr)
    return 2


def _read_json(path: str, field: str) -> tuple[Any, int]:
    try:
        return json.loads(Path(path).read_text()), 0
    except FileNotFoundError:
        return None, _bad(field, f"{path} does not exist; give an existing JSON file")
    except (OSError, ValueError) as exc:
        return None, _bad(field, f"{path} is not readable JSON ({exc}); fix the file")


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan a map from a load file; print balancedness before/after and moved slots."""
    from ascend_runtime.balancer.eplb_greedy import eplb_greedy, trivial_placement
    from ascend_runtime.balancer.expert_map import InvalidExpertMap, map_to_placement, placement_to_map
    from ascend_runtime.balancer.measure import balancedness, moved_slots
    from ascend_runtime.balancer.placement import PlacementConfig, plan_placement
    from ascend_runtime.balancer.publish import FilePublisher

    doc, rc = _read_json(args.load, "--load")
    if rc:
        return rc
    try:
        load = np.asarray(doc["expert_load"], dtype=np.float64)
    except (TypeError, KeyError, ValueError):
        return _bad("--load", 'expected {"expert_load": [[tokens per expert] per layer]}, a rectangular layers x experts array')
    if load.ndim != 2 or load.size == 0 or (load < 0).any() or not np.isfinite(load).all():
        return _bad("--load expert_load", f"must be a non-empty layers x experts array of non-negative numbers (got shape {load.shape})")
    layers, experts = load.shape
    if args.ranks < 1 or args.slots < 1:
        return _bad("--ranks/--slots", "must be positive")
    if args.ranks * args.slots < experts:
        return _bad("--slots", f"ranks x slots = {args.ranks * args.slots} < {experts} experts; raise --slots to at least {-(-experts // args.ranks)}")
    if bool(args.groups) != bool(args.nodes):
        return _bad("--groups/--nodes", "give both for the hierarchical policy, or neither")
    if args.groups and (experts % args.groups or args.groups % args.nodes or args.ranks % args.nodes):
        return _bad("--groups/--nodes", f"need experts ({experts}) % groups == 0, groups % nodes == 0 and ranks % nodes == 0")
    previous = None
    if args.previous:
        prev_doc, rc = _read_json(args.previous, "--previous")
        if rc:
            return rc
        try:
            previous, p_ranks, p_slots = map_to_placement(prev_doc, experts, allow_duplicates=True)
        except InvalidExpertMap as exc:
            return _bad("--previous", f"{exc}; give a valid map or omit --previous")
        if (p_ranks, p_slots, previous.shape[0]) != (args.ranks, args.slots, layers):
            return _bad("--previous", f"map is {previous.shape[0]} layers x {p_ranks} ranks x {p_slots} slots, expected {layers} x {args.ranks} x {args.slots}")
    if args.algorithm == "ours":
        res = plan_placement(load, args.ranks, args.slots, args.groups, args.nodes, previous,
                             config=PlacementConfig(min_gain=args.min_gain))
        placement = res.placement
    elif args.algorithm == "eplb":
        placement = eplb_greedy(load, args.ranks, args.slots, args.groups, args.nodes)
    else:
        placement = trivial_placement(layers, experts, args.ranks, args.slots)
    before_p = previous if previous is not None else trivial_placement(layers, experts, args.ranks, args.slots)
    before, after = balancedness(before_p, load, args.ranks), balancedness(placement, load, args.ranks)
    moves = moved_slots(previous, placement, args.ranks, experts) if previous is not None else None
    try:
        FilePublisher(args.out, experts, args.ranks, args.slots).publish(placement_to_map(placement, args.ranks))
    except InvalidExpertMap as exc:
        print(f"error: refusing to write {args.out}: {exc}", file=sys.stderr)
        return 1
    label = "previous map" if previous is not None else "trivial placement"
    print(f"balancedness before ({label}): {before:.4f}")
    print(f"balancedness after ({args.algorithm}): {after:.4f}")
    print(f"moved slots: {moves if moves is not None else 'n/a (no --previous)'} of {placement.size}")
    print(f"wrote {args.out}")
    return 0


def _pairs(values: list[str], flag: str) -> list[tuple[str, str]] | str:
    out = []
    for v in values:
        name, sep, target = v.partition("=")
        if not sep or not name or not target:
            return f"{flag} {v!r}: expected NAME=VALUE"
        out.append((name, target))
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the daemon from arguments and run it until interrupted."""
    from ascend_runtime.balancer.apply import DrainRestartApplier, NoopApplier, SimulatorApplier
    from ascend_runtime.balancer.daemon import BalancerConfig, BalancerDaemon, Instance
    from ascend_runtime.balancer.placement import PlacementConfig
    from ascend_runtime.balancer.publish import ConfigMapPublisher, FilePublisher
    from ascend_runtime.balancer.sources import DirLoadSource, HttpLoadSource

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    http, dirs = _pairs(args.instance, "--instance"), _pairs(args.dump_dir, "--dump-dir")
    for parsed, flag in ((http, "--instance"), (dirs, "--dump-dir")):
        if isinstance(parsed, str):
            return _bad(flag, parsed)
    if not http and not dirs:
        return _bad("--instance/--dump-dir", "give at least one instance to collect load from")
    if args.ranks * args.slots < args.experts:
        return _bad("--slots", f"ranks x slots = {args.ranks * args.slots} < {args.experts} experts")
    if args.decay is not None and not 0 < args.decay <= 1:
        return _bad("--decay", "must be in (0, 1]")
    if not args.dry_run and not (args.publish_file or args.configmap):
        return _bad("--publish-file/--configmap", "give where to publish maps, or --dry-run")
    if args.apply == "drain-restart" and not args.proxy:
        return _bad("--proxy", "drain-restart needs the proxy URL")
    core_api = None
    if args.configmap or args.apply == "drain-restart":
        from kubernetes import client, config as kconfig

        try:
            kconfig.load_incluster_config()
        except kconfig.ConfigException:
            kconfig.load_kube_config()
        core_api = client.CoreV1Api()
    publisher = None
    if args.publish_file:
        publisher = FilePublisher(args.publish_file, args.experts, args.ranks, args.slots)
    elif args.configmap:
        ref, _, key = args.configmap.partition(":")
        ns, _, name = ref.partition("/")
        if not ns or not name:
            return _bad("--configmap", "expected NAMESPACE/NAME[:KEY]")
        publisher = ConfigMapPublisher(core_api, name, ns, args.experts, key or "expert_map.json", args.ranks, args.slots)
    instances = []
    urls = dict(http)
    for name, target in [*http, *dirs]:
        source = HttpLoadSource(name, target) if name in urls and target == urls[name] else DirLoadSource(name, target)
        if args.apply == "simulator" and name in urls:
            applier = SimulatorApplier(name, urls[name])
        elif args.apply == "drain-restart":
            applier = DrainRestartApplier(name, args.proxy, os.environ.get(args.token_env, ""), core_api,
                                          args.namespace, args.pod_selector.format(name=name))
        else:
            applier = NoopApplier(name)
        instances.append(Instance(name, source, applier))
    cfg = BalancerConfig(
        num_experts=args.experts, ranks=args.ranks, slots=args.slots, groups=args.groups, nodes=args.nodes,
        interval_s=args.interval, decay=args.decay, min_windows=args.min_windows, dry_run=args.dry_run,
        metrics_host=args.metrics_host, metrics_port=args.metrics_port,
        placement=PlacementConfig(min_gain=args.min_gain),
    )
    daemon = BalancerDaemon(cfg, instances, publisher)
    try:
        asyncio.run(daemon.run(max_cycles=args.max_cycles))
    except KeyboardInterrupt:
        pass
    return 0
