"""The command line and environment of one real-engine instance: vLLM 0.23.0's OpenAI server (CPU build).

Every flag is one of ``vllm serve``'s in vLLM 0.23.0 (the release surface,
``ascend_runtime/engine/surfaces/vllm-ascend-0.23.0.json`` ``serve_flags``), every variable one of
``vllm/envs.py`` at 0.23.0; the real-engine tests check both against the installed release.

- ``--kv-transfer-config``: ``NixlConnector`` with ``kv_role: kv_both`` (either role, as vLLM's own PD
  examples run it) and ``kv_buffer_device: cpu`` (the CPU platform has no device buffer:
  ``_NIXL_SUPPORTED_DEVICE`` in vllm/distributed/kv_transfer/kv_connector/v1/nixl/worker.py).
- ``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT``: where the instance's NIXL handshake listens (its own leader
  address and the Plan's KV port of its first rank, so two instances never share one; the default 5600
  would collide). The prefill's answer names them to the decode (``remote_host``/``remote_port``).
- ``--kv-cache-memory-bytes``: the KV cache, 1 GiB (the tiny model needs little). Given explicitly, it also
  turns off the CPU worker's start-up check that the host has ``--gpu-memory-utilization`` (default 0.92)
  of its memory free (``CPUWorker.__init__`` in vllm/v1/worker/cpu_worker.py): with the fraction, every
  server claims 92% of the host, so the second and later servers of a stack, and any restarted by a
  rollout, refuse to start once the others hold memory.
- ``VLLM_CPU_OMP_THREADS_BIND=nobind`` with ``OMP_NUM_THREADS``: no core pinning, so several engines share
  a small machine.
- ``--enforce-eager``: no graph compilation at start (minutes on a small machine, nothing gained here).
- ``PYTHONPATH``: the two changes this target makes to vLLM (``shim/sitecustomize.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

from ascend_runtime.local.vllm_engine.install import EngineEnv

SHIM_DIR = Path(__file__).with_name("shim")
#: Longest prompt + answer the generated model serves (its position table holds 4096).
MAX_MODEL_LEN = 2048
#: The connector that moves KV between the local real-engine instances.
KV_CONNECTOR = "NixlConnector"
KV_CACHE_GIB = 1
OMP_THREADS = 1
#: Variables no engine process should inherit from the caller (they change what vLLM loads or where).
ISOLATED_VARIABLES = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "HF_ENDPOINT", "VLLM_CONFIGURE_LOGGING")


def kv_transfer_config(connector: str | None = KV_CONNECTOR, shared_storage_path: str | None = None) -> str | None:
    """The ``--kv-transfer-config`` JSON of ``connector`` (None: no connector at all). ``ExampleConnector``
    (vLLM's reference connector, which moves whole blocks through files) needs the directory both instances
    share (``shared_storage_path``, ``ExampleConnector.__init__`` in
    vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py)."""
    if connector is None:
        return None
    config: dict[str, object] = {"kv_connector": connector, "kv_role": "kv_both"}
    if connector == "NixlConnector":
        config["kv_buffer_device"] = "cpu"
    if shared_storage_path is not None:
        config["kv_connector_extra_config"] = {"shared_storage_path": shared_storage_path}
    return json.dumps(config, separators=(",", ":"))


def server_argv(env: EngineEnv, model: Path, served_name: str, host: str, port: int, max_num_seqs: int,
                kv_config: str | None = kv_transfer_config()) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server ...`` of one instance (the ``vllm`` script looks up
    the distribution named ``vllm``, which the CPU build, ``vllm-cpu``, is not)."""
    argv = [str(env.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", served_name, "--host", host, "--port", str(port),
            "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(max_num_seqs), "--dtype", "float32",
            "--enforce-eager", "--disable-uvicorn-access-log", "--kv-cache-memory-bytes", str(KV_CACHE_GIB << 30)]
    if kv_config is not None:
        argv += ["--kv-transfer-config", kv_config]
    return argv


def server_env(side_channel_host: str, side_channel_port: int) -> dict[str, str]:
    """The variables one instance's server gets on top of the caller's environment."""
    return {
        "PYTHONPATH": str(SHIM_DIR),
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(OMP_THREADS),
        "VLLM_NIXL_SIDE_CHANNEL_HOST": side_channel_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
    }
