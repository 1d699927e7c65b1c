"""Alerting rules of the fault watcher (a ``PrometheusRule``, prometheus-operator ``monitoring.coreos.com/v1``).

Rendered with the watcher's objects when the stack runs the Prometheus operator (``kubernetes.prometheus_operator``);
the watcher's PodMonitor gets its series scraped, and the operator adds the pod's ``namespace`` label, which the
expressions select on so two stacks of one cluster alert apart. Two alerts:

* ``AscendFaultSourceFailed``: ``ascend_faults_source_failed`` (faults/metrics.py) is 1 for a node and source for
  :data:`SOURCE_FOR` - NodeD or the device plugin has no running and ready pod there, or the plugin's ConfigMap
  is absent or stale (faults/sources.py). Faults on that node cannot be seen; its instances stay routable.
  ``for`` rides out a DaemonSet's rolling update, which replaces one node's pod in well under that;
* ``AscendFaultWatcherSilent``: no watch cycle for :data:`SILENT_AFTER_S` (the series is absent, or its last
  cycle timestamp is old): then no fault is drained at all.
"""

from __future__ import annotations

from typing import Any

from ascend_runtime.render.objects.common import Context, K8sObject, metadata

#: How long a fault source stays failed before the alert fires (a Prometheus duration).
SOURCE_FOR = "5m"
#: Seconds without a watch cycle after which the watcher counts as silent; and how long before it fires.
SILENT_AFTER_S = 60
SILENT_FOR = "5m"
RUNBOOK = "docs/faults.md (Fault sources)"


def rules(namespace: str) -> list[dict[str, Any]]:
    """The alerting rules of the serving namespace ``namespace``."""
    sel = f'namespace="{namespace}"'
    return [
        {
            "alert": "AscendFaultSourceFailed",
            "expr": f"max by (node, role, source, reason) (ascend_faults_source_failed{{{sel}}}) == 1",
            "for": SOURCE_FOR,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "MindCluster {{ $labels.source }} is not alive on node {{ $labels.node }} ({{ $labels.reason }})",
                "description": "The fault watcher cannot see {{ $labels.source }} faults on {{ $labels.node }} "
                               "(role {{ $labels.role }}): {{ $labels.reason }}. Its instances stay routable and are "
                               f"not drained for this. See {RUNBOOK}.",
            },
        },
        {
            "alert": "AscendFaultWatcherSilent",
            "expr": (f"absent(ascend_faults_last_cycle_timestamp_seconds{{{sel}}}) or "
                     f"(time() - max(ascend_faults_last_cycle_timestamp_seconds{{{sel}}}) > {SILENT_AFTER_S})"),
            "for": SILENT_FOR,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": f"The NPU fault watcher of namespace {namespace} ran no cycle for {SILENT_AFTER_S} s",
                "description": "No NPU or link fault is drained while it is silent. "
                               f"kubectl -n {namespace} logs deploy/ascend-fault-watcher; see {RUNBOOK}.",
            },
        },
    ]


def alert_rules(ctx: Context, name: str, component: str, selector: dict[str, str]) -> list[K8sObject]:
    """The ``PrometheusRule`` (one group) when the stack runs the Prometheus operator; else nothing."""
    if not ctx.k8s["prometheus_operator"]:
        return []
    return [{"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
             "metadata": metadata(ctx, name, component, selector),
             "spec": {"groups": [{"name": name, "rules": rules(ctx.namespace)}]}}]
