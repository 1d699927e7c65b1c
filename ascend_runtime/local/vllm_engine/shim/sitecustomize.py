"""The one correction the local real-engine target makes to vLLM 0.23.0's CPU build, loaded before vLLM.

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
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

_TARGET = "vllm.distributed.kv_transfer.kv_connector.utils"


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


class _CorrectOnImport(importlib.abc.MetaPathFinder):
    """Applies :func:`_correct` right after the target module has run, whoever imports it first."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module) -> None:
            run(module)
            _correct(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _CorrectOnImport())
