"""Prometheus metrics of the fault watcher (a private registry; served on ``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Seconds from a fault signal seen to its instance drained on every replica; the goal is 5.
DRAIN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)


class FaultMetrics:
    """Every metric the watcher exports."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.faulted_nodes = Gauge("ascend_faults_faulted_nodes", "Plan nodes with a fault signal now", ["role"], registry=r)
        self.node_faulted = Gauge("ascend_faults_node_faulted", "1 while the node has a fault signal, by kind",
                                  ["node", "role", "kind"], registry=r)
        self.drained_instances = Gauge("ascend_faults_drained_instances",
                                       "Instances the watcher keeps drained (faulted or not yet recovered)", registry=r)
        self.instance_drained = Gauge("ascend_faults_instance_drained", "1 while the watcher keeps the instance drained",
                                      ["instance", "role"], registry=r)
        self.signal_to_drain = Histogram("ascend_faults_signal_to_drain_seconds",
                                         "From a fault signal seen to the instance drained on every proxy replica",
                                         buckets=DRAIN_BUCKETS, registry=r)
        self.last_signal_to_drain = Gauge("ascend_faults_last_signal_to_drain_seconds",
                                          "The last drain's time from signal to drained", ["instance"], registry=r)
        self.drains = Counter("ascend_faults_drains", "Instances drained because of a fault", ["instance"], registry=r)
        self.undrains = Counter("ascend_faults_undrains", "Instances put back after recovery checks passed",
                                ["instance"], registry=r)
        self.recovery_checks = Counter("ascend_faults_recovery_checks", "Health + PD round-trip checks before undrain",
                                       ["instance", "outcome"], registry=r)
        self.source_failed = Gauge("ascend_faults_source_failed",
                                   "1 while a fault source the topology expects is not alive on the node (its "
                                   "DaemonSet pod absent or not ready, or its ConfigMap absent or stale)",
                                   ["node", "role", "source", "reason"], registry=r)
        self.instance_unwatched = Gauge("ascend_faults_instance_unwatched",
                                        "1 while a node of the instance has a failed fault source (kept routable)",
                                        ["instance", "role"], registry=r)
        self.device_info_age = Gauge("ascend_faults_device_info_age_seconds",
                                     "Age of the device plugin ConfigMap's DeviceInfo.UpdateTime at the last read",
                                     ["node"], registry=r)
        self.read_errors = Counter("ascend_faults_read_errors", "Kubernetes API reads that failed (last state kept)",
                                   ["source"], registry=r)
        self.proxy_errors = Counter("ascend_faults_proxy_errors", "Admin API calls to a proxy replica that failed",
                                    ["proxy"], registry=r)
        self.proxy_replicas = Gauge("ascend_faults_proxy_replicas", "Proxy replicas the drains go to", registry=r)
        self.spare_nodes = Gauge("ascend_faults_spare_nodes", "Nodes the Plan leaves unused", ["state"], registry=r)
        self.events = Counter("ascend_faults_events", "Kubernetes Events posted", ["reason", "outcome"], registry=r)
        self.cycles = Counter("ascend_faults_cycles", "Watch cycles run", registry=r)
        self.last_cycle = Gauge("ascend_faults_last_cycle_timestamp_seconds", "Unix time of the last cycle", registry=r)
