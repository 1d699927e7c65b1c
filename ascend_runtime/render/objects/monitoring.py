"""Monitoring: ServiceMonitor/PodMonitor (Prometheus operator CRDs) and the Grafana dashboard ConfigMap."""

from __future__ import annotations

import json
from typing import Any

import jinja2

from ascend_runtime.render.objects.common import (
    BALANCER_NAME,
    LABEL_COMPONENT,
    LABEL_LEADER,
    PROXY_NAME,
    Context,
    K8sObject,
    metadata,
)
from ascend_runtime.render.paths import templates_dir

#: the balancer daemon's metric names (balancer/daemon.py)
BALANCER_METRIC_PREFIX = "ascend_balancer_"

DASHBOARD_TEMPLATE = "grafana-dashboard.json.j2"  # in templates_dir()
COMPONENT = "monitoring"


def dashboard_json(ctx: Context, with_balancer: bool) -> str:
    """The Grafana dashboard of the stack (templates/grafana-dashboard.json.j2); the balancer's panels only
    ``with_balancer`` (its daemon is deployed: ``balancer_objects`` is not empty), as :func:`monitors` has it.

    The template uses ``[[ ]]`` delimiters so that Grafana's own ``{{label}}``
    legends pass through untouched.
    """
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        variable_start_string="[[", variable_end_string="]]",
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
    )
    text = env.get_template(DASHBOARD_TEMPLATE).render(
        stack=ctx.plan.stack, namespace=ctx.namespace,
        decode_npus=max(1, sum(i.npus for i in ctx.plan.by_role("decode"))),
        prefill_npus=max(1, sum(i.npus for i in ctx.plan.by_role("prefill"))),
    )
    doc = json.loads(text)
    panels = doc.setdefault("panels", [])
    if with_balancer:
        panels.append(balancer_heat_panel(ctx.namespace, panels))
    else:  # no daemon exports ascend_balancer_*: no panel that would stay empty
        doc["panels"] = [p for p in panels if not _reads_balancer(p)]
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _reads_balancer(panel: dict[str, Any]) -> bool:
    """Whether a panel plots the balancer daemon's metrics."""
    return any(BALANCER_METRIC_PREFIX in t.get("expr", "") for t in panel.get("targets", []))


def balancer_heat_panel(namespace: str, panels: list[dict[str, Any]]) -> dict[str, Any]:
    """Fleet-wide expert heat from the balancer daemon (every instance, both stages), below the other panels."""
    bottom = max((p.get("gridPos", {}).get("y", 0) + p.get("gridPos", {}).get("h", 0) for p in panels), default=0)
    sel = f'namespace="{namespace}"'
    return {
        "id": max((p.get("id", 0) for p in panels), default=0) + 1, "type": "timeseries",
        "title": "Expert heat and imbalance (balancer)",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": 0, "y": bottom, "w": 24, "h": 8},
        "fieldConfig": {"defaults": {"unit": "none"}, "overrides": []},
        "targets": [
            {"refId": "A", "expr": f"max by (instance, stage) (ascend_balancer_instance_imbalance{{{sel}}})",
             "legendFormat": "max/mean rank load {{stage}} {{instance}}"},
            {"refId": "B", "expr": f"max by (instance, stage) (ascend_balancer_hot_expert_share{{{sel}}})",
             "legendFormat": "hottest expert share {{stage}} {{instance}}"},
            {"refId": "C", "expr": f"max(ascend_balancer_observed_balancedness{{{sel}}})", "legendFormat": "balancedness in service"},
        ],
    }


def grafana_dashboard(ctx: Context, with_balancer: bool) -> K8sObject | None:
    """ConfigMap picked up by the Grafana sidecar (label ``grafana_dashboard: "1"``)."""
    if not ctx.k8s["grafana_dashboard"]:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(ctx, "grafana-dashboard-ascend-deepseek", COMPONENT, {"grafana_dashboard": "1"}),
        "data": {"ascend-deepseek.json": dashboard_json(ctx, with_balancer)},
    }


def _relabel_role() -> list[dict[str, Any]]:
    return [{"sourceLabels": ["__meta_kubernetes_pod_label_ascend_deepseek_role"], "targetLabel": "ascend_deepseek_role"},
            {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "targetLabel": "instance"}]


def monitors(ctx: Context, with_balancer: bool) -> list[K8sObject]:
    """PodMonitor of the engine leaders, ServiceMonitors of proxy and balancer (operator CRDs only)."""
    if not ctx.k8s["prometheus_operator"]:
        return []
    out: list[K8sObject] = [{
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata(ctx, "vllm-ascend-engines", COMPONENT),
        "spec": {
            "selector": {"matchLabels": {LABEL_COMPONENT: "engine", LABEL_LEADER: "true"}},
            "podMetricsEndpoints": [{"port": "api", "path": "/metrics", "interval": "15s", "relabelings": _relabel_role()}],
        },
    }, {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(ctx, PROXY_NAME, COMPONENT),
        "spec": {"selector": {"matchLabels": {LABEL_COMPONENT: "proxy"}},
                 "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}]},
    }]
    if with_balancer:
        out.append({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": metadata(ctx, BALANCER_NAME, COMPONENT),
            "spec": {"selector": {"matchLabels": {LABEL_COMPONENT: "balancer"}},
                     "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s"}]},
        })
    return out


def monitoring_objects(ctx: Context, with_balancer: bool) -> list[K8sObject]:
    """Monitors and the dashboard."""
    dash = grafana_dashboard(ctx, with_balancer)
    return [*monitors(ctx, with_balancer), *([dash] if dash else [])]
