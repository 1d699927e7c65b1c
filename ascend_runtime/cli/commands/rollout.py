"""`ascend-deploy rollout --stack S`: upgrade the engine instances one at a time without dropping requests.

Per instance: drain in every proxy replica, wait for its in-flight requests (bounded),
replace it, post-check it (``/health``, a PD round trip), undrain, next. The first
failure stops the rollout and leaves the rest on the old version (docs/rollout.md).
Exit codes: 0 every instance done, 1 a step failed (or interrupted), 2 invalid input.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ascend_runtime.cli.stackargs import add_stack_options, env_secret, input_error, path_arg

PROXY_TOKEN_ENV = "ASCEND_PROXY_TOKEN"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the `rollout` sub-command."""
    p = subparsers.add_parser(
        "rollout", help="upgrade engine instances one at a time: drain, wait, replace, check, undrain",
        description="Replace every engine instance of a stack by its new version, one instance at a time: drain it "
                    "in every proxy replica, wait until no request runs on it, replace it, check /health and a PD "
                    "round trip, undrain it, and wait until the proxies route to it again. The first failed step "
                    "stops the rollout; the instances after it are not touched. The new version: on a local stack "
                    "the stack file as it reads now (each simulator restarts from it); on kubernetes/kind the "
                    "engine image (--engine-image, default the stack file's). Exit 0 done, 1 a step failed, "
                    "2 invalid input.")
    add_stack_options(p)
    p.add_argument("--dry-run", action="store_true", help="print the order and what each step would do; change nothing")
    p.add_argument("--instance", action="append", default=[], metavar="NAME",
                   help="roll only this instance (repeat; default every instance)")
    p.add_argument("--from", dest="start", metavar="NAME",
                   help="start at this instance, skipping the ones before it (after a stopped rollout)")
    p.add_argument("--include-drained", action="store_true",
                   help="also roll instances already drained in a proxy (they are undrained after their checks pass)")
    p.add_argument("--migrate", action="store_true",
                   help="drain decode instances with stream migration: their in-flight streams continue on other "
                        "decode instances (docs/proxy.md) instead of the drain waiting for them to finish")
    p.add_argument("--allow-downtime", action="store_true",
                   help="roll a role that has a single instance (its requests fail while it is replaced)")
    t = p.add_argument_group("bounds (seconds)")
    t.add_argument("--drain-timeout-s", type=float, default=120.0,
                   help="wait at most this long for the instance's in-flight requests (default 120)")
    t.add_argument("--on-drain-timeout", choices=["stop", "replace"], default="stop",
                   help="when requests are still in flight then: stop the rollout and undrain the untouched "
                        "instance (default), or replace it anyway (those requests end with an error)")
    t.add_argument("--ready-timeout-s", type=float, default=None,
                   help="wait at most this long for the new instance to be ready (default 60 local, 900 local vLLM servers, 1800 kubernetes)")
    t.add_argument("--check-timeout-s", type=float, default=30.0, help="per post-check request (default 30)")
    t.add_argument("--routable-timeout-s", type=float, default=60.0,
                   help="after the undrain, wait at most this long until every proxy replica routes to it (default 60)")
    t.add_argument("--poll-s", type=float, default=None, help="between status reads (default 0.2 local, 2 kubernetes)")
    loc = p.add_argument_group("local stacks")
    loc.add_argument("--state-dir", metavar="DIR", type=path_arg,
                     help="the running stack's state (default $ASCEND_DEPLOY_STATE_DIR/<stack> or ~/.local/state/ascend-deploy/<stack>)")
    k = p.add_argument_group("kubernetes and kind stacks")
    k.add_argument("--engine-image", metavar="IMAGE",
                   help="the new engine image (default: the stack file's engine.image; on kind simulator.image, "
                   "by default the runtime image)")
    k.add_argument("--proxy", action="append", default=[], metavar="URL",
                   help="a proxy replica's base URL (repeat; default: every endpoint of the pd-proxy Service)")
    k.add_argument("--proxy-service", metavar="NAMESPACE/NAME:PORT", help="drain on every endpoint of this Service")
    k.add_argument("--token-env", default=PROXY_TOKEN_ENV, metavar="VAR",
                   help=f"variable holding the proxy admin token (default {PROXY_TOKEN_ENV}; local stacks read "
                        "their token file)")
    k.add_argument("--engine-urls", choices=["node", "service"], default="node",
                   help="post-check the leaders at their node address (host network, default) or at their "
                        "<inst>-api Service (when run inside the cluster)")
    k.add_argument("--kube-api", metavar="URL", help="API server base URL (default: the pod's service account, else the kubeconfig)")
    k.add_argument("--kube-token-env", metavar="VAR", help="variable holding a bearer token for --kube-api")
    k.add_argument("--kube-context", help="kubeconfig context")
    p.set_defaults(func=cmd_rollout)


def _say(text: str) -> None:
    try:
        print(text, flush=True)
    except (OSError, ValueError):
        pass


def _check_bounds(args: argparse.Namespace) -> int | None:
    from ascend_runtime.cli.stackargs import (  # noqa: PLC0415
        check_duration,
        check_env_name,
        check_http_url,
        check_interval,
        check_text,
        first_error,
    )
    from ascend_runtime.faults.proxies import ProxyService  # noqa: PLC0415
    from ascend_runtime.config.errors import is_image_ref  # noqa: PLC0415

    bad = first_error(*(check_duration("--" + name.replace("_", "-"), getattr(args, name))
                        for name in ("drain_timeout_s", "ready_timeout_s", "check_timeout_s", "routable_timeout_s")),
                      check_interval("--poll-s", args.poll_s),
                      check_text("--kube-context", args.kube_context, "a kubeconfig context name"),
                      input_error("--state-dir", f"{args.state_dir} is not a directory; name the running stack's "
                                  "state directory") if args.state_dir and Path(args.state_dir).exists()
                      and not Path(args.state_dir).is_dir() else None)
    if bad is not None:
        return bad
    if args.engine_image is not None and not is_image_ref(args.engine_image):
        return input_error("--engine-image", f"not a container image reference: {args.engine_image!r} "
                           "([registry/]repository[:tag][@digest], repository in lowercase, e.g. "
                           "quay.io/ascend/vllm-ascend:v0.23.0)")
    if any(not n for n in args.instance) or args.start == "":
        return input_error("--instance/--from", "an instance name cannot be empty")
    # instance names reach the messages, logs and proxy admin URLs: no control characters, shown quoted
    bad = first_error(*(check_text("--instance", n, "an instance name") for n in args.instance),
                      check_text("--from", args.start, "an instance name"))
    if bad is not None:
        return bad
    if args.proxy_service is not None:
        try:
            ProxyService.parse(args.proxy_service)
        except ValueError as exc:
            return input_error("--proxy-service", str(exc))
    return first_error(*(check_http_url("--proxy", url) for url in args.proxy),
                       check_http_url("--kube-api", args.kube_api), check_env_name("--token-env", args.token_env),
                       check_env_name("--kube-token-env", args.kube_token_env))


def cmd_rollout(args: argparse.Namespace) -> int:
    """Validate, build the targets and the driver, run the rollout; exit 0, 1 or 2."""
    from ascend_runtime.cli.stackargs import plan_or_exit  # noqa: PLC0415
    from ascend_runtime.rollout.order import RolloutInputError  # noqa: PLC0415

    bad = _check_bounds(args)
    if bad is not None:
        return bad
    plan = plan_or_exit(args)
    if plan is None:
        return 2
    try:
        setup = _local_setup(args, plan) if plan.target == "local" else _kube_setup(args, plan)
    except RolloutInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if isinstance(setup, int):
        return setup
    return _run(args, plan, setup)


# ---- per target kind ----------------------------------------------------------------------------------------


class Setup:
    """What a rollout needs: every serving instance, the chosen ones, the driver factory, proxies, a recovery hint."""

    def __init__(self, serving: list[Any], version: str, proxies: list[str], token: str, driver: Any,
                 recovery: Any, service: Any = None, kube_auth: Any = None) -> None:
        self.serving, self.version, self.proxies, self.token = serving, version, proxies, token
        self.driver, self.recovery, self.service, self.kube_auth = driver, recovery, service, kube_auth


def _local_setup(args: argparse.Namespace, plan: Any) -> Setup | int:
    from ascend_runtime.local.lifecycle import read_tokens  # noqa: PLC0415
    from ascend_runtime.local.state import StackState, default_state_root  # noqa: PLC0415
    from ascend_runtime.local.topology import PROXY_TOKEN_ENV as LOCAL_TOKEN  # noqa: PLC0415
    from ascend_runtime.rollout.local import LocalDriver, check_stacks_dir, local_targets  # noqa: PLC0415

    if args.engine_image:
        return input_error("--engine-image", f"stack {plan.stack} targets 'local', whose engine is the simulator: "
                           "edit the stack file (simulator.*, engine.*, the stage limits) and run rollout, which "
                           "restarts each simulator from it")
    state_dir = Path(args.state_dir) if args.state_dir else default_state_root() / plan.stack
    state = StackState.load(state_dir)
    if state is None:
        return input_error("--stack", f"local stack {plan.stack} is not running (no state in {state_dir}); "
                           f"start it with `ascend-deploy up --stack {plan.stack} --detach`")
    check_stacks_dir(state, args.stacks_dir)
    serving = local_targets(plan, state, state_dir)
    token = read_tokens(state_dir).get(LOCAL_TOKEN, "")
    if not token:
        return input_error("--state-dir", f"{state_dir}: the proxy admin token file is missing; restart the stack")
    real_engine = any(rec.kind == "vllm" for rec in state.processes)  # a vLLM server takes minutes to start
    driver = LocalDriver(plan, state, state_dir, args.stacks_dir,
                         ready_timeout_s=args.ready_timeout_s or (900.0 if real_engine else 60.0))
    proxy = state.proxy_url

    def recovery(name: str) -> list[str]:
        log = state_dir / "logs" / f"{name}.log"
        return [f"its log: {log}",
                f"fix the stack file, then: ascend-deploy rollout --stack {plan.stack} --from {name} --include-drained",
                "or, to serve with it as it is, undrain it: "
                f"curl -X POST -H \"Authorization: Bearer $(cat {state_dir / 'proxy-admin-token'})\" "
                f"-H 'Content-Type: application/json' -d '{{\"name\": \"{name}\", \"drain\": false}}' "
                f"{proxy}/admin/instances/drain"]

    version = f"the stack file of {plan.stack} as it reads now (simulator speedup {plan.config['simulator']['speedup']:g}, " \
              f"engine {plan.engine_image})"
    return Setup(serving, version, [proxy], token, driver, recovery)


def _kube_setup(args: argparse.Namespace, plan: Any) -> Setup | int:
    from ascend_runtime.faults.proxies import ProxyService  # noqa: PLC0415
    from ascend_runtime.render.objects import build_system  # noqa: PLC0415
    from ascend_runtime.render.objects.common import PROXY_NAME  # noqa: PLC0415
    from ascend_runtime.rollout.kube import (  # noqa: PLC0415
        KubeDriver,
        instance_workloads,
        kube_targets,
        target_image,
    )
    from ascend_runtime.rollout.order import ordered  # noqa: PLC0415

    namespace = plan.config["kubernetes"]["namespace"]
    image = args.engine_image or target_image(plan)
    workloads = instance_workloads(build_system(plan).engines)
    serving = ordered(kube_targets(plan, args.engine_urls == "service", namespace))
    service = None
    if args.proxy_service or not args.proxy:
        try:
            service = ProxyService.parse(args.proxy_service or f"{namespace}/{PROXY_NAME}:{plan.proxy_port}")
        except ValueError as exc:
            return input_error("--proxy-service", str(exc))
    token = os.environ.get(args.token_env, "")
    if not token and not args.dry_run:
        return input_error("--token-env", f"variable {args.token_env} is not set or empty (the proxy admin token)")
    kube_token, rc = env_secret("--kube-token-env", args.kube_token_env)
    if rc:
        return rc
    driver = KubeDriver(None, workloads, image, ready_timeout_s=args.ready_timeout_s or 1800.0,  # type: ignore[arg-type]
                        poll_s=args.poll_s or 2.0, say=_say)

    def recovery(name: str) -> list[str]:
        return [f"its pods: kubectl -n {namespace} get pods -l app.kubernetes.io/instance={name} -o wide; "
                f"kubectl -n {namespace} logs <pod>",
                f"fix the cause, or roll it back: ascend-deploy rollout --stack {plan.stack} --instance {name} "
                "--include-drained --engine-image <previous image>",
                f"then continue: ascend-deploy rollout --stack {plan.stack} --from {name} --include-drained",
                "or, to serve with it as it is, undrain it on every proxy replica (docs/runbooks/rolling-upgrade-engine.md)"]

    auth = (args.kube_api, kube_token, args.kube_context)
    return Setup(serving, f"image {image}", list(args.proxy), token, driver, recovery, service, auth)


# ---- running ---------------------------------------------------------------------------------------------------


def _run(args: argparse.Namespace, plan: Any, setup: Setup) -> int:
    from ascend_runtime import eventloop  # noqa: PLC0415
    from ascend_runtime.rollout.order import RolloutInputError, capacity_problems, select  # noqa: PLC0415

    try:
        chosen = select(setup.serving, args.instance, args.start)
    except RolloutInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problems = capacity_problems(setup.serving, chosen)
    if problems and not args.allow_downtime:
        for problem in problems:
            print(f"error: --stack {plan.stack}: {problem}", file=sys.stderr)
        return 2
    n = len(chosen)
    _say(f"rollout of stack {plan.stack} ({plan.target}): {n} instance(s), one at a time: "
         f"{', '.join(t.name for t in chosen)}")
    _say(f"new version: {setup.version}")
    if args.dry_run:
        for k, target in enumerate(chosen, 1):
            _say(f"[{k}/{n}] {target.name} ({target.role}): drain; wait for in-flight requests "
                 f"(at most {args.drain_timeout_s:g} s, then {args.on_drain_timeout}); {setup.driver.describe(target)}; "
                 f"post-check /health and a PD round trip; undrain")
        _say("dry run: nothing changed")
        return 0
    holder: dict[str, Any] = {}
    try:
        outcome = eventloop.run(_rollout(args, setup, chosen, holder))
    except KeyboardInterrupt:
        current = getattr(holder.get("rollout"), "current", None)
        where = f" while rolling {current.name}, which may be left drained" if current else ""
        print(f"rollout interrupted{where}; see GET /admin/instances of the proxy", file=sys.stderr)
        return 1
    except RolloutInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if outcome.ok:
        _say(f"rollout done: {len(outcome.done)} of {n} instance(s) replaced and serving ({setup.version})")
        return 0
    if outcome.step == "preflight":
        _say(f"rollout not started: {outcome.reason}; nothing changed")
        return 1
    _say(f"rollout STOPPED at {outcome.failed} ({outcome.step} failed): {outcome.reason}")
    _say(f"done: {', '.join(outcome.done) or 'none'}; not touched (old version): {', '.join(outcome.untouched) or 'none'}")
    if outcome.left_drained:
        _say(f"{outcome.failed} is left DRAINED in the proxy: no request reaches it. To recover:")
        for line in setup.recovery(outcome.failed):
            _say(f"  - {line}")
    return 1


async def _rollout(args: argparse.Namespace, setup: Setup, chosen: list[Any], holder: dict[str, Any]) -> Any:
    import aiohttp  # noqa: PLC0415

    from ascend_runtime.faults.proxies import ProxyAdmin  # noqa: PLC0415
    from ascend_runtime.rollout.order import RolloutInputError  # noqa: PLC0415
    from ascend_runtime.rollout.postcheck import EnginePostCheck  # noqa: PLC0415
    from ascend_runtime.rollout.steps import Rollout, RolloutOptions  # noqa: PLC0415

    local = setup.kube_auth is None
    async with aiohttp.ClientSession() as session:
        kube = None
        if setup.service is not None:
            from ascend_runtime.faults.kube import KubeClient, from_environment  # noqa: PLC0415

            try:
                kube = KubeClient(from_environment(*setup.kube_auth), session)
            except Exception as exc:  # noqa: BLE001 - the kubeconfig loader raises several kinds
                raise RolloutInputError(f"--kube-api: no Kubernetes API to find the proxy replicas ({exc}); "
                                        "give --proxy URL or --kube-api URL") from None
        if not local:
            from ascend_runtime.rollout.kube import KubeWorkloads, api_client  # noqa: PLC0415

            try:
                setup.driver.api = KubeWorkloads(api_client(*setup.kube_auth))
            except Exception as exc:  # noqa: BLE001
                raise RolloutInputError(f"--kube-api: no Kubernetes API ({exc}); give --kube-api URL or a kubeconfig") from None
        admin = ProxyAdmin(session, setup.token, setup.proxies, setup.service, kube, timeout_s=5.0)
        options = RolloutOptions(drain_timeout_s=args.drain_timeout_s, routable_timeout_s=args.routable_timeout_s,
                                 poll_s=args.poll_s or (0.2 if local else 2.0), on_drain_timeout=args.on_drain_timeout,
                                 include_drained=args.include_drained, migrate=args.migrate)
        rollout = Rollout(chosen, setup.serving, admin, setup.driver, EnginePostCheck(session, args.check_timeout_s),
                          options, _say)
        holder["rollout"] = rollout
        return await rollout.run()
