"""Recovery onto a spare node on the local stack: a decode instance's node killed under load.

Run:  python -m benchmarks.spare_recovery [--write] [--rounds 3] [--workers 12] [--max-tokens 48]

Each round, in a temporary directory, on free ports: a copy of the ``local`` stack with one prefill instance
(2 nodes), two decode instances (2 nodes each, DP16/EP16) and ``spares: {decode: 1}`` (the inventory's four
other simulated nodes are spares, the first kept for decode), the simulator at speedup 10 (the local stack's own; a prefill frees KV a decode has not pulled after 120 modelled s, 12 s wall, which a busy 2-core host must not outrun). ``up --detach``,
then ``ascend-deploy faults watch --stack local`` (``--interval 0.2``, recovery checks every 0.5 s) beside it,
and ``--workers`` clients sending streaming completions of ``--max-tokens`` tokens back to back through the
proxy. After a warm-up the fault: every process of the stack on decode-0's leader node address
(``state.json``'s records whose health URL is on that address) gets SIGKILL, as a dead node. The round then
watches the proxy's admin listing every 50 ms until decode-0 serves again from the spare's address, routable
and undrained, lets the load run 2 s more and stops it.

Recorded per round (wall seconds from the kill): *drained* (every proxy replica shows decode-0 draining),
*serving on the spare* (routable, undrained, at the spare's URL); the watcher's own figures
(``/healthz``): fault signal to undrain, the recreation's share; requests sent and failed (a non-200, an SSE
error event, a stream without ``[DONE]``); streams continued by the proxy after the kill broke them
(``ascend_proxy_migrations_total``) and streams the migrate drain moved. ``--write`` records the medians in
the section ``spare_recovery`` of docs/benchmarks.md. The local stack has no image to pull and no weights to
load: docs/faults.md adds what a real cluster adds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import yaml  # noqa: E402

from ascend_runtime.checks.loadgen import stream_request  # noqa: E402
from ascend_runtime.checks.metrics import RequestResult  # noqa: E402
from ascend_runtime.checks.prompts import request_body  # noqa: E402
from ascend_runtime.local.processes import is_alive  # noqa: E402
from ascend_runtime.local.state import StackState  # noqa: E402
from tests.local.conftest import cli, free_port_stacks, kill_recorded  # noqa: E402
from tests.proxy.conftest import free_port  # noqa: E402
from tests.rollout.stack import set_config  # noqa: E402

MODEL = "deepseek-ai/DeepSeek-R1"
VICTIM = "decode-0"
#: The spare that takes decode-0's leader rank: the first node the copy's Plan leaves unused (kept for decode).
SPARE_NODE = "sim-node-07"


def spare_stack(tmp: Path) -> Path:
    """The copy of stacks/ described in the module docstring (free ports)."""
    stacks = free_port_stacks(tmp)
    set_config(stacks, prefill={"instances": 1, "nodes_per_instance": 2, "dp": 2, "tp": 8, "ep": 16},
               decode={"instances": 2, "nodes_per_instance": 2, "dp": 16, "tp": 1, "ep": 16, "max_num_seqs": 8,
                       "max_num_batched_tokens": 8},
               simulator={"speedup": 10, "startup_delay_s": 0.2}, spares={"decode": 1})
    return stacks


@dataclass
class Load:
    """``workers`` clients, each sending one streaming completion after the other through ``proxy_url``."""

    proxy_url: str
    workers: int
    max_tokens: int
    results: list[RequestResult] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def run(self, session: aiohttp.ClientSession) -> None:
        body = json.dumps(request_body("completions", MODEL, "one two three four five six seven eight",
                                       self.max_tokens, stream=True)).encode()

        async def worker() -> None:
            while not self._stop.is_set():
                self.results.append(await stream_request(session, self.proxy_url + "/v1/completions", body))

        self._tasks = [asyncio.create_task(worker()) for _ in range(self.workers)]

    async def stop(self) -> list[RequestResult]:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        return self.results


def kill_node(state_dir: Path, address: str) -> list[str]:
    """SIGKILL every process of the stack recorded on ``address`` (a simulated node dying); their names."""
    state = StackState.load(state_dir)
    assert state is not None, f"no stack in {state_dir}"
    killed = []
    for record in state.processes:
        if urlsplit(record.health_url).hostname == address and is_alive(record.pid):
            os.killpg(record.pid, signal.SIGKILL)
            killed.append(record.name)
    return killed


@dataclass
class Round:
    """One round's figures; times in wall seconds from the kill (None: not seen)."""

    killed: list[str]
    drained_s: float | None
    serving_s: float | None
    spare_url: str
    watcher: dict[str, Any]
    requests: int
    failed: list[str]
    continued: float
    taken_out: list[str]
    load_average: float = 0.0


async def _listing(session: aiohttp.ClientSession, proxy: str, token: str) -> dict[str, dict[str, Any]]:
    async with session.get(proxy + "/admin/instances", headers={"Authorization": f"Bearer {token}"}) as resp:
        data = await resp.json()
    return {i["name"]: i for i in data["instances"]}


async def _metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url) as resp:
        text = await resp.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def _healthz(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    try:
        async with session.get(url) as resp:
            return dict(await resp.json())
    except (aiohttp.ClientError, ValueError, OSError):
        return {}


async def one_round(stacks: Path, state_dir: Path, workers: int, max_tokens: int, timeout_s: float = 120.0,
                    say: Callable[[str], None] = print) -> Round:
    """Up, watch, load, kill decode-0's node, wait for it on the spare, stop; the stack is left running."""
    from ascend_runtime.planner import load_plan  # noqa: PLC0415

    plan = load_plan("local", stacks)
    victim = plan.instance(VICTIM)
    spare_ip = next(n.host_ip for n in plan.nodes if n.name == SPARE_NODE)
    token = (state_dir / "proxy-admin-token").read_text().strip()
    metrics_port = free_port()
    log = (state_dir / "logs" / "faults-watch.log").open("w")
    watcher = subprocess.Popen([sys.executable, "-m", "ascend_runtime", "faults", "watch", "--stack", "local",
                                "--stacks-dir", str(stacks), "--state-dir", str(state_dir), "--interval", "0.2",
                                "--settle", "0", "--recheck", "0.5", "--check-timeout", "10",
                                "--metrics-port", str(metrics_port)], stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    healthz = f"http://127.0.0.1:{metrics_port}/healthz"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            while not (await _healthz(session, healthz)).get("cycles"):
                assert watcher.poll() is None, f"the watcher exited: {(state_dir / 'logs/faults-watch.log').read_text()}"
                await asyncio.sleep(0.1)
            load = Load(plan.proxy_url, workers, max_tokens)
            await load.run(session)
            while sum(1 for r in load.results if r.success) < 2 * workers:
                await asyncio.sleep(0.1)
            before = await _metric(session, plan.proxy_url + "/metrics", "ascend_proxy_migrations_total")
            killed = kill_node(state_dir, victim.api_host)
            t0 = time.monotonic()
            say(f"killed {', '.join(killed)} on {victim.api_host} ({victim.nodes[0]}) under load")
            drained = serving = None
            url = ""
            while time.monotonic() - t0 < timeout_s:
                snap = (await _listing(session, plan.proxy_url, token)).get(VICTIM, {})
                url = str(snap.get("url") or "")
                if drained is None and snap.get("draining"):
                    drained = time.monotonic() - t0
                if urlsplit(url).hostname == spare_ip and snap.get("routable") and not snap.get("draining"):
                    serving = time.monotonic() - t0
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(2.0)
            results = await load.stop()
            after = await _metric(session, plan.proxy_url + "/metrics", "ascend_proxy_migrations_total")
            status = await _healthz(session, healthz)
    finally:
        watcher.send_signal(signal.SIGTERM)
        try:
            watcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            watcher.kill()
        log.close()
    if serving is None:
        say("decode-0 never served on the spare; the watcher's log ends:\n"
            + "\n".join([ln for ln in (state_dir / "logs" / "faults-watch.log").read_text().splitlines() if "stays drained" not in ln][-40:]))
    done = (status.get("spare_recovery") or {}).get("done") or [{}]
    taken = [n["name"] for n in json.loads((state_dir / "out-of-service.json").read_text())["nodes"]] \
        if (state_dir / "out-of-service.json").exists() else []
    return Round(killed, drained, serving, url, done[-1], len(results), [r.error for r in results if not r.success],
                 after - before, taken, os.getloadavg()[0])


def run_rounds(rounds: int, workers: int, max_tokens: int, say: Callable[[str], None] = print) -> list[Round]:
    """``rounds`` rounds, each on a fresh copy of the stack, brought down after it."""
    out = []
    for k in range(rounds):
        with tempfile.TemporaryDirectory(prefix="spare-recovery-") as tmp:
            stacks = spare_stack(Path(tmp))
            state_dir = Path(tmp) / "state"
            up = cli("up", "--stack", "local", "--stacks-dir", str(stacks), "--state-dir", str(state_dir), "--detach",
                     "--no-checks")
            try:
                assert up.returncode == 0, up.stdout + up.stderr
                out.append(asyncio.run(one_round(stacks, state_dir, workers, max_tokens, say=say)))
                say(f"round {k + 1}: {out[-1]}")
            finally:
                cli("down", "--stack", "local", "--state-dir", str(state_dir))
                kill_recorded(state_dir)
    return out


def _median(values: list[float | None]) -> str:
    seen = [v for v in values if v is not None]
    if not seen:
        return "not seen"
    spread = f" ({min(seen):.2f}..{max(seen):.2f})" if len(seen) > 1 else ""
    return f"{statistics.median(seen):.2f}{spread}"


def markdown(rounds: list[Round], workers: int, max_tokens: int, took_s: float) -> str:
    """The section of docs/benchmarks.md."""
    from benchmarks.report import machine_line  # noqa: PLC0415

    rows = [
        ("kill -> decode-0 drained on the proxy", _median([r.drained_s for r in rounds]), "s (wall, proxy listing)"),
        ("kill -> decode-0 serving on the spare (routable, undrained)", _median([r.serving_s for r in rounds]),
         "s (wall, proxy listing)"),
        ("fault signal -> undrain (the watcher's ascend_faults_fault_to_serving_seconds)",
         _median([r.watcher.get("fault_to_serving_s") for r in rounds]), "s"),
        ("of which the recreation on the spare (stop, start, ready)",
         _median([r.watcher.get("recreate_s") for r in rounds]), "s"),
        ("requests sent / failed", f"{sum(r.requests for r in rounds)} / {sum(len(r.failed) for r in rounds)}",
         "all rounds"),
        ("streams broken by the kill and continued on the other decode", _median([r.continued for r in rounds]),
         "per round (ascend_proxy_migrations_total)"),
        ("streams moved by the migrate drain", _median([r.watcher.get("migrated") for r in rounds]),
         "per round (the engine was dead: none left)"),
    ]
    lines = [
        "## Recovery onto a spare node (local stack)",
        "",
        f"Command: `python -m benchmarks.spare_recovery --write --rounds {len(rounds)} --workers {workers} "
        f"--max-tokens {max_tokens}` ({took_s:.0f} s). {machine_line()}.",
        "",
        "A copy of the local stack (1 prefill instance on 2 nodes, 2 decode instances DP16/EP16 on 2 nodes each, "
        "4 spare nodes, `spares: {decode: 1}`, simulator speedup 10) with `ascend-deploy faults watch --stack local "
        "--interval 0.2 --settle 0 --recheck 0.5`; "
        f"{workers} clients stream {max_tokens}-token completions back to back through the proxy; every process on "
        "decode-0's leader node address is SIGKILLed. Medians over the rounds (min..max). No image pull and no "
        "weight load on the local stack: docs/faults.md, \"What a real cluster adds\".",
        "",
        "| what | value | unit |",
        "|---|---|---|",
        *(f"| {a} | {b} | {c} |" for a, b, c in rows),
        "",
        f"Spare taken: {', '.join(sorted({t for r in rounds for t in r.taken_out}))} out of service, decode-0 moved to "
        f"{', '.join(sorted({urlsplit(r.spare_url).hostname or '?' for r in rounds}))}. The recreation is the "
        "simulator's process start on the spare's address (the Python interpreter and the kit's imports): it "
        "grows with the host's load (1-minute load average at the end of each round: "
        f"{', '.join(f'{r.load_average:.1f}' for r in rounds)} on 2 cores).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--write", action="store_true", help="record the section in docs/benchmarks.md")
    args = parser.parse_args(argv)
    start = time.monotonic()
    rounds = run_rounds(args.rounds, args.workers, args.max_tokens)
    text = markdown(rounds, args.workers, args.max_tokens, time.monotonic() - start)
    print(text)
    if args.write:
        from benchmarks.report import write_section  # noqa: PLC0415

        write_section("spare_recovery", text)
    failed = [e for r in rounds for e in r.failed]
    return 1 if failed or any(r.serving_s is None for r in rounds) else 0


if __name__ == "__main__":
    sys.exit(main())
