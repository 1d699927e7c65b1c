"""The local real-engine target's changes to vLLM (``shim/sitecustomize.py``) take hold in the engine's
own interpreter, exactly where they are meant to, and nowhere else."""

from __future__ import annotations

import json
import os
import subprocess

from ascend_runtime.local.vllm_engine.install import engine_env
from ascend_runtime.local.vllm_engine.server import SHIM_DIR
from tests.realengine.conftest import require_engine

PROBE = """
import json
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import worker
from vllm.distributed.kv_transfer.kv_connector import utils
from vllm.distributed import nixl_utils
made = worker.nixl_agent_config(num_threads=4, capture_telemetry=True)
direct = nixl_utils.nixl_agent_config(num_threads=4)
print(json.dumps({"worker_progress_thread": made.enable_pthread, "worker_threads": made.num_threads,
                  "nixl_default_progress_thread": direct.enable_pthread,
                  "topology_wrapped": utils.TransferTopology.__post_init__.__module__}))
"""


def _probe(with_shim: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if with_shim:
        env["PYTHONPATH"] = str(SHIM_DIR)
    out = subprocess.run([str(engine_env().python), "-c", PROBE], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_shim_turns_off_only_the_nixl_workers_progress_thread_and_wraps_the_topology() -> None:
    require_engine()
    shimmed = _probe(with_shim=True)
    assert shimmed["worker_progress_thread"] is False
    assert shimmed["worker_threads"] == 4  # the worker's other arguments pass through
    assert shimmed["nixl_default_progress_thread"] is True  # NIXL itself is untouched
    assert shimmed["topology_wrapped"] == "sitecustomize"
    plain = _probe(with_shim=False)
    assert plain["worker_progress_thread"] is True  # what vLLM 0.23.0 does on its own
    assert plain["topology_wrapped"] != "sitecustomize"
