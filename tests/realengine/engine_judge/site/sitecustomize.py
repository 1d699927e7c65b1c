"""Stand-ins for the NPU-only software vLLM-Ascend v0.23.0 imports, for the engine judge (judge.py).

Python imports this file at interpreter start when its directory is on ``PYTHONPATH``: the judge and any Python
subprocess vLLM starts for it (vLLM inspects model classes in one) see the same stand-ins. Each one provides a
name the vendored vLLM-Ascend code imports, or an effect its real import has, and nothing that decides
whether a configuration is accepted: no stand-in computes a value a config check reads, and every function
that would do NPU work raises when called, so a stand-in can only turn an acceptance into a refusal.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

import torch
import torch.utils

#: Variable naming the device type of the vLLM-Ascend build being judged (set by judge.py per case).
DEVICE_TYPE_ENV = "ASCEND_DEPLOY_JUDGE_DEVICE_TYPE"
#: The device types vLLM-Ascend's setup.py writes into ``_build_info.py`` (``gen_build_info``, v0.23.0).
BUILD_DEVICE_TYPES = ("A2", "A3", "_310P", "A5")


def _module(name: str) -> types.ModuleType:
    """An empty module with a spec (no loader), registered under ``name``."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = module
    return module


def _npu_work(name: str):  # type: ignore[no-untyped-def]
    """A function that would act on an NPU: calling it while judging is an error."""

    def unavailable(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{name} needs an NPU; the engine judge builds configurations only")

    unavailable.__name__ = name.rsplit(".", 1)[-1]
    return unavailable


# 1. torch_npu (Ascend's PyTorch adapter). vllm_ascend/utils.py and the Mooncake connector module import it
#    for its side effects (2 and 3 below); the stand-in module itself has no attribute, so any use of one fails.
_module("torch_npu")

# 2. The PrivateUse1 device named "npu", as importing torch_npu does: vLLM's DeviceConfig calls
#    torch.device(current_platform.device_type), i.e. torch.device("npu"). A name, no device behind it.
torch.utils.rename_privateuse1_backend("npu")

# 3. torch.npu, the module torch_npu installs on torch. Only what vLLM-Ascend's imports touch:
#    - Stream: a type named in annotations (distributed/weight_transfer/hccl_engine.py);
#    - is_available() -> False: there is no NPU here. transformers then leaves its NPU flash-attention
#      integration out (model code, not configuration); vLLM-Ascend's ModelSlim quantization override returns
#      "ascend" only when it is True (quantization/modelslim_config.py), so False can only refuse, never accept;
#    - memory_stats, memory_reserved, reset_peak_memory_stats, empty_cache: assigned over torch.accelerator's by
#      patch/platform/patch_torch_accelerator.py at plugin load; they raise if called.
_npu = _module("torch.npu")
_npu.Stream = type("Stream", (), {"__doc__": "torch.npu.Stream stand-in: a type for annotations only."})
_npu.is_available = lambda: False
for _name in ("memory_stats", "memory_reserved", "reset_peak_memory_stats", "empty_cache"):
    setattr(_npu, _name, _npu_work(f"torch.npu.{_name}"))
torch.npu = _npu  # type: ignore[attr-defined]

# 4. mooncake.engine.TransferEngine (Mooncake's transfer engine, a native library). vLLM asks the KV connector
#    class whether it needs piecewise graphs and supports the hybrid KV cache manager while building the
#    config, which imports vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py; that module
#    imports TransferEngine. Creating one (what a running connector does) raises.
_mooncake = _module("mooncake")
_mooncake.__path__ = []  # a package, so that mooncake.engine can be imported
_engine = _module("mooncake.engine")
_engine.TransferEngine = type("TransferEngine", (), {"__init__": _npu_work("mooncake.engine.TransferEngine")})
_mooncake.engine = _engine


# 5. vllm_ascend/_build_info.py, the file vLLM-Ascend's build writes (setup.py gen_build_info, v0.23.0): the
#    device type the wheel was built for. The image the kit deploys is built for the stack's hardware (A2 on
#    Atlas 800I A2, A3 on CM384: the -a3 image); judge.py sets it per case. Unset or unknown raises.
def _build_info_attribute(name: str) -> str:
    if name != "__device_type__":
        raise AttributeError(name)
    value = os.environ.get(DEVICE_TYPE_ENV, "")
    if value not in BUILD_DEVICE_TYPES:
        raise RuntimeError(f"{DEVICE_TYPE_ENV}={value!r} is not one of {BUILD_DEVICE_TYPES}")
    return value


_module("vllm_ascend._build_info").__getattr__ = _build_info_attribute  # type: ignore[attr-defined]
