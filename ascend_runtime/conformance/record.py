"""Record the fixtures of the supported vLLM release: the corpus sent to a real vLLM OpenAI server.

    python -m ascend_runtime.conformance.record --start [--out DIR]     # start the kit's real engine, record, stop it
    python -m ascend_runtime.conformance.record --url URL [--out DIR]   # a server that is already running

``--start`` needs the real engine installed (``ascend-deploy engine install``) and serves the kit's
generated model as ``deepseek-ai/DeepSeek-R1`` with the NixlConnector (the local-vllm target's own
argv and environment), so the metrics include the connector's families. The corpus is sent twice and
the fixtures are written only when both recordings are the same (a case whose shape changes from run
to run cannot be a fixture); the server must answer ``/version`` with the release of ``--out``'s
directory name (``vllm-<release>``). Exit codes: 0 written, 1 the server failed or was not stable,
2 invalid arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ascend_runtime.conformance.corpus import MODEL, corpus
from ascend_runtime.conformance.drive import drive
from ascend_runtime.conformance.fixtures import DEFAULT_DIR, write_fixtures

#: Seconds the started server may take to serve (35-60 s on an idle 2-core machine; minutes when loaded).
START_TIMEOUT_S = 900.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ascend_runtime.conformance.record",
                                description="Record vLLM's answers to the conformance corpus as fixtures.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running vLLM OpenAI server serving deepseek-ai/DeepSeek-R1, e.g. "
                                     "http://127.0.0.1:8000")
    where.add_argument("--start", action="store_true", help="start the kit's real engine (NixlConnector), "
                                                             "record, stop it")
    p.add_argument("--out", default=str(DEFAULT_DIR), help=f"fixture directory, named vllm-<release> "
                                                           f"(default {DEFAULT_DIR})")
    return p


def _check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The release the output directory names; exits 2 for a bad ``--url`` or ``--out``."""
    if args.url is not None:
        parsed = urllib.parse.urlparse(args.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            p.error(f"--url: {args.url!r} is not an http(s)://host[:port] URL")
    out = Path(args.out)
    if not out.name.startswith("vllm-") or len(out.name) == len("vllm-"):
        p.error(f"--out: the directory must be named vllm-<release> (got {out.name!r})")
    if out.exists() and not out.is_dir():
        p.error(f"--out: {out} exists and is not a directory")
    return out.name[len("vllm-"):]


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def server_release(url: str) -> str:
    """The ``version`` the server's ``/version`` answers."""
    status, raw = _get(url + "/version")
    if status != 200:
        raise RuntimeError(f"{url}/version answered {status}")
    return str(json.loads(raw)["version"])


def _start_engine(log_dir: Path) -> tuple[str, int]:
    """Start one real-engine server (the kit's builders, NixlConnector); (url, pid) once healthy."""
    import socket

    from ascend_runtime.local.processes import is_alive, start_process, stop_process_group
    from ascend_runtime.local.vllm_engine import prepare
    from ascend_runtime.local.vllm_engine.install import engine_env, missing_reason
    from ascend_runtime.local.vllm_engine.server import (ISOLATED_VARIABLES, kv_transfer_config, server_argv,
                                                         server_env)

    reason = missing_reason()
    if reason is not None:
        raise RuntimeError(reason)

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    port, side = free_port(), free_port()
    argv = server_argv(engine_env(), prepare(0), MODEL, "127.0.0.1", port, 16, kv_transfer_config())
    log = log_dir / "vllm-server.log"
    pid = start_process(argv, log, server_env("127.0.0.1", side), unset=ISOLATED_VARIABLES)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not is_alive(pid):
            raise RuntimeError(f"the vLLM server exited during start-up:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if _get(url + "/health")[0] == 200:
                return url, pid
        except OSError:
            pass
        time.sleep(1.0)
    stop_process_group(pid)
    raise RuntimeError(f"the vLLM server at {url} was not healthy after {START_TIMEOUT_S:g} s (log {log})")


def unstable_cases(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """Names of the cases whose shape differs between two recordings."""
    return sorted(name for name in first if first[name] != second.get(name))


def record(url: str, out: Path, release: str, say: Any = print) -> int:
    """Record ``url`` twice into ``out``; 0 written, 1 refused (wrong release, unstable shapes)."""
    found = server_release(url)
    if found != release:
        say(f"error: {url} serves vLLM {found}, the fixtures in {out} are for {release}")
        return 1
    first = asyncio.run(drive(url))
    second = asyncio.run(drive(url))
    unstable = unstable_cases(first, second)
    if unstable:
        say(f"error: shapes differ between two recordings, nothing written: {', '.join(unstable)}")
        return 1
    written = write_fixtures(out, first, release)
    say(f"recorded {len(first)} cases from {url} (vLLM {found}) into {', '.join(str(p) for p in written)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    release = _check_args(p, args)
    out = Path(args.out)
    try:
        if args.url is not None:
            return record(args.url.rstrip("/"), out, release)
        from ascend_runtime.local.processes import stop_process_group

        with tempfile.TemporaryDirectory(prefix="record-engine-") as tmp:
            url, pid = _start_engine(Path(tmp))
            try:
                return record(url, out, release)
            finally:
                stop_process_group(pid)
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
