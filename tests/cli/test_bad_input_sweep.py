"""A sweep of bad input the earlier corpora (test_bad_input_corpus_audit.py, test_bad_input_corpus_more.py) let
through, run through ``ascend-deploy``'s own ``main`` in this one process.

One table, by class: durations without a ceiling (``1e308`` seconds would overflow a timer or wait forever;
every timeout, interval, delay and probe is at most a day, ``MAX_DURATION_S``), polling intervals below
``MIN_INTERVAL_S``, counts and sizes without a ceiling, JSON and YAML input files a reader choked on (too deep,
a key given twice, binary, the wrong shape), values with control characters that no argv word or path can
hold, and settings that contradict each other. Each case must exit 2, name its field (a stack key path
starts a problem line; a flag or a file's key appears in the message), print no traceback, and leave its
own directory as it was (no output written half way) with no process started.

The two YAML documents nested 100,000 deep, which crashed the interpreter in libyaml's composer, run as
real ``ascend-deploy`` processes, so that a regression fails them instead of ending the test run.
Valid input around the same checks keeps working (last tests).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import yaml

from tests.config.corpus import STACKS, Case, build, cfg, inv, run_cli

ROOT = Path(__file__).resolve().parents[2]
LEAKS = re.compile(r"Traceback|File \"/|\b(KeyError|TypeError|AttributeError|IndexError|RecursionError|OverflowError|"
                   r"JSONDecodeError|ParserError|ScannerError|UnicodeDecodeError)\b")
E = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once
BIG = "1e308"
DEEP_JSON = "[" * 100_000 + "]" * 100_000


@dataclass(frozen=True)
class Sweep:
    """One command line (``{case}``: the case's own empty directory, ``{fx}``: the shared input files), the field
    its error must name and fragments it must hold; ``stack`` writes a mutated committed stack into
    ``{case}/stacks`` first (the field is then a key path that must start a problem line)."""

    surface: str
    label: str
    argv: tuple[str, ...]
    field: str
    fragments: tuple[str, ...] = ()
    stack: Callable[[Path], None] | None = None

    @property
    def id(self) -> str:
        return f"{self.surface}:{self.label}"


def _stack(name: str, config: Any = None, inventory: Any = None) -> Callable[[Path], None]:
    def write(root: Path) -> None:
        build(Case("sweep", "x", name, "", config=config, inventory=inventory), root)

    return write


def key(label: str, path: str, value: Any, frag: tuple[str, ...] = (), stack: str = "a2-staging",
        surface: str = "stack") -> Sweep:
    """A stack key set to ``value`` (``inventory.<path>`` edits the inventory) and ``plan`` run on it."""
    if path.startswith("inventory."):
        edit = _stack(stack, inventory=inv(path.removeprefix("inventory."), value))
    else:
        edit = _stack(stack, config=cfg(path, value))
    return Sweep(surface, label, ("plan", "--stack", stack, "--stacks-dir", "{case}/stacks"), path, frag, edit)


PLAN_A2 = ("plan", "--stack", "a2-staging", "--stacks-dir", "{case}/stacks")
TP = ("check", "throughput", "--endpoint", E, "--input-len", "8", "--output-len", "8", "--concurrency", "1",
      "--num-prompts", "1", "--no-progress")
RO = ("rollout", "--stack", "a2-staging", "--dry-run", "--allow-downtime")
FW = ("faults", "watch", "--stack", "local", "--proxy", E, "--max-cycles", "1")
PDP = ("pd-planner", "--stack", "local", "--dry-run", "--max-cycles", "1", "--proxy-metrics", E + "/metrics")
SERVE = ("balance", "serve", "--experts", "16", "--ranks", "4", "--slots", "4", "--dry-run", "--max-cycles", "1",
         "--interval", "0.01")
EVAL = ("balance", "evaluate", "--load-dir", "{fx}/load.npy", "--ranks", "4", "--plot", "{case}/out/plot.png")
SIM = ("sim", "--role", "prefill", "--instance", "p0", "--port", "18999", "--kv-port", "18998")
PB = ("playbook", "run", "preflight", "--check")


def stack_cases() -> list[Sweep]:
    day = ("86400",)
    return [
        # durations: every timeout, interval and probe at most a day
        key("pd-interval-huge", "pd_ratio.interval_s", 1e308, day),
        key("pd-interval-tiny", "pd_ratio.interval_s", 0.001, ("0.01",)),
        key("pd-drain-huge", "pd_ratio.drain_timeout_s", 1e308, day),
        key("pd-ready-huge", "pd_ratio.ready_timeout_s", 1e6, day),
        key("startup-delay-huge", "simulator.startup_delay_s", 1e308, day),
        key("speedup-tiny", "simulator.speedup", 1e-308, ("0.001",)),
        key("speedup-huge", "simulator.speedup", 10000, ("1000",)),  # KV freed before the decode pulls it
        key("speedup-astronomic", "simulator.speedup", 1e300, ("1000",)),
        key("startup-probe-huge", "kubernetes.startup_probe_seconds", 10 ** 12, day),
        key("grace-huge", "kubernetes.termination_grace_seconds", 10 ** 19, day),
        key("checks-timeout-huge", "kubernetes.checks_timeout_seconds", 10 ** 19, day),
        key("ttft-huge", "slo.ttft_ms", 1e308, ("86400000",)),
        key("tpot-huge", "slo.tpot_ms", 1e300, ("86400000",)),
        # sizes and counts that leave the machine
        key("shm-huge", "kubernetes.shm_size_gib", 10 ** 12, ("4096",)),
        key("request-rate-huge", "slo.expected_request_rate", 1e308, ("1000000",)),
        key("min-goodput-huge", "throughput_check.min_goodput", 1e308, ("1000000",)),
        key("num-prompts-huge", "throughput_check.num_prompts", 10 ** 9, ("1048576",)),
        key("concurrency-huge", "throughput_check.concurrency", 10 ** 12, ("1048576",)),
        key("input-len-huge", "throughput_check.input_len", 10 ** 12, ("1048576",)),
        key("output-len-huge", "throughput_check.output_len", 10 ** 12, ("1048576",)),
        key("batched-tokens-huge", "decode.max_num_batched_tokens", 10 ** 15, ("1048576",)),
        key("api-servers-huge", "prefill.api_server_count", 10 ** 6, ("256",)),
        key("port-400-digits", "ports.api_base", int("9" * 400), ("65535",)),
        # text no argv word or version can be
        Sweep("stack", "extra-arg-nul", PLAN_A2, "engine.extra_args[1]", ("control character",),
              _stack("a2-staging", config=cfg("engine.extra_args", ["--enforce-eager", "a\0b"]))),
        key("version-newline", "engine.vllm_ascend_version", "0.23.0\n", ("release number",)),
        key("version-shell", "engine.vllm_ascend_version", "0.23.0 $(id)", ("release number",)),
        # settings that contradict each other, blamed on the key that asks too much
        Sweep("stack", "pvc-without-name", PLAN_A2, "kubernetes.model_pvc_name", ("model_source",),
              _stack("a2-staging", config=cfg("kubernetes.model_source", "pvc"))),
        # 100 groups overflow the port ranges too: the error is the node count, not the ports
        Sweep("stack", "groups-past-cluster", PLAN_A2, "pd_ratio.groups", ("too few nodes",),
              _stack("a2-staging", config=cfg("pd_ratio", {"mode": "auto", "groups": 100}))),
        # the inventory
        key("connect-timeout-inf", "inventory.ssh.connect_timeout_s", float("inf"), ("finite",)),
        key("connect-timeout-nan", "inventory.ssh.connect_timeout_s", float("nan"), ("finite",)),
        key("connect-timeout-huge", "inventory.ssh.connect_timeout_s", 1e308, ("3600",)),
        key("key-file-newline", "inventory.ssh.key_file", "~/.ssh/id\ned25519", ("control character",)),
        key("known-hosts-nul", "inventory.ssh.known_hosts", "known\0hosts", ("control character",)),
        key("driver-version-newline", "inventory.nodes[0].versions.driver", "24.1\n$(id)", ("control character",)),
        key("super-device-id-huge", "inventory.nodes[0].devices[0].super_device_id", 2 ** 70, ("4294967295",),
            stack="cm384-prod"),
    ]


def flag_cases() -> list[Sweep]:
    ro = [Sweep("rollout", f"{flag}-{label}", (*RO, f"--{flag}", value), f"--{flag}", frag) for flag, label, value, frag in [
        ("drain-timeout-s", "huge", BIG, ("86400",)), ("ready-timeout-s", "day-and-more", "86401", ("86400",)),
        ("check-timeout-s", "huge", BIG, ("86400",)), ("routable-timeout-s", "huge", BIG, ("86400",)),
        ("poll-s", "tiny", "1e-300", ("0.01",)), ("poll-s", "huge", BIG, ("86400",)),
        ("kube-context", "newline", "a\nb", ("control characters",)),
        ("state-dir", "a-file", "{fx}/load.npy", ("not a directory",)),
    ]]
    fw = [Sweep("faults", f"{flag}-{label}", (*FW, f"--{flag}", value), f"--{flag}", frag) for flag, label, value, frag in [
        ("interval", "huge", BIG, ("86400",)), ("interval", "tiny", "1e-9", ("0.01",)),
        ("node-interval", "huge", BIG, ("86400",)), ("api-timeout", "huge", BIG, ("86400",)),
        ("check-timeout", "huge", BIG, ("86400",)), ("settle", "huge", BIG, ("86400",)),
        ("recheck", "huge", BIG, ("86400",)), ("max-cycles", "huge", str(10 ** 30), ("1048576",)),
        ("kube-context", "newline", "ctx\n", ("control characters",)),
    ]]
    pdp = [Sweep("pd-planner", f"{flag}-{label}", (*PDP, f"--{flag}", value), f"--{flag}", frag)
           for flag, label, value, frag in [
               ("interval", "huge", BIG, ("86400",)), ("interval", "tiny", "0.001", ("0.01",)),
               ("max-cycles", "huge", str(10 ** 30), ("1048576",)), ("k", "huge", str(10 ** 30), ("1048576",)),
               ("max-changes-per-hour", "huge", str(10 ** 6), ("3600",)),
               ("prompt-tokens", "huge", BIG, ()), ("state-dir", "a-file", "{fx}/load.npy", ("not a directory",)),
               # a mean prompt below one token would make prefill demand vanish and move every group to decode
               ("prompt-tokens", "below-one", "1e-9", (">= 1",)),
           ]]
    serve = [Sweep("balance serve", label, (*SERVE, *argv), fld, frag) for label, argv, fld, frag in [
        ("interval-huge", ("--instance", "a=" + E, "--interval", BIG), "--interval", ("86400",)),
        ("interval-tiny", ("--instance", "a=" + E, "--interval", "1e-4"), "--interval", ("0.01",)),
        ("max-cycles-huge", ("--instance", "a=" + E, "--max-cycles", str(10 ** 30)), "--max-cycles", ("1048576",)),
        ("instance-twice", ("--instance", "a=" + E, "--instance", "a=http://127.0.0.1:8"), "--instance", ("twice",)),
        ("instance-and-dump-dir-same-name", ("--instance", "a=" + E, "--dump-dir", "a={case}"), "--instance/--dump-dir",
         ("twice",)),
        ("instance-name-newline", ("--instance", "a\nb=" + E), "--instance", ("control characters",)),
    ]]
    ev = [Sweep("balance evaluate", label, (*EVAL, *argv), fld, frag) for label, argv, fld, frag in [
        ("window-seconds-huge", ("--window-seconds", BIG), "--window-seconds", ("86400",)),
        ("window-steps-huge", ("--window-steps", str(10 ** 30)), "--window-steps", ("1048576",)),
        ("interval-huge", ("--interval", str(10 ** 30)), "--interval", ("1048576",)),
        ("batch-tokens-huge", ("--batch-tokens", str(10 ** 30)), "--batch-tokens", ("1048576",)),
        ("ranks-huge", ("--ranks", str(10 ** 30)), "--ranks", ("1048576",)),
    ]]
    sim = [Sweep("sim", label, (*SIM, *argv), fld, frag) for label, argv, fld, frag in [
        ("kv-timeout-huge", ("--kv-timeout-s", BIG), "--kv-timeout-s", ("86400",)),
        ("startup-delay-huge", ("--startup-delay", BIG), "--startup-delay", ("86400",)),
        ("speedup-tiny", ("--speedup", "1e-308"), "--speedup", ("0.001",)),
        ("speedup-huge", ("--speedup", "10000"), "--speedup", ("1000",)),
        ("seed-negative", ("--seed", "-1"), "--seed", ()),
        ("port-is-kv-port", ("--port", "18999", "--kv-port", "18999"), "--kv-port", ("also --port",)),
        ("expert-map-deep", ("--expert-map", "{fx}/deep.json"), "--expert-map", ("nested too deeply",)),
        ("expert-map-null", ("--expert-map", "{fx}/null.json"), "--expert-map", ()),
        ("expert-map-binary", ("--expert-map", "{fx}/binary.json"), "--expert-map", ("UTF-8",)),
    ]]
    check = [
        Sweep("check", "smoke-timeout-huge", ("check", "smoke", "--endpoint", E, "--timeout-s", BIG), "--timeout-s", ("86400",)),
        Sweep("check", "throughput-timeout-huge", (*TP, "--timeout-s", BIG), "--timeout-s", ("86400",)),
        Sweep("check", "throughput-slo-huge", (*TP, "--slo-ttft-ms", BIG), "--slo-ttft-ms", ("milliseconds",)),
        Sweep("check", "throughput-rate-huge", ("check", "throughput", "--endpoint", E, "--input-len", "8", "--output-len",
                                                "8", "--request-rate", BIG, "--num-prompts", "1", "--no-progress"),
              "--request-rate", ()),
        Sweep("local", "up-ready-huge", ("up", "--stack", "local", "--detach", "--ready-timeout-s", BIG, "--state-dir",
                                         "{case}/state"), "--ready-timeout-s", ("86400",)),
        Sweep("local", "status-stack-empty", ("status", "--stack", ""), "--stack", ("empty",)),
        Sweep("local", "down-stack-empty", ("down", "--stack", ""), "--stack", ("empty",)),
        Sweep("local", "status-state-dir-a-file", ("status", "--state-dir", "{fx}/load.npy"), "--state-dir",
              ("not a directory",)),
        Sweep("local", "down-state-dir-a-file", ("down", "--state-dir", "{fx}/load.npy"), "--state-dir",
              ("not a directory",)),
    ]
    return [*ro, *fw, *pdp, *serve, *ev, *sim, *check]


def file_cases() -> list[Sweep]:
    def plan_file(label: str, name: str, fld: str, frag: tuple[str, ...] = ()) -> Sweep:
        return Sweep("plan-file", label, ("pd-planner", "--plan-file", f"{{fx}}/{name}", "--dry-run", "--max-cycles", "1",
                                          "--proxy-metrics", E + "/metrics"), fld, frag)

    cases = [
        plan_file("deep", "deep.json", "--plan-file", ("nested too deeply",)),
        plan_file("key-twice", "plan-twice.json", "--plan-file", ("given twice",)),
        plan_file("binary", "binary.json", "--plan-file", ("UTF-8",)),
        plan_file("a-list", "list.json", "--plan-file", ("JSON object",)),
        plan_file("no-decode", "plan-no-decode.json", "config.decode", ("missing",)),
        plan_file("config-a-list", "plan-config-list.json", "config", ("JSON object",)),
        plan_file("stack-a-number", "plan-stack-int.json", "stack", ("must be text",)),
        plan_file("port-text", "plan-port-text.json", "proxy_port", ("whole number",)),
        plan_file("instances-text", "plan-instances-text.json", "instances", ("JSON list",)),
        plan_file("slo-text", "plan-slo-text.json", "config.slo.ttft_ms", ("number",)),
        plan_file("max-seqs-null", "plan-seqs-null.json", "config.decode.max_num_seqs", ("whole number",)),
        plan_file("ttft-nan", "plan-ttft-nan.json", "config.slo.ttft_ms", ("finite",)),
        plan_file("dp-bool", "plan-dp-bool.json", "instances[0].dp", ("whole number",)),
    ]
    topo = ("faults", "watch", "--proxy", E, "--max-cycles", "1", "--topology")
    cases += [Sweep("topology", label, (*topo, f"{{fx}}/{name}"), fld, frag) for label, name, fld, frag in [
        ("deep", "deep.json", "--topology", ("nested too deeply",)),
        ("key-twice", "topo-twice.json", "--topology", ("given twice",)),
        ("node-twice", "topo-node-twice.json", "--topology nodes[1].name", ("given twice",)),
        ("node-name-newline", "topo-node-newline.json", "--topology nodes[0].name", ("node name",)),
        ("instance-name-space", "topo-instance-space.json", "--topology instances[0].name", ("instance name",)),
    ]]
    bp = ("balance", "plan", "--ranks", "4", "--slots", "4", "--out", "{case}/out/map.json")
    cases += [Sweep("balance plan", label, (*bp, *argv), fld, frag) for label, argv, fld, frag in [
        ("load-deep", ("--load", "{fx}/deep.json"), "--load", ("nested too deeply",)),
        ("load-key-twice", ("--load", "{fx}/load-twice.json"), "--load", ("given twice",)),
        ("load-counts-1e308", ("--load", "{fx}/load-huge.json"), "--load expert_load", ("2^53",)),
        ("previous-deep", ("--history", "{fx}/load.npy", "--previous", "{fx}/deep.json"), "--previous",
         ("nested too deeply",)),
    ]]
    cases += [Sweep("state", f"{cmd}-{label}", (cmd, "--state-dir", f"{{fx}}/{state}"), "--state-dir", frag)
              for cmd in ("status", "down") for label, state, frag in [
                  ("deep", "state-deep", ("nested too deeply",)), ("pid-huge", "state-pid-huge", ("pid",))]]
    pb = [Sweep("playbook", label, (*PB, "--stack", stack, *argv), fld, frag) for label, stack, argv, fld, frag in [
        ("vars-all-a-list", "local", ("--vars", "{fx}/vars-all-list.yaml"), "--vars.all", ("mapping",)),
        ("vars-hosts-a-list", "local", ("--vars", "{fx}/vars-hosts-list.yaml"), "--vars.hosts", ("mapping",)),
        ("vars-host-a-number", "local", ("--vars", "{fx}/vars-host-scalar.yaml"), "--vars.hosts.sim-node-01",
         ("mapping",)),
        ("vars-deep", "local", ("--vars", "{fx}/vars-deep.yaml"), "--vars", ("nested too deeply",)),
        ("vars-key-twice", "local", ("--vars", "{fx}/vars-twice.yaml"), "--vars.all.model_dir", ("given twice",)),
        ("vars-binary", "local", ("--vars", "{fx}/binary.json"), "--vars", ("UTF-8",)),
        ("var-bad-yaml", "local", ("--var", "x=[1, 2"), "--var x", ("YAML",)),
        ("var-deep", "local", ("--var", "x=" + "[" * 100_000), "--var x", ("nested too deeply",)),
        ("known-hosts-directory", "local", ("--known-hosts", "{fx}"), "--known-hosts", ("directory",)),
        ("inventory-bad-address", "a2-staging", ("--inventory", "{fx}/inv-bad-ip.yaml"),
         "--inventory.nodes[0].host_ip", ("inv-bad-ip.yaml", "IPv4")),
        ("inventory-key-twice", "a2-staging", ("--inventory", "{fx}/inv-twice.yaml"),
         "--inventory.nodes[0].nic", ("inv-twice.yaml", "given twice")),
        ("inventory-timeout-inf", "a2-staging", ("--inventory", "{fx}/inv-timeout-inf.yaml"),
         "--inventory.ssh.connect_timeout_s", ("inv-timeout-inf.yaml", "finite")),
        ("inventory-typo", "local", ("--inventory", "{fx}/inv-typo.yaml"), "--inventory.nodes[0].hostip",
         ("inv-typo.yaml", "did you mean 'host_ip'")),
        ("inventory-no-nodes", "local", ("--inventory", "{fx}/inv-no-nodes.yaml"), "--inventory.nodes",
         ("inv-no-nodes.yaml",)),
    ]]
    pb += [
        Sweep("playbook", "playbook-file-deep", ("playbook", "run", "{fx}/book-deep.yaml", "--stack", "local", "--check"),
              "playbook", ("nested too deeply",)),
        Sweep("playbook", "playbook-file-binary", ("playbook", "run", "{fx}/book-binary.yaml", "--stack", "local",
                                                   "--check"), "playbook", ("UTF-8",)),
    ]
    return [*cases, *pb]


CASES = stack_cases() + flag_cases() + file_cases()


# --- input files --------------------------------------------------------------------------------------------


def _plan_doc() -> dict[str, Any]:
    code, out, err = run_cli(["plan", "--stack", "local", "--json"])
    assert code == 0, err
    return json.loads(out)


def make_fixtures(fx: Path) -> None:
    """Every input file a case names (no case ever writes here)."""
    def text(name: str, data: str | bytes) -> None:
        (fx / name).write_bytes(data if isinstance(data, bytes) else data.encode())

    rng = np.random.default_rng(11)
    np.save(fx / "load.npy", rng.integers(1, 100, (4, 4, 16)).astype(float))
    text("deep.json", DEEP_JSON)
    text("null.json", "null")
    text("list.json", "[]")
    text("binary.json", b"\xff\xfe\x00garbage")
    plan = _plan_doc()
    plan_text = json.dumps(plan)
    text("plan-twice.json", plan_text[:-1] + ', "stack": "other"}')

    def mutated(name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        doc = copy.deepcopy(plan)
        edit(doc)
        text(name, json.dumps(doc))

    mutated("plan-no-decode.json", lambda d: d["config"].pop("decode"))
    mutated("plan-config-list.json", lambda d: d.__setitem__("config", []))
    mutated("plan-stack-int.json", lambda d: d.__setitem__("stack", 5))
    mutated("plan-port-text.json", lambda d: d.__setitem__("proxy_port", "9000"))
    mutated("plan-instances-text.json", lambda d: d.__setitem__("instances", "all"))
    mutated("plan-slo-text.json", lambda d: d["config"]["slo"].__setitem__("ttft_ms", "fast"))
    mutated("plan-seqs-null.json", lambda d: d["config"]["decode"].__setitem__("max_num_seqs", None))
    mutated("plan-ttft-nan.json", lambda d: d["config"]["slo"].__setitem__("ttft_ms", float("nan")))
    mutated("plan-dp-bool.json", lambda d: d["instances"][0].__setitem__("dp", True))
    text("plan-bom.json", "\ufeff" + plan_text)
    topo = {"stack": "x", "nodes": [{"name": "n1", "role": "prefill"}], "instances": []}
    text("topo-twice.json", json.dumps(topo)[:-1] + ', "stack": "y"}')
    text("topo-node-twice.json", json.dumps({**topo, "nodes": [{"name": "n1"}, {"name": "n1"}]}))
    text("topo-node-newline.json", json.dumps({**topo, "nodes": [{"name": "n1\nn2"}]}))
    text("topo-instance-space.json", json.dumps({**topo, "instances": [{"name": "p 0", "role": "prefill", "nodes": ["n1"]}]}))
    text("load-twice.json", '{"expert_load": [[1, 2]], "expert_load": [[3, 4]]}')
    text("load-huge.json", json.dumps({"expert_load": [[1e308] * 16] * 4}))
    record = {"name": "a", "kind": "sim", "argv": [], "health_url": "", "log": ""}
    for name, doc in (("state-deep", DEEP_JSON),
                      ("state-pid-huge", json.dumps({"stack": "x", "proxy_url": "u", "processes": [{**record, "pid": 2 ** 70}]}))):
        (fx / name).mkdir()
        text(f"{name}/state.json", doc)
    text("vars-all-list.yaml", "all: [1, 2]\n")
    text("vars-hosts-list.yaml", "hosts: [1]\n")
    text("vars-host-scalar.yaml", "hosts: {sim-node-01: 5}\n")
    text("vars-host-ok.yaml", "all: {model_dir: /data/models/R1}\nhosts: {sim-node-01: {x: 1}}\n")
    text("vars-deep.yaml", "all: " + "[" * 100_000 + "\n")
    text("vars-twice.yaml", "all:\n  model_dir: /a\n  model_dir: /b\n")
    a2 = yaml.safe_load((STACKS / "inventories" / "a2-staging.yaml").read_text())
    bad_ip = copy.deepcopy(a2)
    bad_ip["nodes"][0]["host_ip"] = "192.0.2.300"
    text("inv-bad-ip.yaml", yaml.safe_dump(bad_ip, sort_keys=False))
    a2_text = (STACKS / "inventories" / "a2-staging.yaml").read_text()
    nic = re.search(r"^(\s*)nic: .*$", a2_text, re.MULTILINE)
    assert nic is not None
    text("inv-twice.yaml", a2_text[:nic.end()] + f"\n{nic.group(1)}nic: eth9" + a2_text[nic.end():])
    timeout = copy.deepcopy(a2)
    timeout.setdefault("ssh", {})["connect_timeout_s"] = float("inf")
    text("inv-timeout-inf.yaml", yaml.safe_dump(timeout, sort_keys=False))
    local = (STACKS / "inventories" / "local.yaml").read_text()
    text("inv-typo.yaml", local.replace("host_ip", "hostip", 1))
    text("inv-no-nodes.yaml", "ssh: {user: root}\n")
    text("book-deep.yaml", "name: x\nsteps: " + "[" * 5000 + "\n")
    text("book-binary.yaml", b"name: \xff\xfe\n")


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


class Started(Exception):
    """A case got as far as starting processes or connecting to hosts."""


def _started(*_args: Any, **_kwargs: Any) -> None:
    raise Started()


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep-fixtures")
    make_fixtures(root)
    return root


@pytest.fixture()
def quiet_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No kubeconfig, a state root of this test's own, a proxy token (so a case never fails for want of one)."""
    monkeypatch.setenv("ASCEND_DEPLOY_STATE_DIR", str(tmp_path / "state-root"))
    monkeypatch.setenv("ASCEND_PROXY_TOKEN", "sweep-token")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("ASCEND_DEPLOY_STACKS", raising=False)
    return tmp_path


def _problem_paths(text: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^  - (.+?): ", text, re.MULTILINE)]


def test_the_table_covers_every_class() -> None:
    counts = Counter(c.surface for c in CASES)
    assert len({c.id for c in CASES}) == len(CASES), "case labels must be unique"
    assert len(CASES) >= 120 and min(counts.values()) >= 4, counts


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_naming_the_field(case: Sweep, fx: Path, quiet_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = quiet_env / "case"
    own.mkdir()
    if case.stack is not None:
        case.stack(own)
    fixture_files = _files(fx)
    before = _files(own)
    argv = [a.replace("{case}", str(own)).replace("{fx}", str(fx)) for a in case.argv]
    monkeypatch.chdir(own)
    with mock.patch("ascend_runtime.local.runner.bring_up", _started), \
            mock.patch("ascend_runtime.sim.server.run_simulator", _started), \
            mock.patch("ascend_runtime.hosts.engine.Runner.run", _started):
        try:
            code, out, err = run_cli(argv)
        except Started:
            pytest.fail("the bad input was accepted: processes were started or hosts contacted")
    text = out + err
    assert code == 2, f"exit {code}, want 2:\n{text[-600:]}"
    assert not LEAKS.search(text), f"a traceback or an exception's name:\n{text[-600:]}"
    if case.stack is not None:
        assert case.field in _problem_paths(text), f"no problem line starts with {case.field!r}:\n{text[-600:]}"
    else:
        assert case.field in text, f"{case.field!r} not named:\n{text[-600:]}"
    missing = [f for f in case.fragments if f not in text]
    assert not missing, f"{missing} missing from:\n{text[-600:]}"
    assert len(text) < 3000, f"message too long ({len(text)} characters)"
    assert _files(own) == before, f"wrote {sorted(set(_files(own)) - set(before))[:4]}"
    assert _files(fx) == fixture_files, "a case wrote into the shared fixtures"
    root = quiet_env / "state-root"
    assert not root.exists() or not _files(root), "state written"


@pytest.mark.parametrize("target", ["stack", "inventory"])
def test_yaml_nested_100000_deep_is_an_error_not_a_crash(target: str, tmp_path: Path) -> None:
    """libyaml's composer recursed once per level and overflowed the C stack (SIGSEGV); a real process proves
    the loader now refuses the document before composing it."""
    stacks = build(Case("sweep", "deep", "a2-staging", ""), tmp_path)
    name = "Pulumi.a2-staging.yaml" if target == "stack" else "inventories/a2-staging.yaml"
    deep = "  - " + "- " * 100_000 + "x\n"
    path = stacks / name
    path.write_text(path.read_text() + ("  ascend-deepseek:pd_ratio:\n" if target == "stack" else "extra:\n") + deep)
    proc = subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", "a2-staging", "--stacks-dir",
                           str(stacks)], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-500:])
    assert "nested too deeply" in proc.stderr and "Traceback" not in proc.stderr
    assert re.search(r"^  - (stack|inventory): ", proc.stderr, re.MULTILINE), proc.stderr[-500:]


# --- valid input keeps working ------------------------------------------------------------------------------


def test_pd_planner_dry_run_says_what_it_does(quiet_env: Path) -> None:
    """At the default log level a dry run prints what it reads, how often, that it publishes nothing, and how
    many decisions it made."""
    code, out, err = run_cli(["pd-planner", "--stack", "local", "--dry-run", "--max-cycles", "2", "--interval", "0.01",
                              "--proxy-metrics", E + "/metrics"])
    assert code == 0, err
    first, last = out.strip().splitlines()[0], out.strip().splitlines()[-1]
    assert "stack local" in first and E + "/metrics" in first and "every 0.01 s" in first
    assert "dry run" in first and "publishes nothing" in first and "2 cycle(s)" in first
    assert last.startswith("pd-planner: stopped after") and "dry run: none published or applied" in last


def test_plan_file_with_byte_order_mark_is_read(fx: Path, quiet_env: Path) -> None:
    code, out, err = run_cli(["pd-planner", "--plan-file", str(fx / "plan-bom.json"), "--dry-run", "--max-cycles", "1",
                              "--interval", "0.01", "--proxy-metrics", E + "/metrics"])
    assert code == 0, err
    assert "pd-planner: stack local (from" in out


def test_plan_file_round_trips_every_committed_stack() -> None:
    from ascend_runtime.pdplanner.from_plan import plan_from_json
    from ascend_runtime.planner import load_plan

    for stack in ("local", "kind", "a2-staging", "cm384-prod"):
        plan = load_plan(stack)
        assert plan_from_json(plan.to_json()) == plan, stack


def test_release_with_a_leading_v_is_the_bare_release(tmp_path: Path) -> None:
    """``vllm_ascend_version: v0.23.0`` plans as 0.23.0, so every reader of the value (the balancer's 0.11 test
    among them) sees one spelling."""
    from ascend_runtime.planner import load_plan

    stacks = build(Case("sweep", "v", "a2-staging", "", config=cfg("engine.vllm_ascend_version", "v0.23.0")), tmp_path)
    assert load_plan("a2-staging", stacks).vllm_ascend_version == "0.23.0"


def test_bounds_at_their_ceiling_are_accepted(tmp_path: Path) -> None:
    """A day exactly is a valid timeout; the ceilings are inclusive."""
    from ascend_runtime.planner import load_plan

    edit = cfg("pd_ratio", {"drain_timeout_s": 86400.0, "ready_timeout_s": 86400, "interval_s": 0.01})
    stacks = build(Case("sweep", "ceiling", "a2-staging", "", config=edit,
                        inventory=inv("ssh.connect_timeout_s", 3600.0)), tmp_path)
    plan = load_plan("a2-staging", stacks)
    assert plan.config["pd_ratio"]["drain_timeout_s"] == 86400.0


def test_evaluate_plot_in_a_new_directory_is_written(fx: Path, quiet_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--plot`` may name a directory still to be made (as every output flag may): it is made after the replay
    instead of the replay failing at the end."""
    monkeypatch.chdir(quiet_env)
    plot = quiet_env / "new" / "dir" / "plot.png"
    code, _out, err = run_cli(["balance", "evaluate", "--load-dir", str(fx / "load.npy"), "--ranks", "4", "--interval",
                               "1", "--policy", "greedy", "--plot", str(plot)])
    assert code == 0, err
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_playbook_inventory_that_fits_the_stack_runs(fx: Path, quiet_env: Path) -> None:
    """A valid ``--inventory`` passes the same checks and reaches the run (patched: no host is contacted)."""
    good = quiet_env / "inv.yaml"
    good.write_text((STACKS / "inventories" / "local.yaml").read_text())
    with mock.patch("ascend_runtime.hosts.engine.Runner.run", _started), pytest.raises(Started):
        run_cli(["playbook", "run", "preflight", "--stack", "local", "--check", "--inventory", str(good),
                 "--var", "x=# only a comment", "--vars", str(fx / "vars-host-ok.yaml")])
