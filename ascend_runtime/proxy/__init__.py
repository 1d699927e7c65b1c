"""PD-aware proxy in front of vLLM-Ascend prefill and decode instances.

Modules: instances (what to route to, from plain data), config (settings),
pool (live state and least-load selection), pd (the KV-transfer request
protocol), forward (one request through prefill, decode and relay), health
(active checks and /metrics scraping), discovery (file and Kubernetes
EndpointSlices), admin (token-guarded instance management), metrics
(prometheus), server (aiohttp app and ``start_proxy``).
"""

from ascend_runtime.proxy.config import ProxyConfig, RoutingWeights
from ascend_runtime.proxy.instances import InstanceSpec, specs_from_data

__all__ = ["InstanceSpec", "ProxyConfig", "RoutingWeights", "specs_from_data"]
