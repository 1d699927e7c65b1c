"""The dashboard's queries resolve on every stack that deploys it: its monitors give the series the labels the
queries select on, and a stack asking for the dashboard without the Prometheus operator is refused.

(tests/local/test_dashboard_data.py evaluates every query against a real Prometheus scraping the local stack.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects.common import LABEL_COMPONENT, LABEL_INSTANCE, LABEL_LEADER, LABEL_ROLE
from ascend_runtime.render.objects.monitoring import INSTANCE_LABEL, ROLE_LABEL

from .conftest import K8S_STACKS, stack_run
from .pods import pods_by_rank

ROOT = Path(__file__).resolve().parents[2]
NS = "ascend-deepseek:"
#: ``label="value"`` (or =~, !=, !~) inside a PromQL selector
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!=|!~|=)\s*"')
#: Labels the metrics carry themselves (every other label a query selects on must come from the scrape).
OWN_LABELS = {"outcome", "source", "reason"}


def _meta(pod_label: str) -> str:
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)


def _dashboard(objs: list[dict[str, Any]]) -> dict[str, Any] | None:
    found = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["labels"].get("grafana_dashboard") == "1"]
    return json.loads(next(iter(found[0]["data"].values()))) if found else None


def test_every_dashboard_query_selects_labels_its_monitors_set() -> None:
    deployed = []
    for stack in K8S_STACKS:
        objs = stack_run(stack).k8s_objects
        dash = _dashboard(objs)
        if dash is None:
            continue
        deployed.append(stack)
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        selected = {m.group(1) for e in exprs for m in MATCHER.finditer(e)} - OWN_LABELS
        assert selected == {"namespace", ROLE_LABEL}, (stack, selected)
        # every engine query is of one role, labelled as such in its panel
        for panel in dash["panels"]:
            for target in panel["targets"]:
                if "vllm:" in target["expr"]:
                    roles = re.findall(ROLE_LABEL + r'="(\w+)"', target["expr"])
                    assert len(roles) == 1 and roles[0] in (panel["title"] + target["legendFormat"]).lower(), (
                        stack, panel["title"], target)
        monitors = {o["kind"] + "/" + o["metadata"]["name"]: o for o in objs if o["kind"] in ("PodMonitor", "ServiceMonitor")}
        (engines,) = [m for m in monitors.values() if m["kind"] == "PodMonitor" and m["metadata"]["name"] == "vllm-ascend-engines"]
        (endpoint,) = engines["spec"]["podMetricsEndpoints"]
        relabel = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        assert relabel == {ROLE_LABEL: [_meta(LABEL_ROLE)], INSTANCE_LABEL: [_meta(LABEL_INSTANCE)]}
        # the pods it selects carry those labels: the role of their instance and its name
        selector = engines["spec"]["selector"]["matchLabels"]
        assert selector == {LABEL_COMPONENT: "engine", LABEL_LEADER: "true"}
        leaders = [t["metadata"]["labels"] for t in pods_by_rank(objs).values()
                   if all(t["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())]
        assert leaders, stack
        for labels in leaders:
            assert labels[LABEL_ROLE] in ("prefill", "decode") and labels[LABEL_INSTANCE].startswith(labels[LABEL_ROLE] + "-")
        assert {labels[LABEL_INSTANCE] for labels in leaders} == {i.name for i in load_plan(stack).instances}
        # the proxy's and balancer's series keep their own instance label (the engine instance they are about)
        for monitor in monitors.values():
            if monitor["kind"] == "ServiceMonitor" and monitor["metadata"]["name"] in ("pd-proxy", "expert-balancer"):
                assert all(e["honorLabels"] is True for e in monitor["spec"]["endpoints"]), monitor
    assert "a2-staging" in deployed and "cm384-prod" in deployed, deployed


def _plan_cli(tmp_path: Path, stack: str, kubernetes: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``ascend-deploy plan --stack STACK`` on a copy of the stacks with ``kubernetes`` keys set (None: removed)."""
    stacks = tmp_path / "stacks"
    if not stacks.exists():
        subprocess.run(["cp", "-r", str(ROOT / "stacks"), str(stacks)], check=True)
    stack_file = stacks / f"Pulumi.{stack}.yaml"
    doc = yaml.safe_load((ROOT / "stacks" / stack_file.name).read_text())
    block = doc["config"][NS + "kubernetes"]
    for key, value in kubernetes.items():
        if value is None:
            block.pop(key, None)
        else:
            block[key] = value
    stack_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run([sys.executable, "-m", "ascend_runtime", "plan", "--stack", stack, "--stacks-dir", str(stacks),
                           "--json"], capture_output=True, text=True, timeout=120)


def test_dashboard_without_the_operator_is_refused(tmp_path: Path) -> None:
    result = _plan_cli(tmp_path, "a2-staging", {"prometheus_operator": None, "grafana_dashboard": True})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "  - kubernetes.grafana_dashboard: " in result.stderr
    assert "set prometheus_operator: true" in result.stderr and "grafana_dashboard: false" in result.stderr
    assert "Traceback" not in result.stderr


def test_dashboard_follows_the_operator_unless_set(tmp_path: Path) -> None:
    def dashboard(stack: str, kubernetes: dict[str, Any]) -> bool:
        result = _plan_cli(tmp_path, stack, kubernetes)
        assert result.returncode == 0, result.stderr
        return bool(json.loads(result.stdout)["config"]["kubernetes"]["grafana_dashboard"])

    assert dashboard("kind", {}) is False  # no operator: no dashboard
    assert dashboard("cm384-prod", {"grafana_dashboard": None}) is True
    assert dashboard("cm384-prod", {"grafana_dashboard": False}) is False
    assert dashboard("a2-staging", {"prometheus_operator": None, "grafana_dashboard": None}) is False
