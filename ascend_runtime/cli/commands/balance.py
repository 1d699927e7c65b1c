"""`ascend-deploy balance plan|record|evaluate|serve`: placement, recorded load, its replay, the daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ascend_runtime.allocator import keep_freed_memory
from ascend_runtime.cli.stackargs import add_stack_options, env_secret, input_error, path_arg

PLAN_POLICIES = ("ours", "greedy", "swift_balancer", "flashlb")
EVAL_POLICIES = ("none", "greedy", "swift_balancer", "flashlb", "ours")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``balance`` with sub-commands ``plan``, ``evaluate``, ``record`` and ``serve``."""
    p = subparsers.add_parser("balance", help="expert load balancing: plan a map, or run the daemon")
    sub = p.add_subparsers(dest="balance_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])

    plan = sub.add_parser("plan", help="plan an expert map from a load file or a load history")
    src = plan.add_mutually_exclusive_group(required=True)
    src.add_argument("--load", type=path_arg, help='JSON {"expert_load": [[...]]} (layers x experts, tokens)')
    src.add_argument("--history", type=path_arg, help="windows x layers x experts: a .npy file ([W, L, E] or [L, E]), or a directory "
                                       "of dump snapshots (sub-directories of rank_<r>.json files, oldest first by name)")
    plan.add_argument("--ranks", type=int, required=True, help="EP ranks (devices) per instance")
    plan.add_argument("--slots", type=int, required=True, help="expert slots per rank")
    plan.add_argument("--groups", type=int, help="expert groups (hierarchical policy, with --nodes)")
    plan.add_argument("--nodes", type=int, help="nodes (hierarchical policy, with --groups)")
    plan.add_argument("--previous", type=path_arg, help="expert map now in service (moves are minimised against it)")
    plan.add_argument("--min-gain", type=float, default=0.01, help="keep --previous unless balancedness gains this much (relative)")
    plan.add_argument("--algorithm", choices=["ours", "eplb", "trivial"], default="ours",
                      help="policy when --policy is not given (eplb = greedy)")
    plan.add_argument("--policy", action="append", choices=list(PLAN_POLICIES), metavar="{" + ",".join(PLAN_POLICIES) + "}",
                      help="policy to plan with (repeat to compare; the first is written to --out)")
    plan.add_argument("--out", required=True, type=path_arg, help="where to write the vLLM-Ascend expert map (atomically)")
    plan.set_defaults(func=cmd_plan)

    ev = sub.add_parser("evaluate", help="replay recorded expert load through policies, redundancy and intervals")
    ev.add_argument("--load-dir", required=True, type=path_arg, help="recorded load: a directory of dump snapshots (sub-directories of "
                    "rank_<r>.json, oldest first by name), optionally split into prefill/ and decode/, or a .npy [W, L, E]")
    add_stack_options(ev, required=False)
    ev.add_argument("--ranks", type=int, help="without --stack: EP size of the one stage replayed")
    ev.add_argument("--hardware", default="atlas-800i-a2", help="without --stack: hardware kind (link bandwidth)")
    ev.add_argument("--batch-tokens", type=int, default=2048, help="without --stack: tokens per engine step")
    ev.add_argument("--policy", action="append", choices=list(EVAL_POLICIES), help="policies to replay (repeat; default all)")
    ev.add_argument("--interval", action="append", type=int, help="rebalance every N windows (repeat; default 1, 2, 4)")
    ev.add_argument("--window-steps", type=int, default=600, help="engine steps one recorded window spans (maps the "
                    "interval to eplb.heat_collection_interval)")
    ev.add_argument("--window-seconds", type=float, default=60.0, help="seconds one recorded window spans (moves per hour)")
    ev.add_argument("--plot", default="balance-evaluate.png", type=path_arg, help="PNG of balancedness and MoE time over the replay (default: balance-evaluate.png in the current directory)")
    ev.set_defaults(func=cmd_evaluate)

    rec = sub.add_parser("record", help="record expert load from running simulators as dump snapshots (for evaluate)")
    add_stack_options(rec, required=False)
    rec.add_argument("--instance", action="append", default=[], metavar="NAME=URL",
                     help="without --stack: an instance whose GET URL/admin/expert_load is polled (repeat)")
    rec.add_argument("--out", required=True, type=path_arg, help="new or empty directory for the snapshots "
                     "(with --stack: OUT/prefill/ and OUT/decode/, what balance evaluate --stack reads)")
    rec.add_argument("--windows", type=int, default=12, help="snapshots to record per stage (default 12; at least 2)")
    rec.add_argument("--every-s", type=float, default=10.0, help="seconds one window spans (default 10)")
    rec.add_argument("--sim-token-env", metavar="VAR",
                     help="env var holding the simulators' admin bearer token (the local stack's: ASCEND_SIM_ADMIN_TOKEN)")
    rec.set_defaults(func=cmd_record)

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
    serve.add_argument("--publish-file", type=path_arg, help="expert map file to replace atomically")
    serve.add_argument("--configmap", metavar="NAMESPACE/NAME[:KEY]", help="ConfigMap to update (in-cluster or kubeconfig)")
    serve.add_argument("--apply", choices=["simulator", "drain-restart", "none"], default="simulator")
    serve.add_argument("--proxy", help="proxy URL for drain-restart")
    serve.add_argument("--token-env", default="ASCEND_PROXY_TOKEN", help="env var holding the proxy admin token")
    serve.add_argument("--sim-token-env", metavar="VAR",
                       help="env var holding the simulators' admin bearer token (sent to every --instance URL)")
    serve.add_argument("--namespace", default="default", help="namespace of the instance pods (drain-restart)")
    serve.add_argument("--pod-selector", default="app.kubernetes.io/instance={name}",
                       help="label selector of an instance's pods; {name} is replaced")
    serve.add_argument("--dry-run", action="store_true", help="plan and report only; never publish or apply")
    serve.add_argument("--metrics-host", default="127.0.0.1", help="metrics listen address (default 127.0.0.1)")
    serve.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics here")
    serve.add_argument("--max-cycles", type=int, help="stop after this many cycles")
    serve.add_argument("--log-level", default="INFO")
    serve.set_defaults(func=cmd_serve)


def _read_json(path: str, field: str) -> tuple[Any, int]:
    """The JSON document of ``path`` (:func:`~ascend_runtime.cli.stackargs.read_json`), or an exit code."""
    from ascend_runtime.cli.stackargs import read_json  # noqa: PLC0415

    doc, rc = read_json(field, path, "load or expert map")
    return doc, rc


def _read_history(path: str, field: str = "--history") -> tuple[np.ndarray | None, int]:
    """``field`` (``--history``): a .npy file or a directory of dump snapshots -> ``[W, L, E]``, or an exit code.

    Offline, every dump file must read: a file the daemon would skip for a round (partial, wrong shape,
    counts that are not finite and non-negative) is an error naming it."""
    from ascend_runtime.balancer.sources import DirLoadSource

    p = Path(path)
    if not p.exists():
        return None, input_error(field, f"{path} does not exist; give a .npy file or a directory of dump snapshots")
    if p.is_dir():
        snaps = sorted(d for d in p.iterdir() if d.is_dir() and any(d.glob("rank_*.json")))
        if not snaps:
            flat = "; it holds rank_<r>.json itself: give the directory above it, one sub-directory per snapshot" \
                if any(p.glob("rank_*.json")) else _map_record_hint(sorted(p.glob("*.json"))[:20])
            return None, input_error(field, f"{path} has no sub-directories with rank_<r>.json dumps{flat}")
        source = DirLoadSource("history", snaps[0])
        windows = []
        first_ranks: list[int] | None = None
        for snap in snaps:  # replay the snapshots as the daemon's dump-dir source sees them: deltas
            source.directory = snap
            w = source.read()
            if source.skipped:
                bad, why = source.skipped[0]
                return None, input_error(field, f"{bad}: {why}; fix or remove the file (format: docs/balancer.md, "
                                                "input formats)")
            ranks = sorted(source.ranks_read)
            if first_ranks is None:
                first_ranks = ranks
            elif ranks != first_ranks:  # a rank missing from one snapshot would count two windows in the next
                return None, input_error(field, f"{snap} has dumps of ranks {ranks}, {snaps[0]} of ranks {first_ranks}; "
                                                "every snapshot needs the same rank_<r>.json files")
            if w is not None:
                windows.append(w.expert_load)
        if not windows or len({w.shape for w in windows}) != 1:
            return None, input_error(field, f"{path}: no load, or snapshots of different layers x experts")
        return np.stack(windows), 0
    if not p.is_file():
        return None, input_error(field, f"{path} is not a regular file; give a .npy file or a directory of dump snapshots")
    from ascend_runtime.files.npy import load_npy  # noqa: PLC0415
    from ascend_runtime.files.read import NPY_LOAD, FileRefused  # noqa: PLC0415

    try:  # its header is checked against the file's size and caps before anything is allocated: the
        # file at most 1 GiB, its values at most 1 GiB once converted to float64 below
        raw = load_npy(p, max_elements=NPY_LOAD.max_bytes // 8)
    except FileRefused as exc:
        return None, input_error(field, f"{exc}{_map_record_hint([p])}")
    if raw.dtype.kind not in "iuf":
        return None, input_error(field, f"{path} holds {raw.dtype} values, not token counts; save integer or float counts")
    hist = raw.astype(np.float64)
    return (hist[None] if hist.ndim == 2 else hist), 0


def _map_record_hint(paths: list[Path]) -> str:
    """A hint when one of ``paths`` is vLLM-Ascend's expert-map record, which holds no load ("" otherwise)."""
    from ascend_runtime.files.read import EXPERT_MAP, FileRefused, read_head  # noqa: PLC0415

    for path in paths:
        try:
            head = read_head(path, EXPERT_MAP, 4096)
        except (FileRefused, OSError):
            continue
        if b'"moe_layer_count"' in head and b'"layer_list"' in head:
            return (f"; {path.name} is an expert map (vLLM-Ascend expert_map_record_path), not expert load: the engine "
                    "writes no load file (docs/balancer.md, input formats); give it to balance plan --previous")
    return ""


def _short(exc: BaseException, limit: int = 120) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_load(hist: np.ndarray, field: str, min_windows: int = 1) -> int | None:
    """``hist [W, L, E]``: at least ``min_windows`` windows, layers and experts; finite, non-negative counts;
    every window routes tokens (the daemon never sees an empty window). Exit code 2 naming ``field``, or None."""
    if hist.ndim != 3 or hist.shape[0] < min_windows or hist.shape[1] < 1 or hist.shape[2] < 1:
        need = f" with at least {min_windows} windows" if min_windows > 1 else ""
        return input_error(field, f"must be a non-empty windows x layers x experts array{need} (got shape {hist.shape})")
    if not np.isfinite(hist).all():
        return input_error(field, "holds NaN or infinite counts; every count is a finite number of tokens")
    if (hist > MAX_TOKENS).any():
        w, l, e = (int(i) for i in np.argwhere(hist > MAX_TOKENS)[0])
        return input_error(field, f"holds a count above 2^53 (first: window {w}, layer {l}, expert {e}: {hist[w, l, e]:g}); "
                                  "counts are tokens routed in one window, far fewer")
    if (hist < 0).any():
        w, l, e = (int(i) for i in np.argwhere(hist < 0)[0])
        return input_error(field, f"holds negative counts (first: window {w}, layer {l}, expert {e}: {hist[w, l, e]:g}); "
                                  "counts are tokens routed, 0 or more")
    empty = np.flatnonzero(hist.sum(axis=(1, 2)) <= 0)
    if empty.size:
        return input_error(field, f"window {int(empty[0])} routes no tokens ({empty.size} of {hist.shape[0]} windows are "
                                  "empty); drop the empty windows")
    return None


#: Largest token count of one expert in one window: 2^53, where float64 stops counting whole tokens (a sum of
#: larger ones overflows the placement's arithmetic).
MAX_TOKENS = float(1 << 53)

#: Slots placed (layers x ranks x slots) above which a plan is refused: DeepSeek-V3 on EP 320 with 64 redundant
#: experts is 58 x 320 x 1 = 18,560; 2^22 leaves two orders of magnitude and still plans in seconds.
MAX_PLACED_SLOTS = 1 << 22


def _check_shape(layers: int, experts: int, ranks: int, slots: int, groups: int | None, nodes: int | None,
                 flags: str = "--ranks/--slots") -> int | None:
    """The EP shape against the load: positive, slots fill the experts, replicas bounded, groups/nodes consistent."""
    if ranks < 1 or slots < 1:
        return input_error(flags, f"must be positive (got --ranks {ranks}, --slots {slots})")
    if ranks * slots < experts:
        return input_error("--slots", f"ranks x slots = {ranks * slots} < {experts} experts; raise --slots to at least "
                                      f"{-(-experts // ranks)}")
    if slots > experts:
        return input_error("--slots", f"{slots} slots per rank but only {experts} experts: a rank holds an expert at most "
                                      f"once; use --slots {experts} or less")
    redundant = ranks * slots - experts
    if redundant > max(experts, 2 * ranks):
        return input_error(flags, f"{redundant} redundant slots (ranks x slots - experts) exceed both the {experts} "
                                  f"experts and two per rank ({2 * ranks}); vLLM-Ascend's default policy places at most "
                                  "one per rank (vllm_ascend/eplb/core/policy/policy_default_eplb.py, v0.23.0); "
                                  "lower --slots")
    if layers * ranks * slots > MAX_PLACED_SLOTS:
        return input_error(flags, f"{layers} layers x {ranks} ranks x {slots} slots = {layers * ranks * slots} slots to "
                                  f"place, more than {MAX_PLACED_SLOTS}; check --ranks (the EP size of one instance)")
    if (groups is None) != (nodes is None):
        return input_error("--groups/--nodes", "give both for the hierarchical policy, or neither")
    if groups is not None and nodes is not None:
        if groups < 1 or nodes < 1:
            return input_error("--groups/--nodes", f"must be positive (got --groups {groups}, --nodes {nodes})")
        if experts % groups or groups % nodes or ranks % nodes:
            return input_error("--groups/--nodes", f"need experts ({experts}) % groups == 0, groups % nodes == 0 and "
                                                   f"ranks % nodes == 0 (got {groups} groups, {nodes} nodes)")
    return None


def _plan_one(policy: str, hist: np.ndarray, args: argparse.Namespace, previous: np.ndarray | None) -> np.ndarray:
    """Placement ``[L, R*S]`` of ``policy`` from history ``[W, L, E]`` (what the daemon would use)."""
    from ascend_runtime.balancer.baselines import flashlb, swift_balancer
    from ascend_runtime.balancer.eplb_greedy import trivial_placement
    from ascend_runtime.balancer.forecast import LoadForecaster
    from ascend_runtime.balancer.placement import PlacementConfig, greedy_distinct, plan_placement

    config = PlacementConfig(min_gain=args.min_gain)
    if policy == "ours":
        if hist.shape[0] == 1:
            return plan_placement(hist[0], args.ranks, args.slots, args.groups, args.nodes, previous, config=config).placement
        fc = LoadForecaster()
        for w in hist:
            fc.update(w)
        f = fc.forecast()
        return plan_placement(f.mean, args.ranks, args.slots, args.groups, args.nodes, previous, f.std, config,
                              holdout=f.holdout, last=f.last, history=hist).placement
    if policy == "greedy":  # a map vLLM-Ascend serves: no expert twice on one rank
        layers = hist.shape[1]
        return greedy_distinct(hist[-1], args.ranks, args.slots, args.groups, args.nodes).reshape(layers, -1)
    if policy == "swift_balancer":
        return swift_balancer.place(hist, args.ranks, args.slots, previous)
    if policy == "flashlb":
        return flashlb.place(hist, args.ranks, args.slots, previous)
    return trivial_placement(hist.shape[1], hist.shape[2], args.ranks, args.slots)


def cmd_plan(args: argparse.Namespace) -> int:
    """Plan a map from a load file or history; print balancedness on the last window and moved slots."""
    keep_freed_memory()  # planning's numpy temporaries reuse the heap (ascend_runtime/allocator.py)
    from ascend_runtime.balancer.eplb_greedy import trivial_placement
    from ascend_runtime.balancer.expert_map import (
        InvalidExpertMap,
        map_to_placement,
        placement_to_map,
    )
    from ascend_runtime.balancer.measure import balancedness, moved_slots, rank_loads
    from ascend_runtime.balancer.publish import FilePublisher

    from ascend_runtime.balancer.sources import count_array
    from ascend_runtime.cli.stackargs import check_input_file, check_number, check_output_file, first_error

    bad = first_error(check_number("--min-gain", args.min_gain, 0.0, strict=False), check_output_file("--out", args.out),
                      check_input_file("--load", args.load), check_input_file("--history", args.history, directory_ok=True),
                      check_input_file("--previous", args.previous))
    if bad is not None:
        return bad
    if args.load:
        doc, rc = _read_json(args.load, "--load")
        if rc:
            return rc
        try:
            load = count_array(doc["expert_load"])
        except (TypeError, KeyError, ValueError, IndexError):
            return input_error("--load", 'expected {"expert_load": [[tokens per expert] per layer]}, a rectangular layers x '
                                         'experts array of numbers')
        if load.ndim != 2:
            return input_error("--load expert_load", f"must be a layers x experts array (got shape {load.shape})")
        hist = load[None]
        bad = _check_load(hist, "--load expert_load")
    else:
        hist, rc = _read_history(args.history)
        if rc:
            return rc
        bad = _check_load(hist, "--history")
    if bad is not None:
        return bad
    last = hist[-1]
    layers, experts = last.shape
    bad = _check_shape(layers, experts, args.ranks, args.slots, args.groups, args.nodes)
    if bad is not None:
        return bad
    previous = None
    if args.previous:
        prev_doc, rc = _read_json(args.previous, "--previous")
        if rc:
            return rc
        try:
            previous, p_ranks, p_slots = map_to_placement(prev_doc, experts, allow_duplicates=True)
        except InvalidExpertMap as exc:
            return input_error("--previous", f"{exc}; give a valid map or omit --previous")
        if (p_ranks, p_slots, previous.shape[0]) != (args.ranks, args.slots, layers):
            return input_error("--previous", f"map is {previous.shape[0]} layers x {p_ranks} ranks x {p_slots} slots, expected {layers} x {args.ranks} x {args.slots}")
    policies = list(dict.fromkeys(args.policy or [{"eplb": "greedy"}.get(args.algorithm, args.algorithm)]))
    plans: dict[str, np.ndarray] = {}
    for policy in policies:
        try:
            plans[policy] = _plan_one(policy, hist, args, previous)
        except ValueError as exc:
            if policy == "greedy":  # no map keeps greedy's replica counts
                return input_error("--policy greedy", f"{exc}, and vLLM-Ascend holds an expert at most once per rank, so "
                                                      "no map keeps greedy's replicas; use --policy ours (at most one "
                                                      "replica per rank) or lower --slots")
            print(f"error: policy {policy}: {exc}", file=sys.stderr)
            return 1
    placement = plans[policies[0]]
    before_p = previous if previous is not None else trivial_placement(layers, experts, args.ranks, args.slots)
    before, after = balancedness(before_p, last, args.ranks), balancedness(placement, last, args.ranks)
    moves = moved_slots(previous, placement, args.ranks, experts) if previous is not None else None
    try:
        FilePublisher(args.out, experts, args.ranks, args.slots).publish(placement_to_map(placement, args.ranks))
    except InvalidExpertMap as exc:
        print(f"error: refusing to write {args.out}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        return input_error("--out", f"cannot write {args.out}: {exc.strerror or type(exc).__name__}; "
                                    "name a file in a directory this user can write")
    label = "previous map" if previous is not None else "trivial placement"
    print(f"history: {hist.shape[0]} window(s) x {layers} layers x {experts} experts; measured on the last window")
    print(f"balancedness before ({label}): {before:.4f}")
    print(f"balancedness after ({policies[0]}): {after:.4f}")
    for policy, plan in plans.items():
        loads = rank_loads(plan, last, args.ranks)
        moved = moved_slots(previous, plan, args.ranks, experts) if previous is not None else "n/a"
        print(f"policy {policy}: balancedness {balancedness(plan, last, args.ranks):.4f} "
              f"peak {loads.max(axis=1).sum():.1f} mean {loads.mean(axis=1).sum():.1f} (tokens, summed over layers) "
              f"moved {moved}")
    print(f"moved slots: {moves if moves is not None else 'n/a (no --previous)'} of {placement.size}")
    print(f"wrote {args.out} ({policies[0]})")
    return 0


def _load_dir(path: str) -> tuple[dict[str, np.ndarray] | None, int]:
    """``--load-dir`` -> {"prefill"/"decode"/"all": [W, L, E]}, or an exit code."""
    p = Path(path)
    if not p.exists():
        return None, input_error("--load-dir", f"{path} does not exist; give a directory of dump snapshots or a .npy file")
    parts = {role: p / role for role in ("prefill", "decode") if (p / role).is_dir()} or {"all": p}
    out = {}
    for role, d in parts.items():
        hist, rc = _read_history(str(d), "--load-dir")
        if rc:
            return None, rc
        bad = _check_load(hist, f"--load-dir {d}", min_windows=2)
        if bad is not None:
            return None, bad
        out[role] = hist
    return out, 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Replay recorded load per stage; print the table, the recommendation as YAML, and write the plot."""
    keep_freed_memory()  # planning's numpy temporaries reuse the heap (ascend_runtime/allocator.py)
    from ascend_runtime.balancer import evaluate as ev
    from ascend_runtime.balancer.png import Panel, line_chart

    from ascend_runtime.cli.stackargs import (
        MAX_COUNT,
        check_count,
        check_duration,
        check_input_file,
        check_output_file,
        first_error,
    )

    intervals = sorted(set(args.interval or [1, 2, 4]))
    bad = first_error(check_input_file("--load-dir", args.load_dir, directory_ok=True),
                      input_error("--stack", "is empty; name a stack or leave the option out") if args.stack == "" else None,
                      *(check_count("--interval", k, maximum=MAX_COUNT) for k in intervals),
                      check_count("--window-steps", args.window_steps, maximum=MAX_COUNT),
                      check_duration("--window-seconds", args.window_seconds),
                      check_count("--batch-tokens", args.batch_tokens, maximum=MAX_COUNT),
                      check_count("--ranks", args.ranks, maximum=MAX_COUNT),
                      check_output_file("--plot", args.plot))
    if bad is not None:  # before the replay: nothing is computed for options that cannot be used
        return bad
    loads, rc = _load_dir(args.load_dir)
    if rc:
        return rc
    policies = list(dict.fromkeys(args.policy or EVAL_POLICIES))
    if args.stack:
        from ascend_runtime.config.errors import ConfigError
        from ascend_runtime.config.loader import load_stack

        try:
            stack = load_stack(args.stack, args.stacks_dir)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        models = ev.stage_models(stack.config)
    else:
        if not args.ranks or args.ranks < 2:
            return input_error("--ranks", "give the EP size (>= 2) of the stage, or --stack")
        from ascend_runtime.config.model import ModelShape
        from ascend_runtime.hardware import CATALOGUE
        from ascend_runtime.perf.profiles import HARDWARE

        if args.hardware not in CATALOGUE:
            return input_error("--hardware", f"unknown kind {args.hardware!r}; valid: {', '.join(sorted(CATALOGUE))}")
        any_load = next(iter(loads.values()))
        shape = ModelShape(num_routed_experts=any_load.shape[2], num_layers=any_load.shape[1] + 3, num_expert_groups=1,
                           experts_per_token=min(8, any_load.shape[2]))
        spec, prof = CATALOGUE[args.hardware], HARDWARE[args.hardware]
        models = {"stage": ev._model("stage", args.ranks, shape, False, args.batch_tokens * shape.experts_per_token,
                                     prof.hbm_bandwidth, prof.flops, spec.intra_node_gbps * 1e9, spec.inter_node_gbps * 1e9,
                                     spec.devices_per_node, 0)}
    recs, panels = [], []
    for role, model in models.items():
        hist = loads.get(role, loads.get("all"))
        if hist is None:
            return input_error("--load-dir", f"no load for stage {role} (give {role}/ or an undivided directory)")
        if hist.shape[1:] != (model.layers, model.experts):
            return input_error("--load-dir", f"load is {hist.shape[1]} layers x {hist.shape[2]} experts, the {role} stage's "
                                             f"model has {model.layers} MoE layers x {model.experts} routed experts")
        if not ev.redundancy_options(model):
            return input_error("--ranks" if not args.stack else f"{role}.ep",
                               f"{model.experts} experts + 0, {model.ranks} or {2 * model.ranks} redundant do not fill "
                               f"{model.ranks} ranks evenly; use an EP size that divides {model.experts}")
        try:
            replays = ev.evaluate(hist, model, policies, intervals, progress=lambda m: print(f"replaying {m}", file=sys.stderr),
                                   window_steps=args.window_steps)
        except ValueError as exc:
            return input_error("--load-dir", str(exc))
        w = hist.shape[0] - 1
        print(f"\nstage {role}: EP {model.ranks}, {hist.shape[0]} windows x {hist.shape[1]} layers x {hist.shape[2]} experts; "
              f"{model.tokens_per_step:.0f} token-expert assignments per step; expert {model.bytes_per_expert / 1e6:.1f} MB, "
              f"link {model.link_bytes_per_s / 1e9:.1f} GB/s")
        print(f"{'policy':>15} {'redundant':>9} {'interval':>8} {'balancedness':>12} {'MoE ms/step':>11} {'moves/hour':>10}")
        for r in replays:
            print(f"{r.policy:>15} {r.redundant:>9} {r.interval:>8} {r.mean_balancedness:>12.4f} {r.mean_moe_ms:>11.3f} "
                  f"{ev.moves_per_hour(r, w, args.window_seconds):>10.0f}")
        rec = ev.recommend(model, replays, args.window_steps)
        recs.append(rec)
        best = rec["replay"]
        line = (f"recommended for {role}: {best.policy} redundant={rec['redundant_experts']} interval={best.interval} "
                f"(MoE {rec['moe_ms']:.3f} ms/step)")
        if rec["ours"] is not None:
            o = rec["ours"]
            line += (f"; ours (needs static maps, not read in-engine by 0.23.0) redundant={o.redundant} interval={o.interval}: "
                     f"{o.mean_moe_ms:.3f} ms/step")
        print(line + (f"; {rec['note']}" if rec["note"] else ""))
        shown = {}
        for r in replays:  # per policy, its best setting
            if r.policy not in shown or r.mean_moe_ms < shown[r.policy].mean_moe_ms:
                shown[r.policy] = r
        panels.append(Panel(f"{role}: balancedness on the next window (1 = even)", "balancedness",
                            {p: r.balancedness for p, r in shown.items()}))
        panels.append(Panel(f"{role}: MoE time per step, moves included", "MoE ms per step",
                            {p: r.moe_ms for p, r in shown.items()}))
    print("\n# stack settings to paste (stacks/Pulumi.<stack>.yaml)")
    print(ev.recommendation_yaml([r for r in recs if r["role"] in ("prefill", "decode")]) if args.stack
          else ev.recommendation_yaml([{**r, "role": "<stage>"} for r in recs]), end="")
    try:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)  # check_output_file allows a directory to create
        titles = line_chart(args.plot, panels)
    except OSError as exc:
        return input_error("--plot", f"cannot write {args.plot} ({exc.strerror or type(exc).__name__}); "
                                     "name a PNG file in a directory this user can write")
    print(f"wrote {args.plot} (panels: {'; '.join(titles)}; one line per policy at its best setting)")
    return 0


def cmd_record(args: argparse.Namespace) -> int:
    """Poll running simulators' expert load into dump snapshots; exit 1 if a stage got fewer than 2 windows."""
    import aiohttp  # noqa: PLC0415

    from ascend_runtime.balancer.record import record  # noqa: PLC0415
    from ascend_runtime.balancer.sources import HttpLoadSource  # noqa: PLC0415
    from ascend_runtime.cli.stackargs import (  # noqa: PLC0415
        MAX_COUNT,
        check_count,
        check_http_url,
        check_interval,
        check_output_dir,
        first_error,
        plan_or_exit,
    )

    pairs = _pairs(args.instance, "--instance")
    if isinstance(pairs, str):
        return input_error("--instance", pairs)
    if bool(args.stack) == bool(pairs):
        return input_error("--stack/--instance", "give a stack (its prefill and decode instances) or --instance "
                                                 "NAME=URL, one of the two")
    bad = first_error(check_count("--windows", args.windows, minimum=2, maximum=MAX_COUNT),
                      check_interval("--every-s", args.every_s), check_output_dir("--out", args.out),
                      *(check_http_url(f"--instance {name}", url) for name, url in pairs))
    if bad is not None:
        return bad
    out = Path(args.out)
    if out.is_dir() and any(out.iterdir()):
        return input_error("--out", f"{out} is not empty; give a new or empty directory (snapshots of two recordings "
                                    "would read as one history)")
    token, rc = env_secret("--sim-token-env", args.sim_token_env)
    if rc:
        return rc
    if args.stack:
        plan = plan_or_exit(args)
        if plan is None:
            return 2
        targets = {role: [(i.name, i.api_url) for i in plan.by_role(role)] for role in ("prefill", "decode")}
    else:
        targets = {"": pairs}
    stages: dict[str, list[Any]] = {}
    for stage, named in targets.items():
        sources = [HttpLoadSource(name, url) for name, url in named]
        stages[stage] = [_WithSimToken(s, token) for s in sources] if token else list(sources)

    async def run() -> dict[str, int]:
        async with aiohttp.ClientSession() as session:
            return await record(stages, out, args.windows, args.every_s, session,
                                say=lambda line: print(line, flush=True))

    try:
        written = asyncio.run(run())
    except KeyboardInterrupt:
        print("interrupted; the snapshots written so far are complete", file=sys.stderr)
        return 1
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
        print(f"error: cannot read expert load ({_short(exc) or type(exc).__name__}); check the instances serve "
              "GET /admin/expert_load (simulators) and --sim-token-env", file=sys.stderr)
        return 1
    short = {stage or "load": n for stage, n in written.items() if n < 2}
    if short:
        print("error: " + ", ".join(f"{stage}: {n} window(s) routed tokens" for stage, n in short.items())
              + "; balance evaluate needs 2 or more: send requests while recording (e.g. ascend-deploy check "
              "throughput) and record again into a new directory", file=sys.stderr)
        return 1
    load_dir = out if not args.stack else f"{out} --stack {args.stack}"
    counts = ", ".join(f"{stage or 'load'} {n} windows" for stage, n in written.items())
    print(f"recorded {counts} in {out}; "
          f"next: ascend-deploy balance evaluate --load-dir {load_dir} --window-seconds {args.every_s:g}")
    return 0


def _check_pod_selector(template: str) -> int | None:
    """``--pod-selector``: a label selector once ``{name}`` is replaced by an instance name."""
    from ascend_runtime.cli.stackargs import input_error, label_selector_problem  # noqa: PLC0415

    try:
        selector = template.format(name="instance-0")
    except (KeyError, IndexError, ValueError):
        return input_error("--pod-selector", "only {name} may be substituted; e.g. app.kubernetes.io/instance={name}")
    problem = label_selector_problem(selector)
    return input_error("--pod-selector", f"{problem}; e.g. app.kubernetes.io/instance={{name}}") if problem else None


def _check_configmap(value: str | None) -> int | None:
    """``--configmap NAMESPACE/NAME[:KEY]`` (None: not given): DNS-1123 namespace and name, a ConfigMap key."""
    if value is None:
        return None
    import re  # noqa: PLC0415

    from ascend_runtime.config.errors import is_dns_label, is_dns_subdomain  # noqa: PLC0415

    ref, _, key = value.partition(":")
    ns, _, name = ref.partition("/")
    if not (is_dns_label(ns) and is_dns_subdomain(name)) or (key and not re.fullmatch(r"[-._A-Za-z0-9]{1,253}", key)):
        return input_error("--configmap", f"{value[:60]!r}: expected NAMESPACE/NAME[:KEY] (DNS-1123 names, a key of "
                                          "letters, digits, '-', '_', '.'), e.g. deepseek/expert-map:expert_map.json")
    return None


def _pairs(values: list[str], flag: str) -> list[tuple[str, str]] | str:
    out = []
    for v in values:
        name, sep, target = v.partition("=")
        if not sep or not name or not target:
            return f"{flag} {v!r}: expected NAME=VALUE"
        out.append((name, target))
    return out


class _BearerSession:
    """The daemon's client session, adding ``Authorization: Bearer <token>`` to each GET and POST."""

    def __init__(self, session: Any, token: str) -> None:
        self._session, self._auth = session, {"Authorization": f"Bearer {token}"}

    def get(self, url: str, **kwargs: Any) -> Any:
        return self._session.get(url, headers={**(kwargs.pop("headers", None) or {}), **self._auth}, **kwargs)

    def post(self, url: str, **kwargs: Any) -> Any:
        return self._session.post(url, headers={**(kwargs.pop("headers", None) or {}), **self._auth}, **kwargs)


class _WithSimToken:
    """An instance's load source or applier whose requests to the simulator carry its admin token."""

    def __init__(self, inner: Any, token: str) -> None:
        self.inner, self.name, self._token = inner, inner.name, token

    async def collect(self, session: Any) -> Any:
        return await self.inner.collect(_BearerSession(session, self._token))

    async def apply(self, session: Any, doc: dict[str, Any]) -> Any:
        return await self.inner.apply(_BearerSession(session, self._token), doc)


def cmd_serve(args: argparse.Namespace) -> int:
    """Build the daemon from arguments and run it until interrupted."""
    keep_freed_memory()  # planning's numpy temporaries reuse the heap (ascend_runtime/allocator.py)
    from ascend_runtime.balancer.apply import (
        DrainRestartApplier,
        NoopApplier,
        SimulatorApplier,
    )
    from ascend_runtime.balancer.daemon import BalancerConfig, BalancerDaemon, Instance
    from ascend_runtime.balancer.placement import PlacementConfig
    from ascend_runtime.balancer.publish import ConfigMapPublisher, FilePublisher
    from ascend_runtime.balancer.sources import DirLoadSource, HttpLoadSource

    from ascend_runtime.cli.stackargs import (
        MAX_COUNT,
        check_bind_host,
        check_count,
        check_dns_label,
        check_env_name,
        check_http_url,
        check_interval,
        check_log_level,
        check_number,
        check_output_file,
        check_port,
        check_text,
        first_error,
        log_level,
        path_problem,
    )

    http, dirs = _pairs(args.instance, "--instance"), _pairs(args.dump_dir, "--dump-dir")
    for parsed, flag in ((http, "--instance"), (dirs, "--dump-dir")):
        if isinstance(parsed, str):
            return input_error(flag, parsed)
    if not http and not dirs:
        return input_error("--instance/--dump-dir", "give at least one instance to collect load from")
    names = [name for name, _ in [*http, *dirs]]
    bad = first_error(*(check_text("--instance/--dump-dir", name, "an instance name") for name in names))
    if bad is not None:  # names reach metrics labels and log lines
        return bad
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        return input_error("--instance/--dump-dir", f"instance {twice[0]!r} is given twice; give each instance once")
    bad = first_error(
        check_log_level("--log-level", args.log_level),
        check_count("--experts", args.experts, maximum=MAX_COUNT),
        check_count("--min-windows", args.min_windows, maximum=MAX_COUNT),
        check_env_name("--token-env", args.token_env),
        check_env_name("--sim-token-env", args.sim_token_env),
        check_dns_label("--namespace", args.namespace),
        _check_configmap(args.configmap),
        _check_pod_selector(args.pod_selector),
        check_interval("--interval", args.interval),
        check_number("--decay", args.decay, 0.0, maximum=1.0),
        check_number("--min-gain", args.min_gain, 0.0, strict=False),
        check_count("--max-cycles", args.max_cycles, maximum=MAX_COUNT),
        check_port("--metrics-port", args.metrics_port),
        check_bind_host("--metrics-host", args.metrics_host) if args.metrics_port is not None else None,
        check_output_file("--publish-file", args.publish_file),
        check_http_url("--proxy", args.proxy),
        *(check_http_url(f"--instance {name}", url) for name, url in http),
        *(input_error(f"--dump-dir {name}", path_problem(d) or f"{d} is not a directory; give the directory the "
                      "rank_<r>.json dumps are written to") for name, d in dirs
          if path_problem(d) or (Path(d).exists() and not Path(d).is_dir())),
    )
    if bad is not None:
        return bad
    bad = _check_shape(1, args.experts, args.ranks, args.slots, args.groups, args.nodes)
    if bad is not None:
        return bad
    logging.basicConfig(level=log_level(args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.dry_run and not (args.publish_file or args.configmap):
        return input_error("--publish-file/--configmap", "give where to publish maps, or --dry-run")
    if args.apply == "drain-restart" and not args.proxy:
        return input_error("--proxy", "drain-restart needs the proxy URL")
    sim_token, rc = env_secret("--sim-token-env", args.sim_token_env)
    if rc:
        return rc
    core_api = None
    if args.configmap or args.apply == "drain-restart":
        from kubernetes import client
        from kubernetes import config as kconfig

        try:
            try:
                kconfig.load_incluster_config()
            except kconfig.ConfigException:
                kconfig.load_kube_config()
        except Exception as exc:  # noqa: BLE001 - the kubeconfig loader raises several kinds
            flag = "--configmap" if args.configmap else "--apply drain-restart"
            return input_error(flag, f"needs the Kubernetes API: not in a pod and the kubeconfig failed "
                                     f"({_short(exc)}); run in the cluster or set KUBECONFIG")
        core_api = client.CoreV1Api()
    publisher = None
    if args.publish_file:
        publisher = FilePublisher(args.publish_file, args.experts, args.ranks, args.slots)
    elif args.configmap:
        ref, _, key = args.configmap.partition(":")
        ns, _, name = ref.partition("/")
        if not ns or not name:
            return input_error("--configmap", "expected NAMESPACE/NAME[:KEY]")
        publisher = ConfigMapPublisher(core_api, name, ns, args.experts, key or "expert_map.json", args.ranks, args.slots)
    instances = []
    urls = dict(http)
    for name, target in [*http, *dirs]:
        source: Any
        applier: Any
        source = HttpLoadSource(name, target) if name in urls and target == urls[name] else DirLoadSource(name, target)
        if sim_token and isinstance(source, HttpLoadSource):
            source = _WithSimToken(source, sim_token)
        if args.apply == "simulator" and name in urls:
            applier = SimulatorApplier(name, urls[name])
            if sim_token:
                applier = _WithSimToken(applier, sim_token)
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
