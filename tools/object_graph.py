#!/usr/bin/env python3
"""Write the object graph of every Kubernetes stack into docs/kubernetes.md, from ``build_system``.

Per stack: the ComponentResources the Pulumi program registers (deploy/components.py), the
objects of each (``ascend_runtime.render.objects.build_system``; the fault watcher's from
``fault_watcher_objects``, registered when the proxy admin token secret is set) and what each
waits for (``depends_on``; the engine instances of a role in the rollout's chain,
``ascend_runtime.rollout.order.predecessors``). The section sits between the markers
:data:`BEGIN` and :data:`END`.

Usage::

    python tools/object_graph.py            # rewrite the section
    python tools/object_graph.py --check    # exit 1 with a diff when the doc is stale

tests/rollout/test_object_graph_doc.py runs the check, and compares the "waits for" edges with
the program's own under Pulumi's mock runtime.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ascend_runtime.config.loader import available_stacks  # noqa: E402
from ascend_runtime.planner import load_plan  # noqa: E402
from ascend_runtime.planner.plan import Plan  # noqa: E402
from ascend_runtime.render.objects import build_system, deploys_to_kubernetes  # noqa: E402
from ascend_runtime.render.objects.faults import fault_watcher_objects  # noqa: E402
from ascend_runtime.render.objects.mindcluster import is_patch  # noqa: E402
from ascend_runtime.rollout.order import predecessors  # noqa: E402

DOC = ROOT / "docs" / "kubernetes.md"
BEGIN = "<!-- object-graph:begin (tools/object_graph.py writes this section) -->"
END = "<!-- object-graph:end -->"
#: Group of SystemObjects -> the component registering it.
COMPONENTS = {"cluster": "ClusterPrep", "nodes": "ClusterPrep", "proxy": "Proxy", "balancer": "Balancer",
              "network": "NetworkPolicies", "monitoring": "Monitoring", "checks": "PostDeployChecks",
              "pdplanner": "PDPlanner"}


@dataclass
class Node:
    """One component: its label, its objects (``Kind name`` strings) and the components it waits for."""

    label: str
    objects: list[str]
    waits_for: list[str]


def _describe(obj: dict[str, Any]) -> str:
    kind, name = obj["kind"], obj["metadata"]["name"]
    if kind == "LeaderWorkerSet":
        return f"LeaderWorkerSet {name} (size {obj['spec']['leaderWorkerTemplate']['size']})"
    if is_patch(obj):  # a patch of an object the kit does not own (render/objects/mindcluster.py)
        return f"{kind}Patch {obj['metadata']['namespace']}/{name} (tolerations)"
    return f"{kind} {name}"


def _compact(objs: list[dict[str, Any]]) -> list[str]:
    """Object descriptions; NodePatches folded into one entry with their count."""
    out = [_describe(o) for o in objs if o["kind"] != "Node"]
    nodes = [o["metadata"]["name"] for o in objs if o["kind"] == "Node"]
    if nodes:
        out.append(f"NodePatch x{len(nodes)} ({nodes[0]} .. {nodes[-1]})" if len(nodes) > 1 else f"NodePatch {nodes[0]}")
    return out


def graph(plan: Plan) -> list[Node]:
    """The components of ``plan``'s program in registration order."""
    objs = build_system(plan)
    prev = predecessors((n, plan.instance(n).role, plan.instance(n).ordinal) for n in objs.engines)
    cluster = _compact(objs.cluster + objs.node_patches)
    if any(o["kind"] == "LeaderWorkerSet" for e in objs.engines.values() for o in e):
        cluster.insert(0, "the LeaderWorkerSet CRD (read, or with lws.install the pinned release manifest)")
    nodes = [Node("ClusterPrep", cluster, [])]
    engines = []
    for name in sorted(objs.engines, key=list(prev).index):
        before = prev[name]
        label = f"EngineInstance {name}"
        engines.append(label)
        nodes.append(Node(label, _compact(objs.engines[name]),
                          ["ClusterPrep", *([f"EngineInstance {before}"] if before else [])]))
    nodes.append(Node("Proxy", _compact(objs.proxy), ["ClusterPrep"]))
    if objs.balancer:
        nodes.append(Node("Balancer", _compact(objs.balancer), ["ClusterPrep"]))
    faults = fault_watcher_objects(plan, True)
    if faults:
        nodes.append(Node("FaultWatcher (with the proxy admin token secret)", _compact(faults), ["ClusterPrep"]))
    nodes.append(Node("NetworkPolicies", _compact(objs.network), ["ClusterPrep"]))
    if getattr(objs, "pdplanner", None):
        nodes.append(Node("PDPlanner", _compact(objs.pdplanner), ["ClusterPrep", *engines]))
    nodes.append(Node("Monitoring", _compact(objs.monitoring), ["ClusterPrep"]))
    if objs.checks:
        nodes.append(Node("PostDeployChecks", _compact(objs.checks),
                          ["ClusterPrep", *engines, "Proxy", *(["Balancer"] if objs.balancer else []), "NetworkPolicies"]))
    return nodes


def _waits(node: Node) -> str:
    engines = [w for w in node.waits_for if w.startswith("EngineInstance ")]
    rest = [w for w in node.waits_for if not w.startswith("EngineInstance ")]
    if len(engines) > 2:
        rest.insert(1, f"every EngineInstance ({len(engines)})")
    else:
        rest[1:1] = engines
    return ", ".join(rest)


def stack_section(plan: Plan) -> str:
    """The markdown of one stack: a heading, a summary line and the tree."""
    nodes = graph(plan)
    kinds = Counter(o.split(" ")[0] for n in nodes if n.label.startswith("EngineInstance ") for o in n.objects)
    lines = [f"#### {plan.stack}", "",
             f"{plan.hardware}, target {plan.target}, namespace `{plan.config['kubernetes']['namespace']}`: "
             f"{len(plan.instances)} engine instance(s), their workloads "
             + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()) if k in ("LeaderWorkerSet", "Deployment")),
             "", "```text", "ServingSystem"]
    for i, node in enumerate(nodes):
        last = i == len(nodes) - 1
        lines.append(f"{'└──' if last else '├──'} {node.label}" + (f"   [waits for {_waits(node)}]" if node.waits_for else ""))
        for obj in node.objects:
            lines.append(f"{'   ' if last else '│  '}   {obj}")
    lines += ["```", ""]
    return "\n".join(lines)


def section() -> str:
    """The whole generated section (every stack that deploys to Kubernetes), between the markers."""
    plans = [load_plan(s) for s in available_stacks()]
    body = "\n".join(stack_section(p) for p in plans if deploys_to_kubernetes(p))
    return f"{BEGIN}\n\n{body}{END}"


def rewrite(text: str, new_section: str) -> str:
    """``text`` with the section between the markers replaced; ValueError when the markers are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC}: markers {BEGIN!r} .. {END!r} not found")
    return text[:start] + new_section + text[end + len(END):]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff when docs/kubernetes.md is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    new = rewrite(text, section())
    if args.check:
        if new != text:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True), "docs/kubernetes.md",
                                                       "generated"))
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
