"""Bad input on the newer surfaces, as a user would try it, run through ``ascend-deploy`` in this one process.

Two corpora:

- stack keys (``pd_ratio``, per-stage ``modules``, ``micro_batching``, ``eplb``, proxy sizing, LWS and the
  device plugin, HCCL sizes, non-finite floats, hostile YAML): each mutates a committed stack
  (tests/config/corpus.py ``build``) and runs ``plan``; the key path must start a problem line;
- command-line flags of ``balance plan|evaluate|serve``, ``pd-planner``, ``rollout``, ``up|status|down``,
  ``faults watch`` and ``proxy``: each runs the command with one bad flag or input file.

Every case must exit 2, name its field (the key path or the flag) and, where given, the fix, print no
traceback, and leave nothing behind: no file written in the case's directory, no process started.
Shell injection in values that reach rendered scripts is checked apart: the one ``| sh`` quoting filter
must keep every such value one inert word.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.config.corpus import Case, build, cfg, chain, run_cli

# --- stack keys ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyCase:
    """A stack mutation (or a raw stack text edit) and the key path its error must name."""

    surface: str
    label: str
    path: str
    config: Callable[[dict[str, Any]], None] | None = None
    text: Callable[[str], str | bytes] | None = None
    stack: str = "a2-staging"
    fragments: tuple[str, ...] = ()


def _auto(**keys: Any) -> dict[str, Any]:
    return {"mode": "auto", "groups": 1, **keys}


INF, NAN = float("inf"), float("nan")


def key_cases() -> list[KeyCase]:
    pd = "pd_ratio"
    cases = [KeyCase(pd, label, path, cfg(pd, value), fragments=frag) for label, path, value, frag in [
        ("mode-unknown", "pd_ratio.mode", {"mode": "sometimes"}, ("'fixed' or 'auto'",)),
        ("groups-string", "pd_ratio.groups", _auto(groups="2"), ("without quotes",)),
        ("groups-negative", "pd_ratio.groups", {"groups": -1}, ("0 or more",)),
        ("groups-bool", "pd_ratio.groups", _auto(groups=True), ("whole number",)),
        ("groups-float", "pd_ratio.groups", _auto(groups=1.5), ("whole number",)),
        ("groups-null", "pd_ratio.groups", _auto(groups=None), ("whole number",)),
        ("groups-without-auto", "pd_ratio.groups", {"groups": 1}, ("mode: auto",)),
        ("auto-without-groups", "pd_ratio.groups", {"mode": "auto"}, ("1 or more",)),
        ("groups-past-inventory", "pd_ratio.groups", _auto(groups=2), ("too few nodes",)),
        ("initial-over-groups", "pd_ratio.initial_prefill_groups", _auto(initial_prefill_groups=5), ("or less",)),
        ("min-prefill-zero", "pd_ratio.min_prefill", {"min_prefill": 0}, ("1 or more",)),
        ("min-decode-unreachable", "pd_ratio.min_decode", _auto(min_decode=99), ("or less",)),
        ("drain-negative", "pd_ratio.drain_timeout_s", {"drain_timeout_s": -5}, ("more than 0",)),
        ("drain-nan", "pd_ratio.drain_timeout_s", {"drain_timeout_s": NAN}, ("finite",)),
        ("drain-inf", "pd_ratio.drain_timeout_s", {"drain_timeout_s": INF}, ("finite",)),
        ("ready-zero", "pd_ratio.ready_timeout_s", {"ready_timeout_s": 0}, ("more than 0",)),
        ("ready-inf", "pd_ratio.ready_timeout_s", {"ready_timeout_s": INF}, ("finite",)),
        ("interval-inf", "pd_ratio.interval_s", {"interval_s": INF}, ("finite",)),
        ("interval-string", "pd_ratio.interval_s", {"interval_s": "30s"}, ("without quotes",)),
        ("margin-nan", "pd_ratio.margin", {"margin": NAN}, ("finite",)),
        ("margin-over-1", "pd_ratio.margin", {"margin": 2}, ("1.0 or less",)),
        ("k-zero", "pd_ratio.k_intervals", {"k_intervals": 0}, ("1 or more",)),
        ("changes-negative", "pd_ratio.max_changes_per_hour", {"max_changes_per_hour": -1}, ("0 or more",)),
        ("typo-groups", "pd_ratio.gropus", {"gropus": 1}, ("did you mean 'groups'",)),
        ("typo-drain", "pd_ratio.drain_timeout", {"drain_timeout": 1}, ("did you mean 'drain_timeout_s'",)),
        ("list", "pd_ratio", [1, 2], ("mapping",)),
        ("null", "pd_ratio", None, ("mapping",)),
        ("string", "pd_ratio", "auto", ("mapping",)),
        ("int-key", "pd_ratio[1]", {1: 2}, ("key as text",)),
    ]]
    m = "modules"
    cases += [KeyCase(m, label, path, cfg(path, value), fragments=frag) for label, path, value, frag in [
        ("o-proj-zero", "decode.modules.o_proj_tp", 0, ("1 or more",)),
        ("o-proj-not-dividing", "decode.modules.o_proj_tp", 3, ("divide",)),
        ("o-proj-string", "decode.modules.o_proj_tp", "8", ("without quotes",)),
        ("o-proj-bool", "decode.modules.o_proj_tp", True, ("whole number",)),
        ("o-proj-huge", "decode.modules.o_proj_tp", 2 ** 40, ("divide",)),
        ("o-proj-on-prefill", "prefill.modules.o_proj_tp", 2, ("decode",)),
        ("lm-head-negative", "decode.modules.lm_head_tp", -2, ("1 or more",)),
        ("embedding-over-dp", "decode.modules.embedding_tp", 64, ("divide",)),
        ("embedding-on-prefill", "prefill.modules.embedding_tp", 2, ("recompute",)),
        ("mlp-float", "decode.modules.mlp_tp", 8.0, ("whole number",)),
        ("shared-dp-string", "decode.modules.shared_expert_dp", "yes", ("true or false",)),
        ("shared-dp-int", "decode.modules.shared_expert_dp", 1, ("true or false",)),
        ("shared-dp-tp1", "decode.modules.shared_expert_dp", True, ("tensor_parallel_size",)),
        ("list", "decode.modules", ["o_proj_tp"], ("mapping",)),
        ("null", "decode.modules", None, ("mapping",)),
        ("typo", "decode.modules.oproj_tp", 2, ("did you mean 'o_proj_tp'",)),
    ]]
    mb = "micro_batching"
    cases += [KeyCase(mb, label, "decode.micro_batching", cfg("decode.micro_batching", value), fragments=("true or false",))
              for label, value in [("string", "true"), ("int", 1), ("null", None)]]
    e = "eplb"
    cases += [KeyCase(e, label, path, cfg(path, value), fragments=frag) for label, path, value, frag in [
        ("mode-static", "prefill.eplb.mode", "static", ("'dynamic'",)),
        ("policy-unknown", "prefill.eplb.policy", "best", ("swift_balancer",)),
        ("heat-zero", "prefill.eplb.heat_collection_interval", 0, ("1 or more",)),
        ("heat-string", "prefill.eplb.heat_collection_interval", "50", ("without quotes",)),
        ("heat-float", "prefill.eplb.heat_collection_interval", 50.5, ("whole number",)),
        ("algorithm-negative", "prefill.eplb.algorithm_execution_interval", -1, ("1 or more",)),
        ("list", "prefill.eplb", ["dynamic"], ("mapping",)),
        ("bool", "prefill.eplb", True, ("mapping",)),
        ("removed-with-redundant", "prefill.eplb", None, ("redundant",)),
        ("on-decode-8-per-die", "decode.eplb", {"mode": "dynamic"}, ("advises against",)),
        ("redundant-negative", "prefill.redundant_experts", -16, ("0 or more",)),
        ("typo", "prefill.eplb.polcy", "default", ("did you mean 'policy'",)),
    ]]
    # 256 experts + 7 redundant on ep 16: the error names ep, the divisor that fails, and the fix on redundant_experts
    cases.append(KeyCase(e, "redundant-uneven", "prefill.ep", cfg("prefill.redundant_experts", 7), fragments=("redundant_experts",)))
    k = "kubernetes"
    cases += [KeyCase(k, label, path, cfg(path, value), fragments=frag) for label, path, value, frag in [
        ("proxy-replicas-zero", "kubernetes.proxy_replicas", 0, ("1 or more",)),
        ("proxy-replicas-huge", "kubernetes.proxy_replicas", 10 ** 9, ("150000 or less",)),
        ("proxy-replicas-string", "kubernetes.proxy_replicas", "3", ("without quotes",)),
        ("lws-install-string", "kubernetes.lws.install", "yes", ("true or false",)),
        ("lws-typo", "kubernetes.lws.instal", True, ("did you mean 'install'",)),
        ("lws-list", "kubernetes.lws", [True], ("mapping",)),
        ("device-plugin-image-shell", "kubernetes.device_plugin.image", "x; reboot", ("image reference",)),
        ("device-plugin-image-tagged", "kubernetes.device_plugin.image", "ascendhub.huawei.com/p/plugin:v1", ("version",)),
        ("device-plugin-version-shell", "kubernetes.device_plugin.version", "v1 $(id)", ("Pulumi.yaml",)),
        ("hccl-buffsize-huge", "decode.hccl_buffsize_mb", 10 ** 15, ("65536 or less",)),
    ]]
    f = "finite"
    cases += [KeyCase(f, label, path, cfg(path, value), fragments=("finite",)) for label, path, value in [
        ("reserve-inf", "decode.reserve_gib", INF), ("reserve-nan", "decode.reserve_gib", NAN),
        ("ttft-inf", "slo.ttft_ms", INF), ("rate-inf", "slo.expected_request_rate", INF),
        ("speedup-inf", "simulator.speedup", INF), ("link-inf", "simulator.link_gbps", INF),
        ("startup-inf", "simulator.startup_delay_s", INF), ("min-goodput-inf", "throughput_check.min_goodput", INF),
        ("published-inf", "throughput_check.published_decode_tokens_per_npu", INF),
        ("gpu-util-nan", "decode.gpu_memory_utilization", NAN),
    ]]
    y = "yaml"
    laughs = "\n".join(["  kubernetes:a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"  kubernetes:a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)])
    cases += [
        KeyCase(y, "alias-bomb-extra-args", "engine.extra_args[0]",
                text=lambda t: t.replace("config:\n", "config:\n" + laughs + "\n", 1).replace(
                    "  ascend-deepseek:engine:\n", "  ascend-deepseek:engine:\n    extra_args: *a9\n", 1)),
        KeyCase(y, "alias-bomb-pd-ratio", "pd_ratio",
                text=lambda t: t.replace("config:\n", "config:\n" + laughs + "\n", 1) + "  ascend-deepseek:pd_ratio: *a9\n"),
        KeyCase(y, "recursive-alias", "pd_ratio.groups",
                text=lambda t: t + "  ascend-deepseek:pd_ratio: &r {mode: auto, groups: *r}\n"),
        KeyCase(y, "duplicate-pd-key", "pd_ratio.mode", text=lambda t: t + "  ascend-deepseek:pd_ratio: {mode: auto, mode: fixed}\n",
                fragments=("given twice",)),
        KeyCase(y, "duplicate-stage", "decode", text=lambda t: t + "  ascend-deepseek:decode: {}\n", fragments=("given twice",)),
        KeyCase(y, "non-utf8-value", "stack", text=lambda t: t.encode() + b"  ascend-deepseek:pd_ratio: {mode: \xff}\n",
                fragments=("UTF-8",)),
        KeyCase(y, "python-tag", "stack", text=lambda t: t + "  ascend-deepseek:pd_ratio: !!python/object/apply:os.system ['true']\n",
                fragments=("tag",)),
        KeyCase(y, "set-tag", "pd_ratio", text=lambda t: t + "  ascend-deepseek:pd_ratio: !!set {a, b}\n", fragments=("mapping",)),
        KeyCase(y, "deep-nesting", "stack", text=lambda t: t + "  ascend-deepseek:pd_ratio: " + "[" * 5000 + "]" * 5000 + "\n",
                fragments=("nested too deeply",)),
        KeyCase(y, "empty-file", "stack", text=lambda t: "", fragments=("empty",)),
        KeyCase(y, "two-documents", "stack", text=lambda t: t + "---\nconfig: {}\n", fragments=("single document",)),
    ]
    return cases


def _problem_paths(stderr: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^  - (.+?): ", stderr, re.MULTILINE)]


def _build_key_case(case: KeyCase, root: Path) -> Path:
    stacks = build(Case("more", case.label, case.stack, case.path, config=case.config), root)
    if case.text is not None:
        stack_file = stacks / f"Pulumi.{case.stack}.yaml"
        new = case.text(stack_file.read_text(encoding="utf-8"))
        if isinstance(new, bytes):
            stack_file.write_bytes(new)
        else:
            stack_file.write_text(new, encoding="utf-8")
    return stacks


# --- command-line flags -------------------------------------------------------------------------------------


@dataclass
class Fixtures:
    """Input files every flag case may name, in one directory made once (cases never write there)."""

    root: Path

    def npy(self, name: str, array: np.ndarray) -> str:
        path = self.root / name
        np.save(path, array)
        return str(path)

    def text(self, name: str, data: str | bytes) -> str:
        path = self.root / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(path)

    def dumps(self, name: str, snapshots: int = 3, mutate: Callable[[dict[str, Any], int, int], Any] | None = None,
              layers: int = 4, experts: int = 16, ranks: int = 2) -> str:
        """A directory of dump snapshots in the DirLoadSource format; ``mutate(doc, snapshot, rank)`` spoils one."""
        top = self.root / name
        rng = np.random.default_rng(7)
        cumulative = np.zeros((ranks, layers, experts))
        for s in range(snapshots):
            (top / f"snap{s:03d}").mkdir(parents=True)
            cumulative += rng.integers(1, 100, cumulative.shape)
            for r in range(ranks):
                doc: Any = {"rank": r, "seq": s + 1, "layers": layers, "experts": experts,
                            "expert_load": cumulative[r].tolist()}
                if mutate is not None:
                    doc = mutate(doc, s, r)
                data = doc if isinstance(doc, (str, bytes)) else json.dumps(doc)
                (top / f"snap{s:03d}" / f"rank_{r}.json").write_bytes(data if isinstance(data, bytes) else data.encode())
        return str(top)


@dataclass(frozen=True)
class FlagCase:
    """One command line (``{case}`` in an argument is the case's own empty directory) and the field it must name."""

    surface: str
    label: str
    argv: tuple[str, ...]
    field: str
    fragments: tuple[str, ...] = ()


def flag_cases(fx: Fixtures) -> list[FlagCase]:
    rng = np.random.default_rng(3)
    good = fx.npy("good.npy", rng.integers(1, 100, (3, 4, 16)).astype(float))

    def spoiled(value: float) -> np.ndarray:
        a = rng.integers(1, 100, (3, 4, 16)).astype(float)
        a[1, 2, 3] = value
        return a

    nan, neg, inf = fx.npy("nan.npy", spoiled(NAN)), fx.npy("neg.npy", spoiled(-5)), fx.npy("inf.npy", spoiled(INF))
    zero = fx.npy("zero.npy", np.zeros((3, 4, 16)))
    (fx.root / "empty").mkdir()
    truncated = fx.text("truncated.npy", Path(good).read_bytes()[:100])
    plan = ("balance", "plan", "--out", "{case}/map.json")

    def bp(label: str, *argv: str, fld: str = "--history", frag: tuple[str, ...] = ()) -> FlagCase:
        base = ("--ranks", "4", "--slots", "4") if "--ranks" not in argv else ()
        return FlagCase("balance plan", label, (*plan, *argv, *base), fld, frag)

    hist = "--history"
    cases = [
        bp("history-missing", hist, str(fx.root / "nope.npy"), frag=("does not exist",)),
        bp("history-empty-dir", hist, str(fx.root / "empty"), frag=("rank_<r>.json",)),
        bp("history-1d", hist, fx.npy("1d.npy", np.ones(16)), frag=("windows x layers x experts",)),
        bp("history-4d", hist, fx.npy("4d.npy", np.ones((2, 2, 4, 16))), frag=("windows x layers x experts",)),
        bp("history-no-windows", hist, fx.npy("w0.npy", np.zeros((0, 4, 16))), frag=("non-empty",)),
        bp("history-nan", hist, nan, frag=("NaN",)),
        bp("history-inf", hist, inf, frag=("infinite",)),
        bp("history-negative", hist, neg, frag=("negative", "window 1, layer 2, expert 3")),
        bp("history-all-zero", hist, zero, frag=("routes no tokens",)),
        bp("history-text-values", hist, fx.npy("str.npy", np.array([["a", "b"], ["c", "d"]])), frag=("not token counts",)),
        bp("history-complex", hist, fx.npy("complex.npy", np.ones((3, 4, 16)) * 1j), frag=("complex",)),
        bp("history-bool", hist, fx.npy("bool.npy", np.ones((3, 4, 16), bool)), frag=("bool",)),
        bp("history-truncated", hist, truncated, frag=("not a readable .npy",)),
        bp("history-json-file", hist, fx.text("load.json", json.dumps({"expert_load": [[1] * 16] * 4})),
           frag=("not a readable .npy",)),
        bp("history-npz", hist, _npz(fx.root / "z.npz"), frag=(".npz",)),
        bp("dumps-all-truncated", hist, fx.dumps("d-trunc", mutate=lambda d, s, r: json.dumps(d)[:50]), frag=("rank_0.json",)),
        bp("dumps-one-truncated", hist, fx.dumps("d-trunc1", mutate=lambda d, s, r: json.dumps(d)[:50] if (s, r) == (1, 0) else d),
           frag=("snap001/rank_0.json",)),
        bp("dumps-wrong-shape", hist, fx.dumps("d-shape", mutate=lambda d, s, r: {**d, "layers": 5}), frag=("shape",)),
        bp("dumps-nan", hist, fx.dumps("d-nan", mutate=lambda d, s, r: {**d, "expert_load": [[NAN] * 16] * 4}),
           frag=("finite",)),
        bp("dumps-negative", hist, fx.dumps("d-neg", mutate=lambda d, s, r: {**d, "expert_load": [[-1e6] * 16] * 4}),
           frag=("non-negative",)),
        bp("dumps-text-counts", hist, fx.dumps("d-str", mutate=lambda d, s, r: {**d, "expert_load": [["1"] * 16] * 4}),
           frag=("other than numbers",)),
        bp("dumps-rank-mismatch", hist, fx.dumps("d-rank", mutate=lambda d, s, r: {**d, "rank": 9}), frag=("rank",)),
        bp("dumps-binary", hist, fx.dumps("d-bin", mutate=lambda d, s, r: b"\xff\xfe\x00" if r == 0 else d), frag=("utf-8",)),
        bp("dumps-list-doc", hist, fx.dumps("d-list", mutate=lambda d, s, r: "[1, 2]"), frag=("rank_0.json",)),
        bp("ranks-zero", hist, good, "--ranks", "0", "--slots", "4", fld="--ranks/--slots", frag=("positive",)),
        bp("slots-too-few", hist, good, "--ranks", "4", "--slots", "2", fld="--slots", frag=("at least 4",)),
        bp("slots-huge", hist, good, "--ranks", "4", "--slots", "100000000", fld="--slots", frag=("--slots 16 or less",)),
        bp("ranks-huge", hist, good, "--ranks", "100000000", "--slots", "1", fld="--ranks/--slots", frag=("check --ranks",)),
        bp("redundancy-huge", hist, good, "--ranks", "16", "--slots", "16", fld="--ranks/--slots", frag=("lower --slots",)),
        bp("groups-without-nodes", hist, good, "--groups", "4", fld="--groups/--nodes", frag=("give both",)),
        bp("groups-zero", hist, good, "--groups", "0", "--nodes", "0", fld="--groups/--nodes", frag=("positive",)),
        bp("groups-negative", hist, good, "--groups", "-4", "--nodes", "2", fld="--groups/--nodes", frag=("positive",)),
        bp("groups-not-dividing", hist, good, "--groups", "3", "--nodes", "1", fld="--groups/--nodes", frag=("% groups",)),
        bp("min-gain-nan", hist, good, "--min-gain", "nan", fld="--min-gain", frag=("finite",)),
        bp("min-gain-negative", hist, good, "--min-gain", "-1", fld="--min-gain", frag=(">= 0",)),
        bp("ranks-not-a-number", hist, good, "--ranks", "four", "--slots", "4", fld="--ranks", frag=("invalid int",)),
        FlagCase("balance plan", "out-is-a-directory", ("balance", "plan", hist, good, "--ranks", "4", "--slots", "4", "--out",
                                                        "{case}"), "--out", ("is a directory",)),
        FlagCase("balance plan", "out-unwritable", ("balance", "plan", hist, good, "--ranks", "4", "--slots", "4", "--out",
                                                    "/proc/ascend-map.json"), "--out", ("writ",)),
        bp("load-text-counts", "--load", fx.text("l-str.json", json.dumps({"expert_load": [["1"] * 16] * 4})), fld="--load",
           frag=("array of numbers",)),
        bp("load-bools", "--load", fx.text("l-bool.json", json.dumps({"expert_load": [[True] * 16] * 4})), fld="--load"),
        bp("load-ragged", "--load", fx.text("l-rag.json", json.dumps({"expert_load": [[1, 2], [3]]})), fld="--load"),
        bp("load-nan", "--load", fx.text("l-nan.json", '{"expert_load": [[NaN, 1]]}'), fld="--load expert_load", frag=("NaN",)),
        bp("load-1d", "--load", fx.text("l-1d.json", json.dumps({"expert_load": [1, 2, 3]})), fld="--load expert_load"),
        bp("load-zero", "--load", fx.text("l-zero.json", json.dumps({"expert_load": [[0] * 16] * 4})), fld="--load expert_load",
           frag=("routes no tokens",)),
        bp("previous-not-a-map", hist, good, "--previous", fx.text("prev.json", "[1, 2]"), fld="--previous",
           frag=("layer_list",)),
        bp("previous-not-utf8", hist, good, "--previous", fx.text("prev-bin.json", b"\xff\xfe"), fld="--previous"),
    ]
    ev = fx.npy("ev.npy", rng.integers(1, 100, (4, 4, 16)).astype(float))

    def be(label: str, *argv: str, fld: str = "--load-dir", frag: tuple[str, ...] = ()) -> FlagCase:
        base = ("--load-dir", ev) if "--load-dir" not in argv else ()
        ranks = ("--ranks", "4") if "--ranks" not in argv and "--stack" not in argv else ()
        return FlagCase("balance evaluate", label, ("balance", "evaluate", "--plot", "{case}/plot.png", *base, *ranks, *argv),
                        fld, frag)

    split = fx.root / "split"
    (split / "prefill").mkdir(parents=True)
    cases += [
        be("one-window", "--load-dir", fx.npy("one.npy", np.ones((1, 4, 16))), frag=("at least 2 windows",)),
        be("empty-dir", "--load-dir", str(fx.root / "empty"), frag=("rank_<r>.json",)),
        be("nan", "--load-dir", nan, frag=("NaN",)),
        be("negative", "--load-dir", neg, frag=("negative",)),
        be("all-zero", "--load-dir", zero, frag=("routes no tokens",)),
        be("no-layers", "--load-dir", fx.npy("l0.npy", np.ones((3, 0, 16))), frag=("non-empty",)),
        be("one-snapshot", "--load-dir", fx.dumps("e-one", snapshots=1), frag=("at least 2 windows",)),
        be("truncated-dump", "--load-dir", fx.dumps("e-trunc", mutate=lambda d, s, r: json.dumps(d)[:40] if s == 2 else d),
           frag=("snap002",)),
        be("split-stage-empty", "--load-dir", str(split), frag=("prefill",)),
        be("stack-shape-mismatch", "--stack", "a2-staging", frag=("58 MoE layers",)),
        be("stack-traversal", "--stack", "../x", fld="stack", frag=("DNS-1123",)),
        be("interval-zero", "--interval", "0", fld="--interval"),
        be("window-seconds-nan", "--window-seconds", "nan", fld="--window-seconds", frag=("finite",)),
        be("window-seconds-inf", "--window-seconds", "inf", fld="--window-seconds", frag=("finite",)),
        be("window-steps-zero", "--window-steps", "0", fld="--window-steps"),
        be("batch-tokens-zero", "--batch-tokens", "0", fld="--batch-tokens"),
        be("batch-tokens-negative", "--batch-tokens", "-5", fld="--batch-tokens"),
        be("ranks-one", "--ranks", "1", fld="--ranks"),
        be("ranks-uneven", "--ranks", "3", fld="--ranks", frag=("divides 16",)),
        be("hardware-unknown", "--hardware", "h100", fld="--hardware", frag=("atlas-800i-a2",)),
        FlagCase("balance evaluate", "plot-unwritable", ("balance", "evaluate", "--load-dir", ev, "--ranks", "4", "--plot",
                                                         "/proc/ascend-plot.png"), "--plot", ("writ",)),
        FlagCase("balance evaluate", "plot-is-a-directory", ("balance", "evaluate", "--load-dir", ev, "--ranks", "4", "--plot",
                                                             "{case}"), "--plot", ("is a directory",)),
    ]
    serve = ("balance", "serve", "--experts", "16", "--dry-run", "--max-cycles", "1", "--interval", "0.01")

    def bs(label: str, *argv: str, fld: str, frag: tuple[str, ...] = ()) -> FlagCase:
        base = ("--ranks", "4", "--slots", "4") if "--ranks" not in argv else ()
        inst = ("--instance", "a=http://127.0.0.1:9") if "--instance" not in argv else ()
        return FlagCase("balance serve", label, (*serve, *base, *inst, *argv), fld, frag)

    cases += [
        bs("log-level", "--log-level", "LOUD", fld="--log-level", frag=("DEBUG",)),
        bs("interval-negative", "--interval", "-1", fld="--interval"),
        bs("interval-nan", "--interval", "nan", fld="--interval", frag=("finite",)),
        bs("experts-zero", "--experts", "0", fld="--experts"),
        bs("slots-huge", "--ranks", "4", "--slots", "100000000", fld="--slots"),
        bs("decay-over-1", "--decay", "2", fld="--decay"),
        bs("min-windows-zero", "--min-windows", "0", fld="--min-windows"),
        bs("max-cycles-negative", "--max-cycles", "-1", fld="--max-cycles"),
        bs("metrics-port-range", "--metrics-port", "70000", fld="--metrics-port", frag=("1..65535",)),
        bs("instance-url", "--instance", "a=not a url", fld="--instance a", frag=("http(s)",)),
        bs("instance-no-name", "--instance", "=http://x", fld="--instance", frag=("NAME=VALUE",)),
        bs("publish-file-directory", "--publish-file", "{case}", fld="--publish-file", frag=("is a directory",)),
        bs("groups-without-nodes", "--groups", "4", fld="--groups/--nodes"),
    ]
    pdp = ("pd-planner", "--stack", "local", "--dry-run", "--max-cycles", "1")

    def pp(label: str, *argv: str, fld: str, frag: tuple[str, ...] = ()) -> FlagCase:
        return FlagCase("pd-planner", label, (*pdp, *argv), fld, frag)

    plan_file = fx.text("plan.json", "{}")
    cases += [
        pp("interval-negative", "--interval", "-1", fld="--interval"),
        pp("interval-nan", "--interval", "nan", fld="--interval", frag=("finite",)),
        pp("interval-inf", "--interval", "inf", fld="--interval", frag=("finite",)),
        pp("margin-nan", "--margin", "nan", fld="--margin"),
        pp("margin-over-1", "--margin", "5", fld="--margin", frag=("<= 1",)),
        pp("k-zero", "--k", "0", fld="--k"),
        pp("prompt-tokens-negative", "--prompt-tokens", "-5", fld="--prompt-tokens"),
        pp("proxy-url-words", "--proxy-metrics", "not a url", fld="--proxy-metrics", frag=("http(s)",)),
        pp("proxy-url-ftp", "--proxy-metrics", "ftp://x/metrics", fld="--proxy-metrics"),
        pp("proxy-url-no-host", "--proxy-metrics", "http://", fld="--proxy-metrics"),
        pp("proxy-url-bad-port", "--proxy-metrics", "http://127.0.0.1:99999/metrics", fld="--proxy-metrics"),
        pp("metrics-port-range", "--metrics-port", "70000", fld="--metrics-port"),
        pp("metrics-host-words", "--metrics-host", "not a host", "--metrics-port", "19999", fld="--metrics-host"),
        pp("max-cycles-zero", "--max-cycles", "0", fld="--max-cycles"),
        pp("log-level", "--log-level", "LOUD", fld="--log-level"),
        pp("target-file-directory", "--target-file", "{case}", fld="--target-file", frag=("is a directory",)),
        pp("proxy-admin-spec", "--proxy-admin", "nonsense", fld="--proxy-admin", frag=("NAMESPACE/NAME:PORT",)),
        FlagCase("pd-planner", "stack-and-plan-file", ("pd-planner", "--stack", "local", "--plan-file", plan_file, "--dry-run"),
                 "--stack / --plan-file", ("exactly one",)),
        FlagCase("pd-planner", "plan-file-empty-object", ("pd-planner", "--plan-file", plan_file, "--dry-run"), "--plan-file",
                 ("plan.json",)),
        FlagCase("pd-planner", "plan-file-directory", ("pd-planner", "--plan-file", str(fx.root), "--dry-run"), "--plan-file"),
        FlagCase("pd-planner", "stack-traversal", ("pd-planner", "--stack", "../x", "--dry-run"), "stack", ("DNS-1123",)),
    ]
    ro = ("rollout", "--stack", "a2-staging", "--dry-run", "--allow-downtime")
    cases += [FlagCase("rollout", label, (*ro, *argv), fld, frag) for label, argv, fld, frag in [
        ("drain-negative", ("--drain-timeout-s", "-1"), "--drain-timeout-s", ("> 0",)),
        ("drain-nan", ("--drain-timeout-s", "nan"), "--drain-timeout-s", ("finite",)),
        ("drain-inf", ("--drain-timeout-s", "inf"), "--drain-timeout-s", ("finite",)),
        ("ready-inf", ("--ready-timeout-s", "inf"), "--ready-timeout-s", ("finite",)),
        ("poll-zero", ("--poll-s", "0"), "--poll-s", ()),
        ("unknown-instance", ("--instance", "nope"), "--instance", ("prefill-0",)),
        ("unknown-from", ("--from", "nope"), "--from", ("prefill-0",)),
        ("empty-instance", ("--instance", ""), "--instance", ("empty",)),
        ("engine-image-words", ("--engine-image", "Bad Image;reboot"), "--engine-image", ("image reference",)),
        ("engine-image-shell", ("--engine-image", "x$(reboot)"), "--engine-image", ("image reference",)),
        ("proxy-url", ("--proxy", "not a url"), "--proxy", ("http(s)",)),
        ("kube-api-url", ("--kube-api", "::::"), "--kube-api", ("http(s)",)),
        ("proxy-service-spec", ("--proxy-service", "nonsense"), "--proxy-service", ("NAMESPACE/NAME:PORT",)),
    ]]
    cases += [
        FlagCase("rollout", "stack-traversal", ("rollout", "--stack", "../x"), "stack", ("DNS-1123",)),
        FlagCase("rollout", "stack-absolute", ("rollout", "--stack", "/etc/passwd"), "stack", ("DNS-1123",)),
        FlagCase("rollout", "local-not-running", ("rollout", "--stack", "local", "--state-dir", "{case}/state"), "--stack",
                 ("not running",)),
    ]
    up = ("up", "--stack", "local", "--detach", "--no-checks")
    cases += [FlagCase("local", label, argv, fld, frag) for label, argv, fld, frag in [
        ("up-traversal", ("up", "--stack", "../x", "--detach"), "stack", ("DNS-1123",)),
        ("up-absolute", ("up", "--stack", "/etc/passwd", "--detach"), "stack", ("DNS-1123",)),
        ("up-unknown", ("up", "--stack", "nope", "--detach"), "stack", ("known stacks",)),
        ("up-kubernetes-target", ("up", "--stack", "a2-staging", "--detach"), "a2-staging", ("target",)),
        ("up-ready-negative", (*up, "--ready-timeout-s", "-1", "--state-dir", "{case}/state"), "--ready-timeout-s", ()),
        ("up-ready-nan", (*up, "--ready-timeout-s", "nan", "--state-dir", "{case}/state"), "--ready-timeout-s", ("finite",)),
        ("up-num-prompts-zero", ("up", "--stack", "local", "--detach", "--num-prompts", "0", "--state-dir", "{case}/state"),
         "--num-prompts", ()),
        ("up-state-dir-file", (*up, "--state-dir", "/etc/passwd"), "--state-dir", ("not a directory",)),
        ("up-state-dir-unwritable", (*up, "--state-dir", "/proc/ascend-state"), "--state-dir", ("write",)),
        ("up-stacks-dir-missing", (*up, "--stacks-dir", "{case}/nope"), "stack", ("no stack named",)),
        ("down-traversal", ("down", "--stack", "../x"), "--stack ../x", ("no such stack",)),
        ("down-absolute", ("down", "--stack", "/etc/passwd"), "--stack /etc/passwd", ("no such stack",)),
        ("status-traversal", ("status", "--stack", "../../etc"), "--stack ../../etc", ("no such stack",)),
    ]]
    cases += [
        FlagCase("faults", "log-level", ("faults", "watch", "--stack", "a2-staging", "--log-level", "LOUD", "--proxy",
                                         "http://127.0.0.1:9"), "--log-level", ("DEBUG",)),
        FlagCase("faults", "interval-nan", ("faults", "watch", "--stack", "a2-staging", "--interval", "nan", "--proxy",
                                            "http://127.0.0.1:9"), "--interval", ("finite",)),
        FlagCase("faults", "settle-negative", ("faults", "watch", "--stack", "a2-staging", "--settle", "-1", "--proxy",
                                               "http://127.0.0.1:9"), "--settle", (">= 0",)),
        FlagCase("faults", "metrics-port-range", ("faults", "watch", "--stack", "a2-staging", "--metrics-port", "0", "--proxy",
                                                  "http://127.0.0.1:9"), "--metrics-port", ("1..65535",)),
        FlagCase("proxy", "port-range", ("proxy", "--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:8", "--port",
                                         "70000"), "--port", ("1..65535",)),
        FlagCase("plan", "advise-with-json", ("plan", "--stack", "local", "--advise", "--json"), "--advise", ("without --json",)),
    ]
    return cases


def _npz(path: Path) -> str:
    np.savez(path, a=np.ones((3, 4, 16)))
    return str(path)


# --- checks -------------------------------------------------------------------------------------------------


def _children() -> set[int]:
    """Pids of this process's children (every thread's list)."""
    found: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            found |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            continue
    return found


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def _run(argv: list[str]) -> tuple[int | str, str, str]:
    """``run_cli``, with an exception that escapes ``main`` recorded as the result (a case fails, the corpus goes on)."""
    try:
        return run_cli(argv)
    except Exception as exc:  # noqa: BLE001 - any escape is a failure of the case
        return f"raised {type(exc).__name__}", "", f"Traceback (escaped main): {exc}"


def _verdict(label: str, code: int | str, out: str, err: str, named: bool, fragments: tuple[str, ...]) -> list[str]:
    text = out + err
    wrong = []
    if code != 2:
        wrong.append(f"exit {code}, want 2")
    if "Traceback" in text:
        wrong.append("traceback")
    if not named:
        wrong.append("the field is not named")
    wrong += [f"{f!r} missing" for f in fragments if f not in text]
    return [f"{label}: {w}\n    {text.strip()[-400:]}" for w in wrong]


KEY_CASES = key_cases()
#: Fewest cases per surface: the corpus may grow, never silently shrink.
MIN_KEY_CASES = {"pd_ratio": 25, "modules": 14, "micro_batching": 3, "eplb": 12, "kubernetes": 10, "finite": 10, "yaml": 10}
MIN_FLAG_CASES = {"balance plan": 40, "balance evaluate": 20, "balance serve": 12, "pd-planner": 20, "rollout": 15,
                  "local": 12, "faults": 4, "proxy": 1, "plan": 1}


def test_stack_keys_exit_2_naming_the_key(tmp_path: Path) -> None:
    """Every stack case through ``plan``: exit 2, a problem line starting with its key path, the fix, no traceback."""
    counts = Counter(c.surface for c in KEY_CASES)
    print("\nstack-key cases per surface: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    assert not {k: (counts.get(k, 0), n) for k, n in MIN_KEY_CASES.items() if counts.get(k, 0) < n}
    failures: list[str] = []
    for i, case in enumerate(KEY_CASES):
        stacks = _build_key_case(case, tmp_path / f"k{i}")
        code, out, err = _run(["plan", "--stack", case.stack, "--stacks-dir", str(stacks)])
        failures += _verdict(f"{case.surface}:{case.label}", code, out, err, case.path in _problem_paths(err), case.fragments)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


def test_flags_exit_2_naming_the_flag_with_nothing_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flag case: exit 2, the flag named, no traceback, no file in its directory, no process left."""
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    cases = flag_cases(Fixtures(fixtures))
    counts = Counter(c.surface for c in cases)
    print("\nflag cases per surface: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    assert not {k: (counts.get(k, 0), n) for k, n in MIN_FLAG_CASES.items() if counts.get(k, 0) < n}
    assert len({(c.surface, c.label) for c in cases}) == len(cases), "case labels must be unique"
    monkeypatch.setenv("ASCEND_DEPLOY_STATE_DIR", str(tmp_path / "state-root"))
    monkeypatch.delenv("ASCEND_PROXY_TOKEN", raising=False)
    fixture_files = _files(fixtures)
    before = _children()
    failures: list[str] = []
    for i, case in enumerate(cases):
        own = tmp_path / f"c{i}"
        own.mkdir()
        argv = [a.replace("{case}", str(own)) for a in case.argv]
        try:
            code, out, err = _run(argv)
        finally:
            for state in (own / "state", tmp_path / "state-root" / "local"):  # a regression must not leave a stack up
                if (state / "state.json").exists():
                    run_cli(["down", "--state-dir", str(state)])
                    failures.append(f"{case.surface}:{case.label}: started the local stack")
        label = f"{case.surface}:{case.label}"
        failures += _verdict(label, code, out, err, case.field in out + err, case.fragments)
        if _files(own):
            failures.append(f"{label}: wrote {_files(own)[:5]}")
        if _children() - before:
            failures.append(f"{label}: left processes {sorted(_children() - before)}")
    assert _files(fixtures) == fixture_files, "a case wrote into the shared fixtures"
    assert not (tmp_path / "state-root").exists() or not _files(tmp_path / "state-root"), "state written"
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


def test_shell_values_stay_one_inert_word(tmp_path: Path) -> None:
    """Values that reach the rendered launch scripts (an engine env value, the served model name) hostile to sh:
    every script parses, the export gives back exactly the value, and nothing the value names runs."""
    marker = tmp_path / "pwned"
    value = f"$(touch {marker}); `touch {marker}`; ' \" \\ \n ${{IFS}} && touch {marker} # x"
    name = f"x;touch${{IFS}}{marker}"
    # VLLM_LOGGING_PREFIX: read by vLLM 0.23.0 (vllm/envs.py), so the engine surface check lets it through
    case = Case("more", "shell", "a2-staging", "",
                config=chain(cfg("engine.extra_env", {"VLLM_LOGGING_PREFIX": value}), cfg("model.name", name)))
    stacks = build(case, tmp_path / "s")
    out_dir = tmp_path / "out"
    code, _, err = run_cli(["render", "--stack", "a2-staging", "--stacks-dir", str(stacks), "--out", str(out_dir)])
    assert code == 0, err
    scripts = sorted(out_dir.rglob("*.sh"))
    for script in scripts:
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True, check=False).returncode == 0, script.name
    ranks = [s for s in scripts if "export VLLM_LOGGING_PREFIX=" in s.read_text()]
    assert ranks, "no launch script exports the engine.extra_env value"
    for script in ranks:
        text = script.read_text()
        export = next(line.strip() for line in text.splitlines() if line.strip().startswith("export VLLM_LOGGING_PREFIX="))
        echoed = subprocess.run(["bash", "-c", f'{export}; printf %s "$VLLM_LOGGING_PREFIX"'], capture_output=True, text=True,
                                check=False)
        assert echoed.stdout == value, script.name
        lines = text.splitlines()
        flag = next(i for i, line in enumerate(lines) if line.strip() == "--served-model-name")
        word = lines[flag + 1].strip().removesuffix("\\").strip()
        served = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, text=True, check=False)
        assert served.stdout == name, (script.name, word)
    assert not marker.exists(), "a value was executed"
