"""Zero-downtime engine upgrades: one instance at a time, drained, replaced, checked, undrained.

``ascend-deploy rollout --stack S`` (ascend_runtime/cli/commands/rollout.py) walks the
instances in :func:`ascend_runtime.rollout.order.rollout_order` and, for each, runs the
steps of :mod:`ascend_runtime.rollout.steps`: drain it in every proxy replica, wait
(bounded) until the proxies count no request in flight on it, replace it (a driver:
:mod:`ascend_runtime.rollout.local` restarts the simulator process of a local stack,
:mod:`ascend_runtime.rollout.kube` patches the instance's LeaderWorkerSet or
Deployments and waits for the group to be ready), post-check it
(:mod:`ascend_runtime.rollout.postcheck`: ``/health``, then a PD round trip straight
to the engines), undrain it and wait until every replica routes to it again. The
first failure stops the rollout; what follows is not touched. docs/rollout.md.
"""
