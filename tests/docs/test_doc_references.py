"""What README.md, docs/*.md and docs/runbooks/*.md name exists in the kit as they name it.

test_command_lines.py proves every quoted command line parses. This module checks the rest of what an
operator copies from the docs, in one process:

* a command named in prose (`ascend-deploy faults watch`, `playbook list`) is a command of the CLI;
* every stack key path in a code span (`kubernetes.lws.install`, `ascend-deepseek:pd_ratio`, `<stage>.eplb`)
  is a field of the stack schema (``ascend_runtime.config.stack.StackConfig``), and so is every key of a
  flow-style YAML snippet (`pd_ratio: {mode: auto, groups: G}`) and of a fenced `ascend-deepseek:` block;
* every `kubectl` line's namespace, workload (`deploy/NAME`, `lws NAME`, `job/NAME`, `secret NAME`, ...) and
  label selector (`-l KEY=VALUE`) is one the kit creates for a committed stack (objects as data from
  ``render/objects``), except names and labels that the LeaderWorkerSet controller or MindCluster own;
* every `ascend-deploy rollout --stack S` of a committed Kubernetes or kind stack is accepted by the command
  (run in process with `--dry-run`, which contacts no cluster): a documented rollout of a stack whose roles
  have a single instance would exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import typing
from functools import cache
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from ascend_runtime.cli import build_parser, main
from ascend_runtime.config.secrets import SECRET_KEYS
from ascend_runtime.config.stack import KubernetesConfig, StackConfig, StageConfig
from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects import build_system, deploys_to_kubernetes
from ascend_runtime.render.objects.faults import fault_watcher_objects

ROOT = Path(__file__).resolve().parents[2]
#: the operator docs checked here (docs/benchmarks.md holds measured output, not instructions)
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "benchmarks.md"),
        *sorted((ROOT / "docs" / "runbooks").glob("*.md"))]
COMMITTED_STACKS = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in (ROOT / "stacks").glob("Pulumi.*.yaml"))
SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
NAMESPACE = "ascend-deepseek:"
#: namespaces of other software a runbook reads (MindCluster, the LWS controller, the device plugin), and
#: ``default``, where the API server keeps Events about Nodes (faults/signals.py NODE_EVENT_NAMESPACE)
EXTERNAL_NAMESPACES = {"kube-system", "mindx-dl", "lws-system", "default"}
#: pod labels set by the LeaderWorkerSet controller, not by the kit (lws v0.10.0 `api/.../leaderworkerset_types.go`)
CONTROLLER_LABEL_PREFIXES = ("leaderworkerset.sigs.k8s.io/",)


#: where a key path the docs name may start: the stack, a stage (`eplb`), the kubernetes section (`runtime_class`)
ROOTS: tuple[type[BaseModel], ...] = (StackConfig, StageConfig, KubernetesConfig)
#: last segments of dotted words that are file names or domains, not keys
NOT_KEYS = {"py", "io", "md", "json", "yaml", "sh", "conf", "npy", "png"}


def _spans() -> list[tuple[str, int, str]]:
    """(doc, line number, text) of every inline code span."""
    found = []
    for path in DOCS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found.extend((path.relative_to(ROOT).as_posix(), number, m.group(1)) for m in SPAN.finditer(line))
    return found


def _code_lines() -> list[tuple[str, str]]:
    """(doc, text) of every inline code span and every line of a fenced or indented block, continuations joined."""
    found = [(doc, text) for doc, _, text in _spans()]
    for path in DOCS:
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        for line in text.splitlines():
            if line.startswith("    ") or line.lstrip().startswith(("kubectl ", "pulumi ", "ascend-deploy ")):
                found.append((path.relative_to(ROOT).as_posix(), line.strip()))
    return found


# -- commands named in prose ---------------------------------------------------------------------------

def _prose_commands() -> list[tuple[str, list[str]]]:
    """`ascend-deploy WORD [WORD]` spans without options: the command words, alternatives split."""
    found = []
    for doc, _, text in _spans():
        m = re.match(r"^(?:ascend-deploy|python -m ascend_runtime) ([a-z][a-z -|]*)$", text.strip())
        if not m:
            continue
        for alternative in m.group(1).split("|"):
            words = [w for w in alternative.split() if re.fullmatch(r"[a-z][a-z-]*", w)]
            if words:
                found.append((doc, words))
    return found


PROSE = _prose_commands()


def test_prose_commands_found() -> None:
    assert len(PROSE) >= 15, PROSE


@cache
def _choices(command: str) -> tuple[frozenset[str], frozenset[str] | None]:
    """The CLI's top-level commands, and ``command``'s sub-commands (None when it has none)."""

    def sub(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser] | None:
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(actions[0].choices) if actions else None

    top = sub(build_parser(command)) or {}
    below = sub(top[command]) if command in top else None
    return frozenset(top), (frozenset(below) if below is not None else None)


def _command_problem(words: list[str]) -> str | None:
    """Why ``ascend-deploy WORDS`` is no command (None when it is; `playbook run facts` ends in an argument)."""
    top, below = _choices(words[0])
    if words[0] not in top:
        return f"no command {words[0]!r}"
    if below is not None and len(words) > 1 and words[1] not in below:
        return f"{words[0]} has no sub-command {words[1]!r} (it has {', '.join(sorted(below))})"
    return None


def test_prose_commands_exist() -> None:
    bad = [f"{doc}: `ascend-deploy {' '.join(words)}`: {problem}" for doc, words in PROSE
           if (problem := _command_problem(words))]
    assert not bad, "\n".join(bad)


def test_a_wrong_prose_command_fails_the_check() -> None:
    assert _command_problem(["faults", "drain"])
    assert _command_problem(["pdplanner"])
    assert _command_problem(["balance", "evaluate"]) is None


# -- stack keys ----------------------------------------------------------------------------------------

def _sub_model(model: type[BaseModel], key: str) -> tuple[bool, type[BaseModel] | None]:
    """Whether ``key`` is a field of ``model``, and the model of its value (None when free-form or scalar)."""
    field = model.model_fields.get(key)
    if field is None:
        return False, None
    for candidate in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return True, candidate
    return True, None


def _unknown_key(path: list[str]) -> str | None:
    """The first key of ``path`` the schema lacks (None when all exist). A path may start at the stack, a stage
    (`eplb`, `redundant_experts`) or the kubernetes section (`runtime_class`), as the docs name them."""
    path = ["decode" if key == "<stage>" else key for key in path]
    for root in ROOTS:
        if root.model_fields.get(path[0]) is not None:
            break
    else:
        return path[0]
    model: type[BaseModel] | None = root
    for key in path:
        if model is None:
            return None  # below a free-form value (`extra_env`, `model_staging.files`)
        exists, model = _sub_model(model, key)
        if not exists:
            return key
    return None


def _yaml_key_paths(doc: object, prefix: list[str]) -> list[list[str]]:
    """Every key path of a parsed YAML mapping."""
    if not isinstance(doc, dict):
        return []
    paths = []
    for key, value in doc.items():
        paths.append([*prefix, str(key)])
        paths.extend(_yaml_key_paths(value, [*prefix, str(key)]))
    return paths


def _stack_key_refs() -> list[tuple[str, list[str]]]:
    """(doc, key path) of dotted key spans whose head is a stack key, and of every key of a YAML snippet."""
    top = set(StackConfig.model_fields)
    refs: list[tuple[str, list[str]]] = []
    for doc, _, text in _spans():
        text = text.strip()
        flow = re.fullmatch(r"(?:ascend-deepseek:)?([\w<>.]+): (\{.*\})", text)
        if flow:  # `pd_ratio: {mode: auto, groups: G, ...}`
            try:
                parsed = yaml.safe_load(flow.group(2))
            except yaml.YAMLError:
                parsed = None
            base = flow.group(1).split(".")
            if not any(base[0] in root.model_fields or base[0] == "<stage>" for root in ROOTS):
                continue  # a JSON body or an object field (`data: {"error": ...}`), not a stack key
            refs.append((doc, base))
            refs.extend((doc, path) for path in _yaml_key_paths(parsed, base))
            continue
        for token in re.findall(r"(?:(?<=^)|(?<=[\s(]))(?:ascend-deepseek:)?((?:<stage>|[a-z_]+)(?:\.[a-z_0-9]+)+)(?=$|[\s:),])",
                                text):
            if token.rsplit(".", 1)[1] in NOT_KEYS:
                continue  # a file name or a domain (`engine.py`, `kubernetes.io`)
            if token.split(".")[0] in top or token.startswith("<stage>."):
                refs.append((doc, token.split(".")))
        whole = re.fullmatch(r"ascend-deepseek:([a-z_]+)", text)
        if whole and whole.group(1) not in SECRET_KEYS:
            refs.append((doc, [whole.group(1)]))
    for path in DOCS:
        for block in FENCE.findall(path.read_text()):
            if not block.lstrip().startswith(NAMESPACE):
                continue
            parsed = yaml.safe_load(block)
            for key, value in parsed.items():
                if isinstance(value, dict) and "secure" in value:
                    continue  # a Pulumi secret of the stack, referenced by {secret: KEY}
                refs.append((path.relative_to(ROOT).as_posix(), [key[len(NAMESPACE):]]))
                refs.extend((path.relative_to(ROOT).as_posix(), p) for p in _yaml_key_paths(value, [key[len(NAMESPACE):]]))
    return refs


KEY_REFS = _stack_key_refs()


def test_stack_key_references_found() -> None:
    assert len(KEY_REFS) >= 40, KEY_REFS


def test_documented_stack_keys_exist() -> None:
    bad = sorted({f"{doc}: {'.'.join(path)} (no key {_unknown_key(path)!r})" for doc, path in KEY_REFS
                  if _unknown_key(path)})
    assert not bad, "\n".join(bad)


def test_a_misspelt_key_fails_the_check() -> None:
    assert _unknown_key(["pd_ratio", "drain_timeout"]) == "drain_timeout"
    assert _unknown_key(["kubernetes", "lws", "installed"]) == "installed"
    assert _unknown_key(["<stage>", "eplb", "policy"]) is None


# -- kubectl -------------------------------------------------------------------------------------------

@cache
def _kit_objects() -> list[dict]:
    """Every object the kit registers for the committed Kubernetes and kind stacks, with every secret set."""
    objects: list[dict] = []
    for stack in COMMITTED_STACKS:
        plan = load_plan(stack)
        if not deploys_to_kubernetes(plan):
            continue
        objects.extend(o for _, group in build_system(plan, SECRET_KEYS).groups() for o in group)
        objects.extend(fault_watcher_objects(plan, True, frozenset(SECRET_KEYS)))
    return objects


def _labels(obj: dict) -> dict[str, str]:
    """The object's labels and those of its pod templates (a LeaderWorkerSet's leader and worker)."""
    labels = dict(obj["metadata"].get("labels", {}))
    spec = obj.get("spec", {})
    templates = [spec.get("template", {})]
    lwt = spec.get("leaderWorkerTemplate", {})
    templates += [lwt.get("leaderTemplate", {}), lwt.get("workerTemplate", {})]
    for template in templates:
        labels.update((template or {}).get("metadata", {}).get("labels", {}))
    return labels


KIND_ALIASES = {"deploy": "Deployment", "deployment": "Deployment", "lws": "LeaderWorkerSet", "svc": "Service",
                "service": "Service", "job": "Job", "secret": "Secret", "cm": "ConfigMap", "configmap": "ConfigMap"}


def _kubectl_lines() -> list[tuple[str, str]]:
    found = []
    for doc, text in _code_lines():
        for part in re.split(r"\$\(|\||;|&&", text):
            part = part.strip()
            if part.startswith("kubectl "):
                found.append((doc, part))
    return sorted(set(found))


KUBECTL = _kubectl_lines()


def _kubectl_problems(line: str) -> list[str]:
    """What a kubectl line names that the kit does not create (empty when everything exists)."""
    try:
        argv = shlex.split(line)
    except ValueError:
        argv = line.split()
    namespace, problems, refs = None, [], []
    namespaces = {o["metadata"]["name"] for o in _kit_objects() if o["kind"] == "Namespace"}
    i = 1
    while i < len(argv):
        word = argv[i]
        if word in ("-n", "--namespace") and i + 1 < len(argv):
            namespace = argv[i + 1]
            i += 2
            continue
        if word in ("-l", "--selector") and i + 1 < len(argv):
            refs.append(("label", argv[i + 1]))
            i += 2
            continue
        m = re.fullmatch(r"([a-z]+)/([a-z0-9.-]+)", word)
        if m and m.group(1) in KIND_ALIASES:
            refs.append((KIND_ALIASES[m.group(1)], m.group(2)))
        elif word in KIND_ALIASES and i + 1 < len(argv) and re.fullmatch(r"[a-z0-9][a-z0-9.-]*", argv[i + 1]) \
                and argv[1] in ("get", "describe", "delete", "scale", "edit"):
            refs.append((KIND_ALIASES[word], argv[i + 1]))
            i += 1
        i += 1
    if namespace is not None and namespace not in namespaces | EXTERNAL_NAMESPACES:
        problems.append(f"namespace {namespace} is none the kit creates ({', '.join(sorted(namespaces))})")
    if namespace in EXTERNAL_NAMESPACES:
        return problems  # another component's objects (lws-controller-manager, mindx-dl-* ConfigMaps)
    objects = _kit_objects()
    for kind, name in refs:
        if kind == "label":
            for selector in name.split(","):
                key, eq, value = selector.partition("=")
                if "<" in value or key.startswith(CONTROLLER_LABEL_PREFIXES):
                    continue
                if not eq:  # an existence selector (`-l key`): some object carries the key
                    if not any(key in _labels(o) for o in objects):
                        problems.append(f"label {selector} is on no object the kit creates")
                    continue
                if not any(_labels(o).get(key) == value for o in objects):
                    problems.append(f"label {selector} is on no object the kit creates")
        elif not any(o["kind"] == kind and o["metadata"]["name"] == name for o in objects):
            problems.append(f"{kind} {name} is none the kit creates")
    return problems


def test_kubectl_lines_found() -> None:
    assert len(KUBECTL) >= 15, KUBECTL


def test_kubectl_lines_name_what_the_kit_creates() -> None:
    bad = [f"{doc}: `{line}`: {'; '.join(p)}" for doc, line in KUBECTL if (p := _kubectl_problems(line))]
    assert not bad, "\n".join(bad)


def test_a_wrong_kubectl_name_fails_the_check() -> None:
    assert _kubectl_problems("kubectl -n deepseek logs deploy/fault-watcher")
    assert _kubectl_problems("kubectl -n deepseek get pods -l app.kubernetes.io/name=proxy")
    assert _kubectl_problems("kubectl get nodes -l ascend-deepseek/serving-rol")
    assert _kubectl_problems("kubectl -n serving get lws decode-0")
    assert not _kubectl_problems("kubectl -n deepseek rollout status deploy/prefill-0-rank0")


# -- rollouts of committed stacks ----------------------------------------------------------------------

def _rollout_lines() -> list[tuple[str, list[str]]]:
    """Documented `rollout --stack S ...` argv of committed Kubernetes/kind stacks, as a dry run."""
    kube = {s for s in COMMITTED_STACKS if deploys_to_kubernetes(load_plan(s))}
    found = set()
    for doc, text in _code_lines():
        for m in re.finditer(r"ascend-deploy (rollout --stack ([a-z0-9-]+)[^`#|;]*)", text):
            if m.group(2) not in kube:
                continue
            argv = [w for w in shlex.split(m.group(1).strip()) if w != "--dry-run"]
            found.add((doc, (*argv, "--dry-run")))
    return sorted((doc, list(argv)) for doc, argv in found)


ROLLOUTS = _rollout_lines()


def test_rollout_lines_found() -> None:
    assert len(ROLLOUTS) >= 4, ROLLOUTS


@pytest.mark.parametrize(("doc", "argv"), ROLLOUTS, ids=[f"{d}:{' '.join(a)}" for d, a in ROLLOUTS])
def test_documented_rollout_is_accepted(doc: str, argv: list[str]) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    assert code == 0, f"{doc}: `ascend-deploy {' '.join(argv)}` exits {code}:\n{out.getvalue()[-600:]}"


def test_a_single_instance_rollout_fails_the_check() -> None:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["rollout", "--stack", "a2-staging", "--dry-run"]) == 2
