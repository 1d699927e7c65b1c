"""Bad input found by fuzzing every command and stack file, run through ``ascend-deploy`` in this one process.

The cases are those a mutation fuzz of the commands' flags, the stack and inventory leaves and the files
themselves let through (a traceback, a hang on a FIFO, a wrong exit code, an error blaming the wrong key or
flooding the terminal, a device file replaced by an output), plus a sample of the neighbours it found handled.
Every case must exit 2, name its field (the flag or the key path) and, where given, the fix, print no
traceback, and leave nothing behind: no file in the case's directory and no process started (starting the
local stack, a simulator or a playbook run is patched to record the attempt).
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
import yaml

from tests.config.corpus import STACKS, run_cli

#: Exception class names and traceback lines that must never reach the user.
LEAKS = re.compile(r"Traceback|File \"/|\b(KeyError|TypeError|AttributeError|IndexError|RuntimeError|OSError|"
                   r"ValueError: embedded|JSONDecodeError|ConfigException|ValidationError)\b")
NS = "ascend-deepseek:"


@dataclass(frozen=True)
class Case:
    """One command line (``{case}`` is the case's own empty directory, ``{fx}`` the shared fixtures) and the
    field its error must name; ``stack`` mutates a committed stack into ``{case}/stacks`` first."""

    surface: str
    label: str
    argv: tuple[str, ...]
    field: str
    fragments: tuple[str, ...] = ()
    stack: Callable[[Path], None] | None = None


# --- stacks written for a case ------------------------------------------------------------------------------


def _stack_files(name: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    doc = yaml.safe_load((STACKS / f"Pulumi.{name}.yaml").read_text(encoding="utf-8"))
    relative = doc["config"][NS + "inventory"]
    return doc, yaml.safe_load((STACKS / relative).read_text(encoding="utf-8")), relative


def stack_edit(name: str, config: Callable[[dict[str, Any]], None] | None = None,
               inventory: Callable[[dict[str, Any]], None] | None = None,
               files: Callable[[Path], None] | None = None) -> Callable[[Path], None]:
    """Write stack ``name`` (its config and inventory mutated) into ``root/stacks``; ``files(stacks)`` last."""

    def write(root: Path) -> None:
        doc, inv, relative = _stack_files(name)
        doc, inv = copy.deepcopy(doc), copy.deepcopy(inv)
        if config:
            config(doc["config"])
        if inventory:
            inventory(inv)
        stacks = root / "stacks"
        (stacks / "inventories").mkdir(parents=True)
        (stacks / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        (stacks / relative).write_text(yaml.safe_dump(inv, sort_keys=False), encoding="utf-8")
        if files:
            files(stacks)

    return write


def _set_device(node: int, device: int, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(inv: dict[str, Any]) -> None:
        inv["nodes"][node]["devices"][device][key] = value

    return edit


def _stack_key(section: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        config.setdefault("ascend-deepseek:" + section, {})[key] = value
    return edit


def _inventory_key(value: str) -> Callable[[dict[str, Any]], None]:
    def edit(config: dict[str, Any]) -> None:
        config[NS + "inventory"] = value

    return edit


def _inventory_loop(stacks: Path) -> None:
    inv = stacks / "inventories" / "a2-staging.yaml"
    inv.unlink()
    os.symlink(stacks / "inventories" / "loop-b.yaml", inv)
    os.symlink(inv, stacks / "inventories" / "loop-b.yaml")


# --- the corpus ---------------------------------------------------------------------------------------------


def stack_cases() -> list[Case]:
    """Stack and inventory files: what plan and render must refuse, naming the key."""
    def plan(label: str, name: str, field: str, frag: tuple[str, ...] = (), **edits: Any) -> Case:
        return Case("stack", label, ("plan", "--stack", name, "--stacks-dir", "{case}/stacks"), field, frag,
                    stack_edit(name, **edits))

    long_name = "inventories/" + "x" * 300 + ".yaml"
    return [
        # one device's missing gateway used to blame its 47 peers, in 10 KB
        plan("gateway-missing-one-device", "a2-staging", "inventory.nodes[0].devices[0].gateway", ("47 of its 48",),
             inventory=_set_device(0, 0, "gateway", None)),
        plan("gateway-other-one-device", "a2-staging", "inventory.nodes[2].devices[5].gateway", ("198.51.100.1",),
             inventory=_set_device(2, 5, "gateway", "198.51.100.254")),
        # a device in another super pod used to be reported on the node, without the device
        plan("super-pod-one-device", "cm384-prod", "inventory.nodes[0].devices[0].super_pod_id", ("super pod 0",),
             inventory=_set_device(0, 0, "super_pod_id", 65536)),
        plan("super-pod-huge", "cm384-prod", "inventory.nodes[1].devices[3].super_pod_id", (),
             inventory=_set_device(1, 3, "super_pod_id", 2 ** 63)),
        plan("inventory-key-nul", "a2-staging", "inventory", ("control character",),
             config=_inventory_key("inventories/a\0b.yaml")),
        plan("inventory-key-newline", "a2-staging", "inventory", ("control character",),
             config=_inventory_key("inventories/a\nb.yaml")),
        plan("inventory-key-long-name", "a2-staging", "inventory", ("255 bytes",), config=_inventory_key(long_name)),
        plan("inventory-symlink-loop", "a2-staging", "inventory", ("symlink loop",), files=_inventory_loop),
        plan("inventory-key-escapes", "a2-staging", "inventory", ("inside the stacks directory",),
             config=_inventory_key("../../etc/passwd")),
        plan("inventory-key-dir", "a2-staging", "inventory", ("directory",), config=_inventory_key("inventories")),
        # absurd sizes used to surface as an HBM overflow blamed on max_num_seqs
        plan("reserve-over-the-budget", "a2-staging", "decode.reserve_gib", ("HBM overflow", "weights take"),
             config=_stack_key("decode", "reserve_gib", 60)),
        plan("reserve-huge", "a2-staging", "decode.reserve_gib", ("1024",), config=_stack_key("decode", "reserve_gib", 5000)),
        plan("hidden-size-huge", "a2-staging", "model.hidden_size", ("65536",),
             config=_stack_key("model", "hidden_size", 10 ** 7)),
        plan("redundant-experts-huge", "a2-staging", "prefill.redundant_experts", ("4096",),
             config=_stack_key("prefill", "redundant_experts", 10 ** 6)),
        Case("stack", "stacks-dir-missing", ("plan", "--stack", "local", "--stacks-dir", "{case}/nope"), "stacks-dir",
             ("does not exist",)),
        Case("stack", "stacks-dir-a-file", ("plan", "--stack", "local", "--stacks-dir", "{fx}/existing.txt"), "stacks-dir",
             ("not a directory",)),
    ]


def flag_cases(fx: Path) -> list[Case]:
    """Flags of every command: paths, URLs, names, numbers the fuzz found let through, and neighbours."""
    good = str(fx / "good.npy")
    fifo, existing = str(fx / "fifo"), str(fx / "existing.txt")
    long_path = "x" * 300
    cases: list[Case] = []
    # paths: empty, NUL, newline, a name no file system takes, a FIFO (which would block a reader, or be
    # replaced by an atomic writer)
    bp = ("balance", "plan", "--ranks", "4", "--slots", "4")
    for label, value, frag in (("empty", "", ("is empty",)), ("nul", "a\0b", ("control character",)),
                               ("newline", "a\nb", ("control character",)), ("too-long", long_path, ("255 bytes",))):
        cases += [
            Case("paths", f"plan-stacks-dir-{label}", ("plan", "--stack", "local", "--stacks-dir", value), "--stacks-dir", frag),
            Case("paths", f"render-out-{label}", ("render", "--stack", "local", "--out", value), "--out", frag),
            Case("paths", f"balance-plan-out-{label}", (*bp, "--history", good, "--out", value), "--out", frag),
            Case("paths", f"balance-plan-history-{label}", (*bp, "--history", value, "--out", "{case}/m.json"), "--history",
                 frag),
            Case("paths", f"balance-evaluate-plot-{label}", ("balance", "evaluate", "--load-dir", good, "--ranks", "4",
                                                             "--plot", value), "--plot", frag),
            Case("paths", f"up-state-dir-{label}", ("up", "--stack", "local", "--detach", "--state-dir", value),
                 "--state-dir", frag),
            Case("paths", f"pd-planner-target-file-{label}", ("pd-planner", "--stack", "local", "--target-file", value),
                 "--target-file", frag),
            Case("paths", f"check-json-{label}", ("check", "smoke", "--endpoint", "http://127.0.0.1:9", "--json", value),
                 "--json", frag),
            Case("paths", f"playbook-vars-{label}", ("playbook", "run", "preflight", "--stack", "local", "--vars", value),
                 "--vars", frag),
            Case("paths", f"sim-expert-map-{label}", ("sim", "--role", "prefill", "--instance", "p0", "--port", "18999",
                                                      "--kv-port", "18998", "--expert-map", value), "--expert-map", frag),
        ]
    cases += [
        Case("paths", "balance-plan-previous-fifo", (*bp, "--history", good, "--previous", fifo, "--out", "{case}/m.json"),
             "--previous", ("not a regular file",)),
        Case("paths", "balance-plan-load-fifo", (*bp, "--load", fifo, "--out", "{case}/m.json"), "--load",
             ("not a regular file",)),
        Case("paths", "balance-plan-out-fifo", (*bp, "--history", good, "--out", fifo), "--out", ("not a regular file",)),
        Case("paths", "balance-evaluate-plot-fifo", ("balance", "evaluate", "--load-dir", good, "--ranks", "4", "--plot",
                                                     fifo), "--plot", ("not a regular file",)),
        Case("paths", "balance-evaluate-load-dir-missing", ("balance", "evaluate", "--load-dir", "{case}/nope", "--ranks",
                                                            "4", "--plot", "{case}/p.png"), "--load-dir", ("does not exist",)),
        Case("paths", "pd-planner-plan-file-fifo", ("pd-planner", "--plan-file", fifo, "--dry-run"), "--plan-file",
             ("not a regular file",)),
        Case("paths", "pd-planner-plan-file-empty", ("pd-planner", "--plan-file", "", "--dry-run"), "--plan-file",
             ("is empty",)),
        Case("paths", "faults-topology-fifo", ("faults", "watch", "--topology", fifo, "--proxy", "http://127.0.0.1:9"),
             "--topology", ("not a regular file",)),
        Case("paths", "faults-topology-list", ("faults", "watch", "--topology", str(fx / "list.json"), "--proxy",
                                               "http://127.0.0.1:9"), "--topology", ("JSON object",)),
        Case("paths", "faults-topology-bad-node", ("faults", "watch", "--topology", str(fx / "topology-bad.json"),
                                                   "--proxy", "http://127.0.0.1:9"), "--topology", ("nodes[0]",)),
        Case("paths", "check-smoke-json-directory", ("check", "smoke", "--endpoint", "http://127.0.0.1:9", "--json",
                                                     "{case}"), "--json", ("is a directory",)),
        Case("paths", "check-smoke-json-missing-dir", ("check", "smoke", "--endpoint", "http://127.0.0.1:9", "--json",
                                                       "/proc/ascend/x.json"), "--json", ("writ",)),
        Case("paths", "check-smoke-rendered-without-stack", ("check", "smoke", "--endpoint", "http://127.0.0.1:9",
                                                             "--rendered", "{case}"), "--rendered", ("needs --stack",)),
        Case("paths", "check-smoke-rendered-not-a-dir", ("check", "smoke", "--endpoint", "http://127.0.0.1:9", "--stack",
                                                         "local", "--rendered", existing), "--rendered", ("not a directory",)),
        Case("paths", "check-throughput-result-json-fifo", (*_throughput(), "--result-json", fifo), "--result-json",
             ("not a regular file",)),
        Case("paths", "playbook-json-directory", ("playbook", "run", "preflight", "--stack", "local", "--json", "{case}"),
             "--json", ("is a directory",)),
        Case("paths", "playbook-inventory-fifo", ("playbook", "run", "preflight", "--stack", "local", "--inventory", fifo),
             "--inventory", ("not a regular file",)),
        Case("paths", "sim-expert-map-missing", ("sim", "--role", "prefill", "--instance", "p0", "--port", "18999",
                                                 "--kv-port", "18998", "--expert-map", "{case}/nope.json"), "--expert-map",
             ("does not exist",)),
    ]
    # state files `status` and `down` read: never a traceback, never a signal to init or the caller's group
    cases += [
        Case("state", "status-corrupt", ("status", "--state-dir", str(fx / "state-corrupt")), "--state-dir",
             ("not a state file",)),
        Case("state", "down-corrupt", ("down", "--state-dir", str(fx / "state-corrupt")), "--state-dir",
             ("not a state file",)),
        Case("state", "down-pid-0", ("down", "--state-dir", str(fx / "state-pid0")), "--state-dir", ("pid 0",)),
        Case("state", "down-pid-1", ("down", "--state-dir", str(fx / "state-pid1")), "--state-dir", ("pid 1",)),
        Case("state", "down-pid-text", ("down", "--state-dir", str(fx / "state-pidtext")), "--state-dir", ("pid",)),
        Case("state", "status-list", ("status", "--state-dir", str(fx / "state-list")), "--state-dir", ("JSON object",)),
    ]
    # URLs
    smoke = ("check", "smoke", "--endpoint")
    cases += [
        Case("urls", "smoke-bad-port", (*smoke, "http://127.0.0.1:99999"), "--endpoint", ("port",)),
        Case("urls", "smoke-no-scheme", (*smoke, "127.0.0.1:8000"), "--endpoint", ("http(s)",)),
        Case("urls", "smoke-ftp", (*smoke, "ftp://127.0.0.1/"), "--endpoint", ("http(s)",)),
        Case("urls", "smoke-port-zero", (*smoke, "http://127.0.0.1:0"), "--endpoint", ("http(s)",)),
        Case("urls", "smoke-space", (*smoke, "http://127.0.0.1:80/a b"), "--endpoint", ("http(s)",)),
        Case("urls", "throughput-bad-port", ("check", "throughput", "--endpoint", "http://h:70000", "--input-len", "8",
                                             "--output-len", "8", "--concurrency", "1", "--num-prompts", "1"), "--endpoint",
             ("port",)),
        Case("urls", "faults-proxy-words", ("faults", "watch", "--stack", "local", "--proxy", "not a url"), "--proxy",
             ("http(s)",)),
        Case("urls", "faults-kube-api-no-scheme", ("faults", "watch", "--stack", "local", "--proxy", "http://127.0.0.1:9",
                                                   "--kube-api", "10.0.0.1:6443"), "--kube-api", ("http(s)",)),
        Case("urls", "faults-proxy-service-port-0", ("faults", "watch", "--stack", "local", "--proxy-service",
                                                     "deepseek/pd-proxy:0"), "--proxy-service", ("1..65535",)),
        Case("urls", "faults-proxy-service-upper", ("faults", "watch", "--stack", "local", "--proxy-service",
                                                    "Deep/pd-proxy:80"), "--proxy-service", ("DNS-1123",)),
        Case("urls", "pd-planner-proxy-admin-port", ("pd-planner", "--stack", "local", "--dry-run", "--proxy-admin",
                                                     "ns/pd-proxy:99999"), "--proxy-admin", ("1..65535",)),
        Case("urls", "pd-planner-metrics-port-0", ("pd-planner", "--stack", "local", "--dry-run", "--proxy-metrics",
                                                   "http://127.0.0.1:0/metrics"), "--proxy-metrics", ("http(s)",)),
        Case("urls", "rollout-proxy-service-shell", ("rollout", "--stack", "a2-staging", "--dry-run", "--proxy-service",
                                                     "ns/$(id):80"), "--proxy-service", ("DNS-1123",)),
    ]
    # names that reach Kubernetes API paths, environment look-ups or response headers
    serve = ("balance", "serve", "--experts", "16", "--ranks", "4", "--slots", "4", "--instance", "a=http://127.0.0.1:9",
             "--dry-run", "--max-cycles", "1")
    sim = ("sim", "--role", "prefill", "--instance", "p0", "--port", "18999", "--kv-port", "18998")
    cases += [
        Case("names", "faults-noded-namespace", ("faults", "watch", "--stack", "local", "--proxy", "http://127.0.0.1:9",
                                                 "--noded-namespace", "$(id)"), "--noded-namespace", ("DNS-1123",)),
        Case("names", "faults-event-namespace", ("faults", "watch", "--stack", "local", "--proxy", "http://127.0.0.1:9",
                                                 "--event-namespace", "A_B"), "--event-namespace", ("'default'",)),
        Case("names", "faults-token-env", ("faults", "watch", "--stack", "local", "--proxy", "http://127.0.0.1:9",
                                           "--token-env", "a b"), "--token-env", ("environment variable",)),
        Case("names", "faults-stack-empty", ("faults", "watch", "--stack", "", "--proxy", "http://127.0.0.1:9"), "--stack",
             ("empty",)),
        Case("names", "serve-namespace", (*serve, "--namespace", "a/b"), "--namespace", ("DNS-1123",)),
        Case("names", "serve-configmap-words", (*serve, "--configmap", "a b"), "--configmap", ("NAMESPACE/NAME",)),
        Case("names", "serve-configmap-no-cluster", ("balance", "serve", "--experts", "16", "--ranks", "4", "--slots", "4",
                                                     "--instance", "a=http://127.0.0.1:9", "--max-cycles", "1",
                                                     "--configmap", "deepseek/expert-map"), "--configmap", ("kubeconfig",)),
        Case("names", "serve-token-env", (*serve, "--sim-token-env", ""), "--sim-token-env", ("environment variable",)),
        Case("names", "serve-dump-dir-nul", (*serve, "--dump-dir", "b=a\0b"), "--dump-dir b", ("control character",)),
        Case("names", "rollout-token-env", ("rollout", "--stack", "a2-staging", "--dry-run", "--token-env", "1X"),
             "--token-env", ("environment variable",)),
        Case("names", "pd-planner-token-env", ("pd-planner", "--stack", "local", "--dry-run", "--token-env", "A-B"),
             "--token-env", ("environment variable",)),
        Case("names", "evaluate-stack-empty", ("balance", "evaluate", "--load-dir", good, "--stack", "", "--plot",
                                               "{case}/p.png"), "--stack", ("empty",)),
        Case("names", "sim-instance-newline", ("sim", "--role", "prefill", "--instance", "p0\r\nx-evil: 1", "--port",
                                               "18999", "--kv-port", "18998"), "--instance", ("control characters",)),
        Case("names", "sim-model-empty", (*sim, "--model", ""), "--model", ("model name",)),
        Case("names", "sim-model-space", (*sim, "--model", "a b"), "--model", ("model name",)),
        Case("names", "sim-host", (*sim, "--host", "not a host"), "--host", ("cannot listen",)),
        Case("names", "sim-admin-token-env", (*sim, "--admin-token-env", "$(id)"), "--admin-token-env",
             ("environment variable",)),
        Case("names", "smoke-model-empty", (*smoke, "http://127.0.0.1:9", "--model", " "), "--model", ("empty",)),
    ]
    # numbers: non-finite, zero, out of range, too large to size memory or threads by
    tp = _throughput()
    cases += [
        Case("numbers", "smoke-timeout-nan", (*smoke, "http://127.0.0.1:9", "--timeout-s", "nan"), "--timeout-s", ("finite",)),
        Case("numbers", "smoke-timeout-inf", (*smoke, "http://127.0.0.1:9", "--timeout-s", "inf"), "--timeout-s", ("finite",)),
        Case("numbers", "throughput-timeout-inf", (*tp, "--timeout-s", "inf"), "--timeout-s", ("finite",)),
        Case("numbers", "throughput-burstiness-inf", (*tp, "--burstiness", "inf"), "--burstiness", ("finite",)),
        Case("numbers", "throughput-slo-nan", (*tp, "--slo-ttft-ms", "nan"), "--slo-ttft-ms", ("finite",)),
        Case("numbers", "throughput-input-len-huge", (*tp, "--input-len", str(10 ** 20)), "--input-len", ("1048576",)),
        Case("numbers", "throughput-num-prompts-zero", (*tp, "--num-prompts", "0"), "--num-prompts", ()),
        Case("numbers", "throughput-min-goodput-nan", (*tp, "--slo-ttft-ms", "100", "--min-goodput", "nan"),
             "--min-goodput", ("finite",)),
        Case("numbers", "throughput-max-failed-negative", (*tp, "--max-failed", "-1"), "--max-failed", ()),
        Case("numbers", "throughput-percentile-nan", (*tp, "--metric-percentiles", "nan"), "--metric-percentiles", ()),
        Case("numbers", "sim-speedup-inf", (*sim, "--speedup", "inf"), "--speedup", ("finite",)),
        Case("numbers", "sim-port-zero", ("sim", "--role", "prefill", "--instance", "p0", "--port", "0", "--kv-port", "1"),
             "--port", ("1..65535",)),
        Case("numbers", "sim-wire-scale-over-1", (*sim, "--kv-wire-scale", "2"), "--kv-wire-scale", ("<= 1",)),
        Case("numbers", "sim-max-num-seqs-huge", (*sim, "--max-num-seqs", str(10 ** 20)), "--max-num-seqs", ("or less",)),
        Case("numbers", "sim-startup-delay-inf", (*sim, "--startup-delay", "inf"), "--startup-delay", ("finite",)),
        Case("numbers", "serve-experts-huge", (*serve, "--experts", str(10 ** 20)), "--experts", ("or less",)),
        Case("numbers", "serve-min-windows-huge", (*serve, "--min-windows", str(10 ** 20)), "--min-windows", ("or less",)),
        Case("numbers", "up-num-prompts-huge", ("up", "--stack", "local", "--detach", "--num-prompts", str(10 ** 20),
                                                "--state-dir", "{case}/state"), "--num-prompts", ("or less",)),
        Case("numbers", "playbook-forks-huge", ("playbook", "run", "preflight", "--stack", "local", "--forks", "100000"),
             "--forks", ("or less",)),
        Case("numbers", "playbook-retries-zero", ("playbook", "run", "preflight", "--stack", "local", "--connect-retries",
                                                  "0"), "--connect-retries", ("1 or more",)),
        Case("numbers", "faults-interval-inf", ("faults", "watch", "--stack", "local", "--proxy", "http://127.0.0.1:9",
                                                "--interval", "inf"), "--interval", ("finite",)),
        Case("numbers", "rollout-poll-nan", ("rollout", "--stack", "a2-staging", "--dry-run", "--poll-s", "nan"),
             "--poll-s", ("finite",)),
    ]
    return cases


def _throughput() -> tuple[str, ...]:
    return ("check", "throughput", "--endpoint", "http://127.0.0.1:9", "--input-len", "8", "--output-len", "8",
            "--concurrency", "1", "--num-prompts", "1", "--no-progress")


# --- fixtures and checks ------------------------------------------------------------------------------------


def make_fixtures(fx: Path) -> None:
    """Input files the cases name (none is ever written by a case)."""
    rng = np.random.default_rng(5)
    np.save(fx / "good.npy", rng.integers(1, 100, (3, 4, 16)).astype(float))
    os.mkfifo(fx / "fifo")
    (fx / "existing.txt").write_text("keep\n")
    (fx / "list.json").write_text("[1, 2]\n")
    (fx / "topology-bad.json").write_text(json.dumps({"stack": "x", "nodes": ["n1"], "instances": []}))
    record = {"name": "a", "kind": "sim", "argv": [], "health_url": "", "log": ""}
    for name, doc in (("corrupt", "{bad"), ("list", "[]"),
                      ("pid0", {"stack": "x", "proxy_url": "u", "processes": [{**record, "pid": 0}]}),
                      ("pid1", {"stack": "x", "proxy_url": "u", "processes": [{**record, "pid": 1}]}),
                      ("pidtext", {"stack": "x", "proxy_url": "u", "processes": [{**record, "pid": "12"}]})):
        (fx / f"state-{name}").mkdir()
        (fx / f"state-{name}" / "state.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


class Started(Exception):
    """A case got as far as starting processes or connecting to hosts."""


def _started(*_args: Any, **_kwargs: Any) -> None:
    raise Started()


def _run(argv: list[str]) -> tuple[int | str, str, str]:
    try:
        return run_cli(argv)
    except Started:
        return "started processes or a playbook run", "", ""
    except Exception as exc:  # noqa: BLE001 - any escape is a failure of the case
        return f"raised {type(exc).__name__}", "", f"Traceback (escaped main): {exc}"


def test_audit_corpus_exits_2_naming_the_field_with_nothing_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fx = tmp_path / "fx"
    fx.mkdir()
    make_fixtures(fx)
    fixture_files = _files(fx)
    cases = stack_cases() + flag_cases(fx)
    assert len({(c.surface, c.label) for c in cases}) == len(cases), "case labels must be unique"
    counts: dict[str, int] = {}
    for c in cases:
        counts[c.surface] = counts.get(c.surface, 0) + 1
    print("\naudit cases per surface: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    assert len(cases) >= 120 and min(counts.values()) >= 6
    monkeypatch.setenv("ASCEND_DEPLOY_STATE_DIR", str(tmp_path / "state-root"))
    monkeypatch.setenv("ASCEND_PROXY_TOKEN", "audit-token")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    failures: list[str] = []
    with mock.patch("ascend_runtime.local.runner.bring_up", _started), \
            mock.patch("ascend_runtime.sim.server.run_simulator", _started), \
            mock.patch("ascend_runtime.hosts.engine.Runner.run", _started):
        for i, case in enumerate(cases):
            own = tmp_path / f"c{i}"
            own.mkdir()
            if case.stack is not None:
                case.stack(own)
            before = _files(own)
            argv = [a.replace("{case}", str(own)).replace("{fx}", str(fx)) for a in case.argv]
            monkeypatch.chdir(own)
            code, out, err = _run(argv)
            text = out + err
            label = f"{case.surface}:{case.label}"
            wrong = []
            if code != 2:
                wrong.append(f"exit {code}, want 2")
            if LEAKS.search(text):
                wrong.append("a traceback or an exception's name")
            if case.field not in text:
                wrong.append(f"{case.field!r} not named")
            wrong += [f"{f!r} missing" for f in case.fragments if f not in text]
            if len(text) > 6000 or text.count("\n  - ") > 31:
                wrong.append(f"message too long ({len(text)} characters, {text.count(chr(10))} lines)")
            if _files(own) != before:
                wrong.append(f"wrote {sorted(set(_files(own)) - set(before))[:4]}")
            failures += [f"{label}: {w}\n    {text.strip()[-400:]}" for w in wrong]
    assert _files(fx) == fixture_files, "a case wrote into the shared fixtures"
    assert (fx / "fifo").is_fifo(), "an output replaced the FIFO"
    assert not (tmp_path / "state-root").exists() or not _files(tmp_path / "state-root"), "state written"
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


def test_label_selectors_follow_the_kubernetes_grammar() -> None:
    """k8s.io/apimachinery labels.Parse: key, !key, key(=|==|!=)value, key (in|notin) (values), comma-separated."""
    from ascend_runtime.cli.stackargs import label_selector_problem

    good = ["app=x", "app.kubernetes.io/instance=foo", "a,b=c", "!a", "a!=b", "a in (x, y)", "a notin (x),b", "x==y",
            "k=", "leaderworkerset.sigs.k8s.io/name=prefill-0,role in (leader)"]
    bad = ["", "==", "=x", "a=b c", "a in (x", "a in x)", "!a=b", "a=" + "x" * 64, "Bad_Prefix/a=b", "a;b", "a=(b)"]
    assert [g for g in good if label_selector_problem(g)] == []
    assert [b for b in bad if label_selector_problem(b) is None] == []
