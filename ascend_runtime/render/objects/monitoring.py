"""Monitoring: ServiceMonitor/PodMonitor (Prometheus operator CRDs) and the Grafana dashboard ConfigMap.

The dashboard's queries select series by three labels: ``namespace`` (the stack's namespace), :data:`ROLE_LABEL`
(prefill or decode, engine series only) and ``instance`` (the engine instance; on the balancer's series the
instance it measured). On Kubernetes the monitors below set them: the operator adds ``namespace`` to every
target, the engines' PodMonitor copies role and instance from the pod labels, and the proxy's and balancer's
ServiceMonitors honour their own ``instance`` labels. The local stack's scrape config
(``ascend_runtime/local/monitoring.py``) sets the same labels on static targets. A stack that asks for the
dashboard without the operator is refused (``kubernetes.grafana_dashboard``, config/stack.py): nothing would
scrape or label the series.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jinja2

from ascend_runtime.engine.surface import load_surface
from ascend_runtime.render.objects.common import (
    BALANCER_NAME,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_LEADER,
    LABEL_ROLE,
    PROXY_NAME,
    Context,
    K8sObject,
    metadata,
)
from ascend_runtime.render.paths import templates_dir

#: the balancer daemon's metric names (balancer/daemon.py)
BALANCER_METRIC_PREFIX = "ascend_balancer_"
#: The label of engine series naming the instance's role (prefill, decode); the dashboard filters on it.
ROLE_LABEL = "ascend_deepseek_role"
#: The label of engine series naming the instance (``prefill-0``); Prometheus's own ``instance`` label replaced.
INSTANCE_LABEL = "instance"

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
        stack=ctx.plan.stack,
        decode_npus=max(1, sum(i.npus for i in ctx.plan.by_role("decode"))),
        prefill_npus=max(1, sum(i.npus for i in ctx.plan.by_role("prefill"))),
        sel=_selector(namespace=ctx.namespace),
        sel_prefill=_selector(namespace=ctx.namespace, **{ROLE_LABEL: "prefill"}),
        sel_decode=_selector(namespace=ctx.namespace, **{ROLE_LABEL: "decode"}),
        engine_metrics=frozenset(load_surface(ctx.plan.vllm_ascend_version).metrics),
    )
    doc = json.loads(text)
    panels = doc.setdefault("panels", [])
    if with_balancer:
        panels.append(balancer_heat_panel(ctx.namespace, panels))
    else:  # no daemon exports ascend_balancer_*: no panel that would stay empty
        doc["panels"] = [p for p in panels if not _reads_balancer(p)]
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _selector(**labels: str) -> str:
    """PromQL label matchers (``a="x",b="y"``), escaped to sit inside a JSON string of the template."""
    return json.dumps(",".join(f'{k}="{v}"' for k, v in labels.items()))[1:-1]


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


def _pod_label(label: str) -> str:
    """Prometheus's Kubernetes discovery label of a pod label (every character outside [a-zA-Z0-9_] as _)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _relabel_role() -> list[dict[str, Any]]:
    """Role and instance of an engine target from its pod's labels (the dashboard's engine panels select on them)."""
    return [{"sourceLabels": [_pod_label(LABEL_ROLE)], "targetLabel": ROLE_LABEL},
            {"sourceLabels": [_pod_label(LABEL_INSTANCE)], "targetLabel": INSTANCE_LABEL}]


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
        # honorLabels: the proxy's own instance labels (the engine instance of a series) are kept as they are
        "spec": {"selector": {"matchLabels": {LABEL_COMPONENT: "proxy"}},
                 "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s", "honorLabels": True}]},
    }]
    if with_balancer:
        out.append({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": metadata(ctx, BALANCER_NAME, COMPONENT),
            "spec": {"selector": {"matchLabels": {LABEL_COMPONENT: "balancer"}},
                     "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "30s", "honorLabels": True}]},
        })
    return out


def monitoring_objects(ctx: Context, with_balancer: bool) -> list[K8sObject]:
    """Monitors and the dashboard."""
    dash = grafana_dashboard(ctx, with_balancer)
    return [*monitors(ctx, with_balancer), *([dash] if dash else [])]
