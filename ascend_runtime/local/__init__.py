"""The local stack: the whole PD topology as processes on loopback with simulated NPUs.

An explicit target (`ascend-deploy up --stack local`), never a fallback:
- :mod:`.topology`  which processes a Plan needs (simulators, proxy, balancer);
- :mod:`.processes` starting, probing and stopping process groups; who holds a listening socket;
- :mod:`.state`     the state directory (pids, endpoints, logs);
- :mod:`.runner`    up / status / down: port checks, readiness of our own processes, signals;
- :mod:`.report`    the post-start checks and the report in real time;
- :mod:`.host`      whether the host kept up with the simulators' clock, and who used the CPUs.
"""
