"""The two changes the local real-engine target makes to vLLM 0.23.0's CPU build, loaded before vLLM.

The launcher puts this directory first on ``PYTHONPATH`` of the engine processes it starts (and only
those), so Python imports this file at start in the API server and in every engine process it spawns.

What it corrects: ``TransferTopology.__post_init__`` in
``vllm/distributed/kv_transfer/kv_connector/utils.py`` (vLLM 0.23.0) decides whether the first dimension of
the KV cache is K/V or blocks by asking the attention backend for a mock shape and calling the layout
blocks-first only when the shape has 5 dimensions with blocks first. The CPU attention backend's cache is
``(num_blocks, num_kv_heads, block_size, 2 * head_size)`` (``CPUAttentionBackend.get_kv_cache_shape`` in
``vllm/v1/attention/backends/cpu_attn.py``): 4 dimensions, blocks first, K and V side by side in the last
one. Taken for K/V-first, the NixlConnector worker reads the cache's first dimension as 2 and refuses to
start ("All kv cache tensors must have the same number of blocks"). This correction marks that layout
blocks-first when the backend is the CPU one and its mock shape has the block count first, and changes
nothing else: which blocks move, and whether they do, is still the connector's own code, so it cannot
make KV look moved when it was not (the real-engine tests compare greedy answers through the pair with a
single instance's and read decode's external prefix-cache hits).

What it slows down: NIXL's progress thread. ``NixlConnectorWorker.__init__`` in
``vllm/distributed/kv_transfer/kv_connector/v1/nixl/worker.py`` (vLLM 0.23.0) builds its agent with NIXL's
progress thread on, and NIXL 1.5.1's agent sets the thread's delay to 0 (``nixl_agent.__init__``,
``nixl_cu12/_api.py`` and ``nixl_cu13/_api.py``: ``agent_config.pthrDelay = 0``), a loop that yields but never
sleeps: one core per engine even when idle. The delay (microseconds between rounds of the thread,
``nixlAgentConfig.pthrDelay``) is raised to ``PROGRESS_DELAY_US``. The thread still progresses every
transfer on its own, without waiting for the engine's next step; each round comes at most that much later.
No transfer is added, skipped or reported differently (docs/real-engine.md has the measurement).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_TARGET = "vllm.distributed.kv_transfer.kv_connector.utils"
#: NIXL's agent API, one module per build (nixl/__init__.py loads the one for the host)
_NIXL_APIS = ("nixl_cu12._api", "nixl_cu13._api")
#: Microseconds NIXL's progress thread waits between rounds (NIXL's own default here is 0: a busy loop)
PROGRESS_DELAY_US = 1000


def _correct(module) -> None:
    topology = module.TransferTopology
    original = topology.__post_init__

    def __post_init__(self) -> None:
        original(self)
        backend = self.attn_backends[0]
        if self.is_mamba or self._is_kv_layout_blocks_first or backend.get_name() != "CPU_ATTN":
            return
        shape = backend.get_kv_cache_shape(num_blocks=1, block_size=16, num_kv_heads=1, head_size=1)
        if len(shape) == 4 and shape[0] == 1:
            self._is_kv_layout_blocks_first = True

    topology.__post_init__ = __post_init__


def _delay_progress_thread(module) -> None:
    bindings = module.nixlBind
    config = bindings.nixlAgentConfig
    delay = config.pthrDelay

    class DelayedProgressConfig(config):
        """NIXL's agent config whose progress-thread delay is at least ``PROGRESS_DELAY_US``."""

        pthrDelay = property(delay.fget, lambda self, value: delay.fset(self, max(int(value), PROGRESS_DELAY_US)))

    bindings.nixlAgentConfig = DelayedProgressConfig


#: module -> what is applied to it right after it has run
_AFTER_IMPORT = {_TARGET: _correct, **{api: _delay_progress_thread for api in _NIXL_APIS}}


class _CorrectOnImport(importlib.abc.MetaPathFinder):
    """Applies the table's change right after its module has run, whoever imports it first."""

    def find_spec(self, name, path, target=None):
        change = _AFTER_IMPORT.get(name)
        if change is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module) -> None:
            run(module)
            change(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _CorrectOnImport())
