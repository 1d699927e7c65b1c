"""The local stack: the whole PD topology as processes on loopback with simulated NPUs.

An explicit target (`ascend-deploy up --stack local`), never a fallback:
- :mod:`.topology`  which processes a Plan needs (simulators, proxy, balancer);
- :mod:`.processes` starting, probing and stopping process groups;
- :mod:`.state`     the state directory (pids, endpoints, logs);
- :mod:`.runner`    up / status / down, with progress and the post-start checks.
"""
