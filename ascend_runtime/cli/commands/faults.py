"""`ascend-deploy faults watch`: drain the instances of faulted nodes in every proxy replica (docs/faults.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from ascend_runtime import eventloop
from ascend_runtime.cli.stackargs import env_secret, input_error, path_arg, path_type
from ascend_runtime.faults.signals import NODE_EVENT_NAMESPACE
from ascend_runtime.faults.sources import DEVICE_INFO_REWRITE_S, STALE_AFTER_S

PROXY_TOKEN_ENV = "ASCEND_PROXY_TOKEN"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``faults`` with the sub-command ``watch``."""
    p = subparsers.add_parser("faults", help="NPU/link fault handling: watch MindCluster signals, drain, recover")
    sub = p.add_subparsers(dest="faults_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda a: (p.print_help(sys.stderr), 2)[1])

    w = sub.add_parser("watch", help="watch the Plan's nodes; drain the instances of faulted nodes in every proxy replica",
                       description="Read the device plugin's and NodeD's fault ConfigMaps (MindCluster v26.1.0) and the "
                                   "Node objects of the Plan's nodes; drain every instance with a rank on a faulted "
                                   "node through the proxy admin API; with a spare node in the Plan, move an "
                                   "instance whose node or NPU is out onto it and cordon the node; undrain it once "
                                   "its nodes are clear and it passes /health and a PD round trip.")
    src = w.add_mutually_exclusive_group(required=True)
    src.add_argument("--stack", help="the stack whose Plan gives nodes, instances and spares")
    src.add_argument("--topology", type=path_type, metavar="FILE",
                     help="the same as JSON (what the watcher's ConfigMap carries in a cluster)")
    w.add_argument("--stacks-dir", type=path_arg, help="stacks directory for --stack (default: the project's stacks/)")
    w.add_argument("--proxy", action="append", default=[], metavar="URL", help="a proxy replica's base URL (repeat)")
    w.add_argument("--proxy-service", metavar="NAMESPACE/NAME:PORT",
                   help="drain on every endpoint of this Service (default with --stack on kubernetes/kind: the pd-proxy Service)")
    w.add_argument("--token-env", default=PROXY_TOKEN_ENV, metavar="VAR",
                   help=f"environment variable holding the proxy admin token (default {PROXY_TOKEN_ENV}; a local stack's "
                        "token file when unset)")
    sp = w.add_argument_group("recovery onto spare nodes (docs/faults.md)")
    sp.add_argument("--stack-data", type=path_type, metavar="FILE",
                    help="with --topology: the stack as JSON (the watcher's ConfigMap's stack.json), to re-plan with")
    sp.add_argument("--state-dir", type=path_arg, metavar="DIR",
                    help="a local stack's state directory (default: the stack's under the state root); its nodes are "
                         "down when a process on their address died")
    sp.add_argument("--no-spares", action="store_true", help="never move a faulted instance to a spare node")
    sp.add_argument("--spare-ready-timeout", type=float, metavar="S",
                    help="longest wait for an instance recreated on spares (default 60 local, 1800 in a cluster)")
    k = w.add_argument_group("Kubernetes API (default: the pod's service account, else the kubeconfig)")
    k.add_argument("--kube-api", metavar="URL", help="API server base URL")
    k.add_argument("--kube-token-env", metavar="VAR", help="environment variable holding a bearer token for --kube-api")
    k.add_argument("--kube-context", help="kubeconfig context")
    k.add_argument("--event-namespace", default=NODE_EVENT_NAMESPACE,
                   help=f"namespace of the Events about nodes: only {NODE_EVENT_NAMESPACE} (the API server refuses Node "
                        "Events elsewhere)")
    k.add_argument("--no-events", action="store_true", help="post no Events")
    k.add_argument("--device-plugin-namespace", default="kube-system",
                   help="namespace of mindx-dl-deviceinfo-<node> (default kube-system)")
    k.add_argument("--noded-namespace", default="mindx-dl", help="namespace of mindx-dl-nodeinfo-<node> (default mindx-dl)")
    k.add_argument("--no-noded", action="store_true", help="do not read NodeD's ConfigMaps")
    k.add_argument("--no-node-objects", action="store_true", help="do not read the Node objects (Ready condition)")
    t = w.add_argument_group("timing (seconds)")
    t.add_argument("--interval", type=float, default=1.0, help="between cycles (ConfigMap reads, drains); default 1")
    t.add_argument("--node-interval", type=float, default=None,
                   help="between Node object reads; default 5 (a local stack: --interval)")
    t.add_argument("--settle", type=float, default=10.0, help="signals clear this long before recovery checks; default 10")
    t.add_argument("--recheck", type=float, default=5.0, help="between failed recovery checks; default 5")
    t.add_argument("--check-timeout", type=float, default=30.0, help="per recovery request; default 30")
    t.add_argument("--api-timeout", type=float, default=2.0, help="per Kubernetes or proxy admin call; default 2")
    t.add_argument("--stale-after", type=float, default=STALE_AFTER_S,
                   help="a device plugin ConfigMap whose UpdateTime is older is a failed fault source (the plugin "
                        f"rewrites it at least every 300 s); default {STALE_AFTER_S}")
    w.add_argument("--metrics-host", default="127.0.0.1", help="metrics listen address (default 127.0.0.1)")
    w.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics and /healthz here")
    w.add_argument("--max-cycles", type=int, help="stop after this many cycles")
    w.add_argument("--log-level", default="INFO")
    w.set_defaults(func=cmd_watch)


def check_event_namespace(value: str) -> int | None:
    """``--event-namespace``: the one namespace the API server takes Node Events in (signals.py)."""
    if value != NODE_EVENT_NAMESPACE:
        return input_error("--event-namespace", f"{value[:60]!r}: Events about a node are accepted by the Kubernetes "
                           f"API server only in namespace {NODE_EVENT_NAMESPACE!r} (a Node has no namespace); "
                           f"leave the option out, or use --no-events")
    return None


def cmd_watch(args: argparse.Namespace) -> int:
    """Build the watcher from arguments and run it until interrupted."""
    from ascend_runtime.config.errors import ConfigError
    from ascend_runtime.faults.proxies import ProxyService
    from ascend_runtime.faults.topology import Topology
    from ascend_runtime.faults.watcher import WatcherConfig

    from ascend_runtime.cli.stackargs import (
        MAX_COUNT,
        check_bind_host,
        check_count,
        check_dns_label,
        check_duration,
        check_env_name,
        check_http_url,
        check_input_file,
        check_interval,
        check_log_level,
        check_port,
        check_proxy_service,
        check_text,
        first_error,
        log_level,
    )

    bad = first_error(
        input_error("--stack", "is empty; name a stack") if args.stack == "" else None,
        check_input_file("--topology", str(args.topology) if args.topology is not None else None),
        check_input_file("--stack-data", str(args.stack_data) if args.stack_data is not None else None),
        input_error("--stack-data", "goes with --topology (with --stack the stack files are read)")
        if args.stack_data is not None and args.stack else None,
        check_log_level("--log-level", args.log_level),
        *(check_http_url("--proxy", url) for url in args.proxy),
        check_http_url("--kube-api", args.kube_api),
        check_env_name("--token-env", args.token_env),
        check_env_name("--kube-token-env", args.kube_token_env),
        check_event_namespace(args.event_namespace),
        check_dns_label("--device-plugin-namespace", args.device_plugin_namespace),
        check_dns_label("--noded-namespace", args.noded_namespace),
        check_bind_host("--metrics-host", args.metrics_host) if args.metrics_port is not None else None,
        check_proxy_service("--proxy-service", args.proxy_service),
        check_text("--kube-context", args.kube_context, "a kubeconfig context name"),
        *(check_interval("--" + name.replace("_", "-"), getattr(args, name)) for name in ("interval", "node_interval")
          if getattr(args, name) is not None),
        check_duration("--spare-ready-timeout", args.spare_ready_timeout) if args.spare_ready_timeout is not None else None,
        *(check_duration("--" + name.replace("_", "-"), getattr(args, name)) for name in ("check_timeout", "api_timeout")),
        *(check_duration("--" + name, getattr(args, name), 0.0, strict=False) for name in ("settle", "recheck")),
        check_duration("--stale-after", args.stale_after, float(DEVICE_INFO_REWRITE_S)),
        check_port("--metrics-port", args.metrics_port),
        check_count("--max-cycles", args.max_cycles, maximum=MAX_COUNT),
    )
    if bad is not None:
        return bad
    logging.basicConfig(level=log_level(args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    namespace = None
    service_default = None
    stack = None
    local_state = None
    if args.stack:
        from ascend_runtime.config.loader import load_stack
        from ascend_runtime.planner import build_plan

        try:
            stack = load_stack(args.stack, args.stacks_dir)
            plan = build_plan(stack)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        topology = Topology.from_plan(plan)
        if plan.target == "local" and not args.kube_api:
            local_state, rc = _local_state(args, plan.stack)
            if rc:
                return rc
        namespace = plan.config["kubernetes"]["namespace"]
        if plan.target in ("kubernetes", "kind"):
            from ascend_runtime.render.objects.common import PROXY_NAME

            service_default = f"{namespace}/{PROXY_NAME}:{plan.proxy_port}"
        elif not args.proxy:
            args.proxy = [plan.proxy_url]
    else:
        from ascend_runtime.cli.stackargs import read_json  # noqa: PLC0415

        doc, rc = read_json("--topology", str(args.topology), "topology")
        if rc:
            return rc
        try:
            topology = Topology.from_dict(doc)  # type: ignore[arg-type]
        except (ValueError, KeyError, TypeError) as exc:
            return input_error("--topology", f"{args.topology}: {exc}")
        bad = _topology_names(doc, str(args.topology))  # type: ignore[arg-type]
        if bad is not None:
            return bad
        if args.stack_data is not None:
            stack, rc = _stack_data(str(args.stack_data))
            if rc:
                return rc
    service = None
    spec = args.proxy_service or (service_default if not args.proxy else None)
    if spec:
        try:
            service = ProxyService.parse(spec)
        except ValueError as exc:
            return input_error("--proxy-service", str(exc))
    if not args.proxy and service is None:
        return input_error("--proxy/--proxy-service", "give the proxy replicas to drain on")
    token = os.environ.get(args.token_env, "")
    if not token and local_state is not None:
        from ascend_runtime.local.lifecycle import read_tokens  # noqa: PLC0415

        token = read_tokens(local_state).get(PROXY_TOKEN_ENV, "")
    if not token:
        return input_error("--token-env", f"variable {args.token_env} is not set or empty (the proxy admin token)")
    kube_token, rc = env_secret("--kube-token-env", args.kube_token_env)
    if rc:
        return rc
    from ascend_runtime.faults.kube import from_environment

    try:
        auth = None if local_state is not None else from_environment(args.kube_api, kube_token, args.kube_context)
    except Exception as exc:  # noqa: BLE001 - the kubeconfig loader raises several kinds
        return input_error("--kube-api", f"no Kubernetes API: not in a pod and the kubeconfig failed ({exc}); "
                                  "give --kube-api URL or a kubeconfig")
    event_ns = None if args.no_events else args.event_namespace
    if args.node_interval is None:
        args.node_interval = args.interval if local_state is not None else 5.0
    cfg = WatcherConfig(
        interval_s=args.interval, node_interval_s=args.node_interval, settle_s=args.settle, recheck_s=args.recheck,
        check_timeout_s=args.check_timeout, event_namespace=event_ns,
        device_plugin_namespace=args.device_plugin_namespace,
        noded_namespace=None if args.no_noded or local_state is not None else args.noded_namespace,
        read_nodes=not args.no_node_objects,
        stale_after_s=args.stale_after,
        metrics_host=args.metrics_host, metrics_port=args.metrics_port,
    )
    try:
        eventloop.run(_run(args, topology, cfg, token, auth, service, stack, local_state))
    except KeyboardInterrupt:
        pass
    except SpareSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"ascend-deploy faults watch: {exc}", file=sys.stderr)
        return 1
    return 0


def _topology_names(doc: dict, source: str) -> int | None:  # type: ignore[type-arg]
    """Node names of a topology file are Kubernetes node names (they reach API paths: the fault ConfigMaps
    ``mindx-dl-deviceinfo-<node>``), instance names text without spaces; neither is given twice."""
    from ascend_runtime.config.errors import is_dns_subdomain  # noqa: PLC0415

    for key, ok, what in (("nodes", lambda n: is_dns_subdomain(n, 63), ("a Kubernetes node name (DNS-1123 subdomain, "
                                                                         "at most 63 characters)")),
                          ("instances", lambda n: 0 < len(n) <= 256 and not any(c.isspace() or ord(c) < 0x20 for c in n),
                           "an instance name (no spaces or control characters)")):
        seen: set[str] = set()
        for k, item in enumerate(doc[key]):
            name = item["name"]
            if not ok(name):
                return input_error(f"--topology {key}[{k}].name", f"{name[:60]!r} is not {what}; {source}")
            if name in seen:
                return input_error(f"--topology {key}[{k}].name", f"{name[:60]!r} is given twice; {source}")
            seen.add(name)
    return None


async def _run(args: argparse.Namespace, topology, cfg, token: str, auth, service, stack=None,  # type: ignore[no-untyped-def]
               local_state: Path | None = None) -> None:
    import aiohttp

    from ascend_runtime.faults.kube import KubeClient
    from ascend_runtime.faults.watcher import FaultWatcher
    from ascend_runtime.pdplanner.actuate import PlannerProxyAdmin

    async with aiohttp.ClientSession() as session:
        kube = KubeClient(auth, session, args.api_timeout) if auth is not None else None
        source = kube
        if local_state is not None:  # no API server: the nodes are the stack's processes
            from ascend_runtime.faults.local_nodes import LocalNodes  # noqa: PLC0415
            from ascend_runtime.planner import build_plan  # noqa: PLC0415

            source = LocalNodes(build_plan(stack), local_state, args.api_timeout)  # type: ignore[assignment]
        proxies = PlannerProxyAdmin(session, token, args.proxy, service, kube, timeout_s=args.api_timeout,
                                    refresh_s=args.node_interval)
        if stack is not None and not args.no_spares:
            from ascend_runtime.faults.spares import RecoveringWatcher  # noqa: PLC0415

            from ascend_runtime.faults.topology import Topology  # noqa: PLC0415

            spares = await _spare_recovery(args, stack, kube, local_state)
            watcher: FaultWatcher = RecoveringWatcher(Topology.from_plan(spares.plan), source, proxies, cfg, session,
                                                      spares=spares)
        else:
            watcher = FaultWatcher(topology, source, proxies, cfg, session)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(s, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await watcher.run(stop, args.max_cycles)



def _local_state(args: argparse.Namespace, stack: str) -> tuple[Path | None, int]:
    """The running local stack's state directory (``--state-dir`` or the default), or an exit code 2."""
    from ascend_runtime.local.state import StackState, default_state_root  # noqa: PLC0415

    state_dir = Path(args.state_dir) if args.state_dir else default_state_root() / stack
    if StackState.load(state_dir) is None:
        return None, input_error("--stack", f"local stack {stack} is not running (no state in {state_dir}); start it "
                                 f"with `ascend-deploy up --stack {stack} --detach`, or name its --state-dir")
    return state_dir, 0


def _stack_data(path: str):  # type: ignore[no-untyped-def]
    """The Stack of a ``--stack-data`` file, or an exit code 2 naming the file and the key."""
    from ascend_runtime.cli.stackargs import read_json  # noqa: PLC0415
    from ascend_runtime.faults.stack_data import stack_from_document  # noqa: PLC0415

    doc, rc = read_json("--stack-data", path, "stack")
    if rc:
        return None, rc
    try:
        return stack_from_document(doc, path), 0
    except ValueError as exc:
        return None, input_error("--stack-data", f"{path}: {exc}")


async def _spare_recovery(args: argparse.Namespace, stack, kube, local_state: Path | None):  # type: ignore[no-untyped-def]
    """The recovery onto spares: its actuator (the local stack's processes, or the cluster's objects) and the
    Plan with the nodes an earlier watcher took out (their record, oldest first)."""
    from ascend_runtime.faults.spares import SpareRecovery  # noqa: PLC0415
    from ascend_runtime.planner import build_plan, plan_without  # noqa: PLC0415

    if local_state is not None:
        from ascend_runtime.faults.spares_local import LocalSpares  # noqa: PLC0415

        actuator = LocalSpares(local_state, args.stacks_dir, args.spare_ready_timeout or 60.0)
    else:
        from ascend_runtime.faults.spares_kube import FIELD_MANAGER, KubeSpares  # noqa: PLC0415
        from ascend_runtime.rollout.kube import KubeWorkloads, api_client  # noqa: PLC0415

        token = os.environ.get(args.kube_token_env) if args.kube_token_env else None
        workloads = KubeWorkloads(api_client(args.kube_api, token, args.kube_context), args.api_timeout * 5,
                                  field_manager=FIELD_MANAGER)
        actuator = KubeSpares(kube, workloads, frozenset(stack.secret_keys), args.spare_ready_timeout or 1800.0)  # type: ignore[assignment]
    from ascend_runtime.config.errors import ConfigError  # noqa: PLC0415
    from ascend_runtime.faults.kube import KubeError  # noqa: PLC0415
    from ascend_runtime.planner.spares import NoSpare  # noqa: PLC0415

    plan = build_plan(stack)
    try:
        taken = await actuator.taken_out(plan)
    except ValueError as exc:  # the local record is not the watcher's
        raise SpareSetupError(f"--state-dir: {exc}", 2) from None
    except KubeError as exc:
        raise SpareSetupError(f"reading which nodes an earlier watcher took out (their annotation "
                              f"ascend-deepseek/out-of-service): {exc}; the watcher plans from them, so it stops", 1) from None
    if taken:
        logging.getLogger(__name__).warning("nodes taken out of service before: %s; planning without them",
                                            ", ".join(taken))
        try:
            plan = plan_without(stack, taken)
        except (NoSpare, ConfigError) as exc:
            raise SpareSetupError(f"the nodes taken out before ({', '.join(taken)}) no longer fit the stack: {exc}; "
                                  "set their devices_out_of_service in the inventory or add spares", 2) from None
    return SpareRecovery(stack, plan, actuator, list(taken))


class SpareSetupError(Exception):
    """The recovery onto spares cannot start (the message names what and the fix); ``code``: the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
