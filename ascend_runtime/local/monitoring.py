"""Monitoring of the local stack: a Prometheus scrape config and the Grafana dashboard, written by ``up``.

``<state>/prometheus.yml`` scrapes every process the stack runs and labels each target as the Kubernetes
monitors label theirs (``ascend_runtime/render/objects/monitoring.py``): ``namespace`` is the stack's
``kubernetes.namespace``; an engine target gets its role (:data:`ROLE_LABEL`) and its instance name as
``instance``; the proxy's and the balancer's own ``instance`` labels are honoured. So
``<state>/grafana-dashboard.json``, the dashboard a Kubernetes stack gets, reads the same series here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from ascend_runtime.files.write import write_file
from ascend_runtime.local.topology import ProcessSpec
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.objects.common import Context
from ascend_runtime.render.objects.monitoring import INSTANCE_LABEL, ROLE_LABEL, dashboard_json

#: Seconds between scrapes in the written config.
SCRAPE_INTERVAL_S = 5
PROMETHEUS_FILE = "prometheus.yml"
DASHBOARD_FILE = "grafana-dashboard.json"


def _address(spec: ProcessSpec) -> str:
    """host:port of a process, from its health URL (each serves /metrics on the same socket)."""
    return urlsplit(spec.health_url).netloc


def scrape_config(plan: Plan, specs: list[ProcessSpec], interval_s: float = SCRAPE_INTERVAL_S) -> dict[str, Any]:
    """Prometheus configuration scraping the processes ``specs`` of the local stack of ``plan``."""
    namespace = plan.config["kubernetes"]["namespace"]
    roles = {i.name: i.role for i in plan.instances}  # an engine process (simulator or vLLM) is named as its instance
    engines = [{"targets": [_address(s)], "labels": {"namespace": namespace, ROLE_LABEL: roles[s.name], INSTANCE_LABEL: s.name}}
               for s in specs if s.name in roles]
    jobs: list[dict[str, Any]] = [{"job_name": "engines", "static_configs": engines}]
    for kind in ("proxy", "balancer"):  # their series carry the engine instance they are about as ``instance``
        targets = [_address(s) for s in specs if s.kind == kind]
        if targets:
            jobs.append({"job_name": kind, "honor_labels": True,
                         "static_configs": [{"targets": targets, "labels": {"namespace": namespace}}]})
    interval = f"{interval_s:g}s"
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}


def write_monitoring_files(plan: Plan, specs: list[ProcessSpec], state_dir: Path) -> None:
    """``prometheus.yml`` and ``grafana-dashboard.json`` in the state directory (the dashboard's balancer panels
    only when the stack runs the balancer)."""
    write_file(state_dir / PROMETHEUS_FILE, yaml.safe_dump(scrape_config(plan, specs), sort_keys=False))
    with_balancer = any(s.kind == "balancer" for s in specs)
    write_file(state_dir / DASHBOARD_FILE, dashboard_json(Context(plan), with_balancer))
