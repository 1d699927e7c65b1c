"""``--workers N``: N proxy processes on one port (SO_REUSEPORT), one supervisor, coherent admin and metrics.

Layout::

    supervisor (no traffic)          picks the port, starts N workers, forwards SIGHUP,
      |                              stops all if one dies (exit 1), SIGTERM/SIGINT stop all
      +-- worker 0 .. N-1            each: the whole proxy (pool, health checks, discovery),
                                     listening on host:port with SO_REUSEPORT (the kernel spreads
                                     new client connections over the workers) and on a private
                                     Unix socket <rundir>/worker-<i>.sock (rundir mode 0700)

Coherence:

- Admin mutations (``add``, ``remove``, ``drain``) are validated and applied
  by the worker that received them, then sent to every other worker over
  their Unix sockets (same body, same bearer token) before the answer: it
  carries ``workers: {index: "ok" | error}`` and is 502 if a worker did not
  apply it. ``GET /admin/instances`` sums the load fields (``inflight``,
  ``outstanding_prompt_tokens``, ``active_seqs``, ``served``) over the workers.
- ``GET /metrics`` on any worker merges every worker's own exposition:
  counters, histograms and ``inflight`` are summed; ``_created`` samples take
  the earliest; ``instance_ejected``, ``instance_kv_cache_usage`` and
  ``rank_endpoint`` the highest; ``instance_routable`` the lowest (routable in every worker).
  ``ascend_proxy_worker_up{worker}`` is 1 for every worker that answered.
  The per-worker view is the same route on a worker's Unix socket.
- Routing state (in-flight counts, ejections) is per worker. Each worker
  balances its own connections; the scraped engine signals
  (``kv_cache_usage``, ``num_requests_waiting``) are the same for all. The
  balance loss is measured in docs/benchmarks.md (peak / mean open streams
  per decode instance with 1 and 2 workers).

A request on a worker's Unix socket is answered by that worker alone (no
fan-out, no merge); only processes of the same user can reach the socket.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from ascend_runtime.proxy.config import ProxyConfig

log = logging.getLogger(__name__)

#: numeric fields of an instance listing summed over workers
LOAD_FIELDS = ("inflight", "outstanding_prompt_tokens", "active_seqs", "served")
#: gauges merged by max / min instead of sum
MAX_GAUGES = ("ascend_proxy_instance_ejected", "ascend_proxy_instance_kv_cache_usage", "ascend_proxy_rank_endpoint")
MIN_GAUGES = ("ascend_proxy_instance_routable",)


def socket_path(rundir: Path, index: int) -> Path:
    return rundir / f"worker-{index}.sock"


def is_local(request: Any) -> bool:
    """True if ``request`` came in on a worker's Unix socket (answer for this worker only)."""
    transport = request.transport
    return transport is not None and isinstance(transport.get_extra_info("sockname"), str)


class WorkerGroup:
    """This worker's view of its siblings: fan-out of admin calls, merge of metrics and listings."""

    def __init__(self, index: int, count: int, rundir: Path, timeout_s: float = 5.0):
        self.index, self.count, self.rundir = index, count, rundir
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]

    async def _call(self, i: int, method: str, path: str, body: bytes | None,
                    headers: dict[str, str]) -> tuple[int, bytes]:
        conn = aiohttp.UnixConnector(path=str(socket_path(self.rundir, i)))
        async with aiohttp.ClientSession(connector=conn, timeout=self.timeout) as s:
            async with s.request(method, "http://worker" + path, data=body, headers=headers) as r:
                return r.status, await r.read()

    async def gather(self, method: str, path: str, body: bytes | None = None,
                     headers: dict[str, str] | None = None) -> dict[int, tuple[int, bytes] | str]:
        """The same call on every other worker: {index: (status, body) or an error text}."""
        async def one(i: int) -> tuple[int, tuple[int, bytes] | str]:
            try:
                return i, await self._call(i, method, path, body, headers or {})
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                return i, f"worker {i} unreachable: {exc.__class__.__name__}"

        return dict(await asyncio.gather(*(one(i) for i in self.others())))

    async def fan_out(self, path: str, body: bytes, auth: str) -> dict[str, str]:
        """Apply an admin mutation on the other workers; {index: "ok" | error}."""
        results = {str(self.index): "ok"}
        for i, res in (await self.gather("POST", path, body, {"Authorization": auth})).items():
            if isinstance(res, str):
                results[str(i)] = res
            else:
                results[str(i)] = "ok" if res[0] == 200 else f"HTTP {res[0]}: {res[1][:200].decode(errors='replace')}"
        return results

    async def merged_listing(self, own: dict[str, Any], auth: str) -> dict[str, Any]:
        """``own`` (this worker's listing) with the load fields summed over all workers."""
        by_name = {i["name"]: i for i in own.get("instances", [])}
        answered = [self.index]
        for i, res in (await self.gather("GET", "/admin/instances", None, {"Authorization": auth})).items():
            if isinstance(res, str) or res[0] != 200:
                continue
            answered.append(i)
            for inst in json.loads(res[1]).get("instances", []):
                mine = by_name.get(inst.get("name"))
                if mine is not None:
                    for f in LOAD_FIELDS:
                        if isinstance(inst.get(f), (int, float)) and isinstance(mine.get(f), (int, float)):
                            mine[f] += inst[f]
        return {**own, "workers": sorted(answered)}

    async def merged_metrics(self, own: bytes) -> bytes:
        """Every worker's exposition merged (see the module docstring)."""
        texts = {self.index: own}
        for i, res in (await self.gather("GET", "/metrics")).items():
            if not isinstance(res, str) and res[0] == 200:
                texts[i] = res[1]
        return merge_expositions(texts)


def merge_expositions(texts: dict[int, bytes]) -> bytes:
    """Merge Prometheus text expositions of workers {index: text} (rules in the module docstring)."""
    meta: dict[str, list[str]] = {}
    order: list[str] = []
    values: dict[str, float] = {}
    family_of: dict[str, str] = {}
    current = ""
    for _, text in sorted(texts.items()):
        for line in text.decode().splitlines():
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(" ", 3)
                if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                    current = parts[2]
                    lines = meta.setdefault(current, [])
                    if line not in lines:
                        lines.append(line)
                    if current not in order:
                        order.append(current)
                continue
            key, _, raw = line.rpartition(" ")
            try:
                value = float(raw)
            except ValueError:
                continue
            name = key.split("{", 1)[0]
            if key not in values:
                family_of[key] = current
                values[key] = value
                continue
            if name.endswith("_created"):
                values[key] = min(values[key], value)
            elif name in MAX_GAUGES:
                values[key] = max(values[key], value)
            elif name in MIN_GAUGES:
                values[key] = min(values[key], value)
            else:
                values[key] += value
    out: list[str] = []
    by_family: dict[str, list[str]] = {}
    for key in values:
        by_family.setdefault(family_of[key], []).append(key)
    for fam in order:
        out += meta.get(fam, [])
        out += [f"{k} {values[k]!r}" for k in by_family.get(fam, [])]
    out += ["# HELP ascend_proxy_worker_up 1 for each worker that answered this scrape",
            "# TYPE ascend_proxy_worker_up gauge"]
    out += [f'ascend_proxy_worker_up{{worker="{i}"}} 1.0' for i in sorted(texts)]
    return ("\n".join(out) + "\n").encode()


# ---------------------------------------------------------------------------- processes
def reserve_port(host: str, port: int) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket holding ``port`` (0: a free one) until the workers listen."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind((host, port))
    return s


#: collector thresholds of a serving process (gen0 allocations, gen1 and gen2 collection ratios); why:
#: docs/proxy.md, "Relay cost" (the default 700 runs a young collection every few requests, and each
#: older one walks every open stream's state)
GC_THRESHOLDS = (50_000, 20, 10)


def tune_gc() -> None:
    """Set up the cyclic collector for a long-running proxy process: what is loaded so far (modules,
    config, routing tables: objects that live as long as the process) is moved out of the collector's
    view (``gc.freeze``), and young collections run every ``GC_THRESHOLDS[0]`` net allocations instead of
    700. Memory freed by reference counting (nearly all of it) is unaffected; reference cycles wait
    longer to be collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_loop(main: Any) -> Any:
    """Run the proxy's coroutine ``main`` on uvloop: an explicit choice, no fallback (a declared Linux
    dependency, pyproject.toml; why: docs/proxy.md, Relay). The collector is tuned first (:func:`tune_gc`)."""
    import uvloop

    tune_gc()
    return uvloop.run(main)


def _worker_main(cfg: ProxyConfig, k8s: tuple[str, dict[str, str], str] | None, index: int, count: int,
                 rundir: str, log_level: int, supervisor_pid: int | None = None) -> None:
    """Entry point of one worker process; it stops when ``supervisor_pid`` is no longer its parent."""
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s worker-{index} %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops the workers with SIGTERM
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # replaced by the instances-file reload when there is a file
    run_loop(_worker_serve(cfg, k8s, index, count, Path(rundir), supervisor_pid))


#: Seconds between a worker's checks that its supervisor is still its parent.
SUPERVISOR_CHECK_S = 1.0


async def _worker_serve(cfg: ProxyConfig, k8s_params: tuple[str, dict[str, str], str] | None, index: int,
                        count: int, rundir: Path, supervisor_pid: int | None = None) -> None:
    from ascend_runtime.proxy.discovery import KubernetesDiscovery
    from ascend_runtime.proxy.server import start_proxy

    k8s = None
    if k8s_params is not None:
        namespace, selectors, port_name = k8s_params
        k8s = KubernetesDiscovery(lambda specs: None, namespace, selectors, port_name=port_name)  # type: ignore[arg-type]
    group = WorkerGroup(index, count, rundir)
    handle = await start_proxy(replace(cfg, reuse_port=True, install_sighup=True), k8s=k8s, group=group,
                               unix_path=str(socket_path(rundir, index)))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def check_supervisor() -> None:
        # a supervisor killed without its SIGTERM (SIGKILL, OOM) cannot stop the workers: they would keep the
        # port, serving with no one to restart or reload them; re-parented, a worker stops itself
        if os.getppid() != supervisor_pid:
            log.warning("worker %d: the supervisor (pid %d) is gone; stopping", index, supervisor_pid)
            stop.set()
        else:
            loop.call_later(SUPERVISOR_CHECK_S, check_supervisor)

    if supervisor_pid is not None:
        check_supervisor()
    try:
        await stop.wait()
    finally:
        await handle.stop()


def serve_workers(cfg: ProxyConfig, count: int, k8s: tuple[str, dict[str, str], str] | None = None,
                  log_level: int = logging.INFO) -> int:
    """Run ``count`` worker processes on ``cfg.host:cfg.port`` until SIGTERM/SIGINT; returns the exit code.

    k8s: (namespace, {role: selector}, port name) for EndpointSlice discovery in
    each worker. A worker that exits stops the others (exit code 1).
    """
    if count < 1:
        raise ValueError(f"--workers must be >= 1, got {count}")
    rundir = Path(tempfile.mkdtemp(prefix="ascend-proxy-"))
    os.chmod(rundir, 0o700)
    holder = reserve_port(cfg.host, cfg.port)
    port = holder.getsockname()[1]
    cfg = replace(cfg, port=port)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker_main, args=(cfg, k8s, i, count, str(rundir), log_level, os.getpid()),
                         name=f"proxy-worker-{i}", daemon=False) for i in range(count)]
    stopping = False

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping
        if signum == signal.SIGHUP:
            for p in procs:
                if p.pid:
                    os.kill(p.pid, signal.SIGHUP)
            return
        stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    code = 0
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 30
        while not all(socket_path(rundir, i).exists() for i in range(count)):
            if stopping:
                break
            if any(not p.is_alive() for p in procs) or time.monotonic() > deadline:
                print("ascend-deploy proxy: a worker failed to start (see its log above)", file=sys.stderr)
                code = 1
                break
            time.sleep(0.05)
        else:
            print(f"proxy listening on http://{cfg.host}:{port} ({count} workers; worker sockets in {rundir})",
                  file=sys.stderr, flush=True)
        holder.close()
        while code == 0 and not stopping:
            dead = [p for p in procs if not p.is_alive()]
            if dead:
                print(f"ascend-deploy proxy: {dead[0].name} exited with {dead[0].exitcode}; stopping",
                      file=sys.stderr)
                code = 1
                break
            time.sleep(0.2)
    finally:
        holder.close()
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(rundir, ignore_errors=True)
    return code
