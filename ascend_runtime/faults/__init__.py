"""NPU and link faults drained in seconds: the fault watcher (``ascend-deploy faults watch``).

It reads the fault signals MindCluster v26.1.0 publishes in the Kubernetes API
for the Plan's nodes (:mod:`.signals`), drains every instance with a rank on a
faulted node in every PD proxy replica through the admin API (:mod:`.proxies`),
posts an Event on the node, exports Prometheus metrics (:mod:`.metrics`), and
undrains an instance once its nodes are clear and its leader passes ``/health``
and a direct PD round trip (:mod:`.recovery`). See docs/faults.md.

Entry points: :class:`.watcher.FaultWatcher` (with :class:`.watcher.WatcherConfig`) over a
:class:`.topology.Topology`; the submodules are imported where used, so the deploy
layer can read :mod:`.signals` and :mod:`.topology` without the watcher's dependencies.
"""
