"""The corpus of bad stacks and inventories (tests/config/corpus.py), run in this one process.

Every case goes through ``ascend-deploy plan`` (the CLI's ``main``, stderr
captured): exit 2, the case's key path named at the start of a problem line,
no traceback, a short message, never the planted marker. A sample also runs
``render``, ``up`` and ``playbook run``. A handful of the cases found by the
mutation study run as real subprocesses at the end.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ascend_runtime.config.errors import VALUE_LIMIT, ConfigError
from ascend_runtime.config.loader import load_stack
from tests.config.corpus import MARKER, Case, all_cases, applied, build, run_cli, sizes

CASES = all_cases()
#: Fewest cases each class must keep (the corpus can grow, not silently shrink).
MINIMUM_PER_CLASS = {"names": 25, "env-names": 5, "paths": 20, "files": 20, "ips": 30, "ports": 20, "types": 20,
                     "runtime-image": 12,
                     "model": 8, "keys": 20}
#: Longest error line and whole error: a problem is one line; long values are cut, files never quoted.
MAX_LINE = 600
MAX_ERROR = 6000
#: Every this many cases also runs render, up and playbook run.
SAMPLE_EVERY = 6


def _problem_paths(stderr: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^  - (.+?): ", stderr, re.MULTILINE)]


def check_output(case: Case, code: int, out: str, err: str, command: str) -> list[str]:
    """What is wrong with one run's result (empty when the case passed)."""
    text = out + err
    wrong = []
    if code != 2:
        wrong.append(f"exit {code}, want 2")
    if "Traceback" in text:
        wrong.append("traceback")
    if MARKER in text:
        wrong.append("the planted marker was printed (file contents leaked)")
    if len(text) > MAX_ERROR or any(len(line) > MAX_LINE for line in text.splitlines()):
        wrong.append(f"message too long ({len(text)} characters)")
    if command == "plan":
        if case.path not in _problem_paths(err):
            wrong.append(f"no problem names {case.path!r} (paths: {_problem_paths(err)[:5]})")
    elif "".join(case.path.split()) not in "".join(text.split()):
        wrong.append(f"{case.path!r} not named")
    for fragment in case.fragments:
        if fragment not in text:
            wrong.append(f"{fragment!r} missing")
    return [f"{case.id} [{command}]: {w}\n    {text.strip()[:400]}" for w in wrong]


def test_corpus_size_per_class() -> None:
    counts = sizes(CASES)
    print("\ncorpus size per class: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f"; total {len(CASES)}")
    assert sum(counts.values()) >= 100
    short = {cls: (counts.get(cls, 0), n) for cls, n in MINIMUM_PER_CLASS.items() if counts.get(cls, 0) < n}
    assert not short, short


def test_every_case_exits_2_naming_the_key(tmp_path: Path) -> None:
    """The whole corpus in one process: plan for every case, render / up / playbook for a sample."""
    failures: list[str] = []
    for i, case in enumerate(CASES):
        stacks = build(case, tmp_path / f"case{i}")
        name = case.stack_arg or case.stack
        with applied(case, stacks):
            code, out, err = run_cli(["plan", "--stack", name, "--stacks-dir", str(stacks)])
        failures += check_output(case, code, out, err, "plan")
        if code != 2 or not (i % SAMPLE_EVERY == 0 or case.cls == "files"):
            continue  # never start processes or SSH for a case plan did not refuse
        out_dir = tmp_path / f"out{i}"
        commands = {
            "render": ["render", "--stack", name, "--stacks-dir", str(stacks), "--out", str(out_dir)],
            "up": ["up", "--stack", name, "--stacks-dir", str(stacks), "--state-dir", str(tmp_path / f"state{i}"),
                   "--detach", "--no-checks"],
        }
        with applied(case, stacks):
            try:
                load_stack(name, stacks)
            except ConfigError:  # refused when read: a playbook run refuses it before any SSH as well
                commands["playbook"] = ["playbook", "run", "preflight", "--stack", name, "--stacks-dir", str(stacks), "--check"]
            for command, argv in commands.items():
                code, out, err = run_cli(argv)
                failures += check_output(case, code, out, err, command)
        if out_dir.exists() and any(out_dir.iterdir()):
            failures.append(f"{case.id} [render]: wrote files")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:40])


def test_long_values_are_cut(tmp_path: Path) -> None:
    """A long bad value is shown cut to VALUE_LIMIT characters."""
    case = next(c for c in CASES if c.id == "names:node-64-chars")
    code, _, err = run_cli(["plan", "--stack", case.stack, "--stacks-dir", str(build(case, tmp_path))])
    assert code == 2 and "n" * 64 not in err and "n" * (VALUE_LIMIT - 3) + "..." in err


def test_committed_stacks_and_other_namespaces_stay_valid(tmp_path: Path) -> None:
    """The checks refuse the corpus, not the committed stacks, nor kubernetes:/pulumi: keys, nor a routed plane."""
    from tests.config.corpus import NS, chain, inv, raw
    from tests.config.corpus import Case as C

    for name in ("a2-staging", "cm384-prod", "kind", "local"):
        code, _, err = run_cli(["plan", "--stack", name])
        assert code == 0, err
    fine = [
        C("ok", "other-namespaces", "a2-staging", "", config=chain(raw("pulumi:tags", {"team": "x"}), raw("kubernetes:context", "c"),
                                                                   raw("aws:region", "eu-west-1"))),
        C("ok", "routed-plane-in-another-subnet", "a2-staging", "", inventory=chain(
            inv("nodes[1].devices[3].device_ip", "203.0.113.5"), inv("nodes[1].devices[3].gateway", "203.0.113.1"),
            inv("nodes[1].devices[3].netdetect", "203.0.113.1"))),
        C("ok", "fqdn-node-name", "a2-staging", "", inventory=inv("nodes[5].name", "a2-node-06.example.net")),
        C("ok", "ports-just-clear", "a2-staging", "", config=chain(raw(NS + "ports", {"api_base": 10260, "proxy": 32768}))),
    ]
    for i, case in enumerate(fine):
        code, _, err = run_cli(["plan", "--stack", case.stack, "--stacks-dir", str(build(case, tmp_path / str(i)))])
        assert code == 0, (case.label, err)


# --- real subprocesses: the cases the mutation study found -------------------------------------

FOUND = [
    "ips:host-unspecified",             # host_ip 0.0.0.0 (NetworkPolicy 0.0.0.0/32, HCCL_IF_IP)
    "types:tp-true",                    # tp: true read as 1
    "keys:namespace-ascend-deepsek",    # ascend-deepsek:throughput_check silently ignored
    "names:node-escape",                # node name ../../escape (render crashed)
    "files:inventory-directory",        # inventory path is a directory
    "files:inventory-not-utf8",         # inventory not UTF-8
    "paths:inventory-absolute",         # inventory: /etc/passwd (its content was printed)
    "model:dense-over-layers",          # num_dense_layers > num_layers
]


@pytest.mark.parametrize("case_id", FOUND)
def test_found_cases_in_a_real_process(case_id: str, tmp_path: Path) -> None:
    case = next(c for c in CASES if c.id == case_id)
    stacks = build(case, tmp_path)
    result = subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", case.stack, "--stacks-dir", str(stacks)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert case.path in _problem_paths(result.stderr), result.stderr
    assert "Traceback" not in result.stderr and "root:x:0:0" not in result.stderr
