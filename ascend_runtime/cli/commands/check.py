"""`ascend-deploy check smoke|throughput`: post-deploy checks against an OpenAI endpoint.

Exit codes: 0 pass, 1 a check failed, 2 invalid input (the message names the option).
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `check` with the sub-commands `smoke` and `throughput`."""
    from ascend_runtime.cli.stackargs import path_arg, path_arg_or_dash, path_type  # noqa: PLC0415 - when `check` runs

    check = subparsers.add_parser("check", help="post-deploy checks: smoke, throughput")
    sub = check.add_subparsers(dest="check_command", metavar="CHECK")
    check.set_defaults(func=lambda args: (check.print_help(sys.stderr), 2)[1])

    smoke = sub.add_parser("smoke", help="health, models, chat and completion (stream and not) through the PD proxy")
    smoke.add_argument("--endpoint", required=True, help="proxy base URL, e.g. http://127.0.0.1:8000")
    smoke.add_argument("--stack", help="also check every instance of this stack's Plan, its rank tables and launch files")
    smoke.add_argument("--stacks-dir", type=path_arg, help="stacks directory for --stack (default: the project's stacks/)")
    smoke.add_argument("--instance", action="append", default=[], metavar="NAME:ROLE=URL",
                       help="an engine instance to check (repeatable; ROLE prefill or decode): its /health and "
                            "/v1/models and, with decode instances given, that each PD pair moved KV")
    smoke.add_argument("--rendered", type=path_type, metavar="DIR",
                       help="with --stack: deployed rank tables and launch scripts (render output or mounted ConfigMaps) "
                       "must equal what the Plan renders")
    smoke.add_argument("--timeout-s", type=float, default=30.0, help="per-item timeout in seconds (default 30)")
    smoke.add_argument("--model", help="model name (default: first of /v1/models)")
    smoke.add_argument("--no-pd", action="store_true", help="do not require the proxy's x-prefill/x-decode-instance headers")
    smoke.add_argument("--json", dest="json_out", metavar="FILE", type=path_arg_or_dash, help="also write the report as JSON ('-' for stdout)")
    smoke.set_defaults(func=_smoke)

    tp = sub.add_parser("throughput", help="streaming load test with vLLM bench serve metrics")
    tp.add_argument("--endpoint", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    tp.add_argument("--input-len", type=int, required=True, help="prompt length in tokens (as the server counts them)")
    tp.add_argument("--output-len", type=int, required=True, help="output tokens per request (ignore_eos)")
    load = tp.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=int, help="requests in flight (all sent at once, capped)")
    load.add_argument("--request-rate", type=float, help="Poisson arrivals, requests per second")
    tp.add_argument("--num-prompts", type=int, required=True, help="measured requests")
    tp.add_argument("--warmup", type=int, default=0, help="unmeasured warm-up requests first (default 0)")
    tp.add_argument("--slo-ttft-ms", type=float, help="goodput SLO on TTFT (ms)")
    tp.add_argument("--slo-tpot-ms", type=float, help="goodput SLO on TPOT (ms)")
    tp.add_argument("--slo-e2el-ms", type=float, help="goodput SLO on E2EL (ms)")
    tp.add_argument("--npus", type=int, help="NPUs serving the endpoint, for per-NPU throughput")
    tp.add_argument("--min-goodput", type=float, help="fail when goodput (req/s) is below this (needs an SLO)")
    tp.add_argument("--max-failed", type=int, default=0, help="fail when more requests fail than this (default 0)")
    tp.add_argument("--result-json", type=path_arg, help="write the result JSON here")
    tp.add_argument("--save-detailed", action="store_true", help="add per-request lists to the result JSON")
    tp.add_argument("--model", help="model name (default: first of /v1/models)")
    tp.add_argument("--api", choices=("completions", "chat"), default="completions", help="OpenAI API (default completions)")
    tp.add_argument("--seed", type=int, default=0, help="seed for prompts and arrivals (default 0)")
    tp.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals; 1 = Poisson")
    tp.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles (default 99)")
    tp.add_argument("--timeout-s", type=float, default=600.0, help="per-request read timeout in seconds (default 600)")
    tp.add_argument("--no-progress", action="store_true", help="no progress bar")
    tp.set_defaults(func=_throughput)


def _bad(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _instance(value: str):  # noqa: ANN202 - Instance, or the reason it is not one
    """``NAME:ROLE=URL`` as a checks ``Instance``, or why it is not one."""
    from urllib.parse import urlsplit  # noqa: PLC0415

    from ascend_runtime.checks.items import Instance  # noqa: PLC0415

    head, sep, url = value.partition("=")
    name, colon, role = head.partition(":")
    if not sep or not colon or not name.strip():
        return "not NAME:ROLE=URL"
    if role not in ("prefill", "decode"):
        return f"role {role!r} is not prefill or decode"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL"
    return Instance(name.strip(), url, role)


def _smoke(args: argparse.Namespace) -> int:
    import asyncio

    from ascend_runtime.checks.http import EndpointError
    from ascend_runtime.checks.smoke import run_smoke

    from ascend_runtime.cli.stackargs import check_duration, check_output_file, first_error, input_error  # noqa: PLC0415

    bad = first_error(
        check_duration("--timeout-s", args.timeout_s),
        check_output_file("--json", args.json_out) if args.json_out != "-" else None,
        input_error("--rendered", "needs --stack: the rendered files are compared with that stack's Plan")
        if args.rendered is not None and not args.stack else None,
        input_error("--rendered", f"{args.rendered} is not a directory; give the output directory of "
                    "`ascend-deploy render` (or the mounted rank-table and launch ConfigMaps)")
        if args.rendered is not None and args.stack and not args.rendered.is_dir() else None,
        input_error("--model", "must not be empty; leave it out to use the first of /v1/models")
        if args.model is not None and not args.model.strip() else None,
    )
    if bad is not None:  # before any request
        return bad
    instances = []
    for value in args.instance:
        parsed = _instance(value)
        if isinstance(parsed, str):
            return input_error("--instance", f"{value!r}: {parsed}; write NAME:ROLE=URL, e.g. "
                               "decode-0:decode=http://10.0.0.5:8001")
        instances.append(parsed)
    try:
        report = asyncio.run(
            run_smoke(
                args.endpoint, instances, stack=args.stack, stacks_dir=args.stacks_dir, rendered_dir=args.rendered,
                timeout_s=args.timeout_s, model=args.model, require_pd=not args.no_pd
            )
        )
    except EndpointError as exc:
        return _bad(f"--endpoint: {exc}")
    lines = sys.stderr if args.json_out == "-" else sys.stdout  # with --json -, stdout is the JSON document alone
    for item in report.items:
        print(item.line(), file=lines)
    n_fail = len(report.failures)
    if report.passed:
        print(f"smoke PASSED: {len(report.items)} items", file=lines)
    else:
        print(f"smoke FAILED: {n_fail} of {len(report.items)} items failed: " + "; ".join(i.name for i in report.failures),
              file=lines)
    if args.json_out:
        text = json.dumps(report.to_dict(), indent=2)
        if args.json_out == "-":
            print(text)
        else:
            from ascend_runtime.cli.stackargs import write_output  # noqa: PLC0415

            bad = write_output("--json", args.json_out, text + "\n")
            if bad is not None:
                return bad
    return 0 if report.passed else 1


def _percentiles(text: str) -> tuple[float, ...]:
    vals = tuple(float(x) for x in text.split(",") if x.strip())
    if not vals or any(not 0 < v < 100 for v in vals):
        raise ValueError
    return tuple(sorted(set(vals) | {99.0}))


def _throughput(args: argparse.Namespace) -> int:
    from ascend_runtime import eventloop
    from ascend_runtime.checks.http import EndpointError
    from ascend_runtime.checks.loadgen import ThroughputConfig, run_throughput
    from ascend_runtime.checks.metrics import SLO
    from ascend_runtime.checks.report import format_summary

    try:
        percentiles = _percentiles(args.metric_percentiles)
    except ValueError:
        return _bad("--metric-percentiles must be comma-separated numbers between 0 and 100")
    slo = SLO(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2el_ms)
    if args.min_goodput is not None and not slo.any:
        return _bad("--min-goodput needs at least one of --slo-ttft-ms, --slo-tpot-ms, --slo-e2el-ms")
    from ascend_runtime.cli.stackargs import (  # noqa: PLC0415
        check_count,
        check_duration,
        check_number,
        check_output_file,
        first_error,
    )
    from ascend_runtime.config.errors import MAX_DURATION_S, MAX_REQUEST_RATE  # noqa: PLC0415

    bad = first_error(check_count("--max-failed", args.max_failed, 0),
                      check_number("--min-goodput", args.min_goodput, 0.0, strict=False, maximum=MAX_REQUEST_RATE),
                      check_number("--request-rate", args.request_rate, maximum=MAX_REQUEST_RATE),
                      check_duration("--timeout-s", args.timeout_s),
                      *(check_duration(flag, value, maximum=MAX_DURATION_S * 1000, unit="milliseconds") for flag, value in
                        (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms),
                         ("--slo-e2el-ms", args.slo_e2el_ms))),
                      check_output_file("--result-json", args.result_json))
    if bad is not None:  # before any request
        return bad
    cfg = ThroughputConfig(
        endpoint=args.endpoint,
        input_len=args.input_len,
        output_len=args.output_len,
        num_prompts=args.num_prompts,
        concurrency=args.concurrency,
        request_rate=args.request_rate,
        warmup=args.warmup,
        slo=slo,
        npus=args.npus,
        model=args.model,
        api=args.api,
        seed=args.seed,
        timeout_s=args.timeout_s,
        burstiness=args.burstiness,
        percentiles=percentiles,
        progress=not args.no_progress,
    )
    try:
        cfg.validate()
    except EndpointError as exc:
        return _bad(f"--endpoint: {exc}")
    except ValueError as exc:
        return _bad(str(exc))
    try:
        result = eventloop.run(run_throughput(cfg))
    except Exception as exc:  # noqa: BLE001 - setup failures (model list, prompt probes) fail the check
        print(f"FAIL  throughput setup: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    data = result.to_dict(detailed=args.save_detailed)
    print(format_summary(data))
    if args.result_json:
        from ascend_runtime.cli.stackargs import write_output  # noqa: PLC0415

        bad = write_output("--result-json", args.result_json, json.dumps(data, indent=2) + "\n")
        if bad is not None:
            return bad
    failures = []
    if result.completed == 0:
        failures.append("no request completed")
    if result.failed > args.max_failed:
        failures.append(f"{result.failed} requests failed (--max-failed {args.max_failed})")
    goodput = data["request_goodput"]
    if args.min_goodput is not None and (goodput or 0.0) < args.min_goodput:
        failures.append(f"goodput {goodput or 0.0:.3f} req/s < --min-goodput {args.min_goodput:g}")
    if args.min_goodput is not None:  # judged under the SLOs: most requests missing one fails the check
        failures += [f"median {name} {median:.1f} ms > --slo-{name.lower()}-ms {limit:g}"
                     for name, median, limit in result.median_misses()]
    if failures:
        print("throughput FAILED: " + "; ".join(failures))
        return 1
    print("throughput PASSED")
    return 0
