"""The local real-engine target's changes to vLLM (``shim/sitecustomize.py``) take hold in the engine's
own interpreter, exactly where they are meant to, and nowhere else."""

from __future__ import annotations

import json
import os
import re
import subprocess

from ascend_runtime.local.vllm_engine.install import engine_env
from ascend_runtime.local.vllm_engine.server import SHIM_DIR
from tests.realengine.conftest import require_engine

#: the shim's delay, read from its source (importing it would install its import hook in this process)
PROGRESS_DELAY_US = int(re.search(r"^PROGRESS_DELAY_US = (\d+)$", (SHIM_DIR / "sitecustomize.py").read_text(), re.M)[1])

PROBE = """
import json, time
from vllm.distributed.kv_transfer.kv_connector import utils
from vllm.distributed import nixl_utils
import nixl._api as api
config = api.nixlBind.nixlAgentConfig()
config.pthrDelay = 0  # what nixl_agent.__init__ sets
agent = nixl_utils.NixlWrapper("probe", nixl_utils.nixl_agent_config(num_threads=4, capture_telemetry=True))
start = time.process_time()
time.sleep(2)
print(json.dumps({"delay_us": config.pthrDelay, "idle_cpu_s": time.process_time() - start,
                  "progress_thread": nixl_utils.nixl_agent_config(num_threads=4).enable_pthread,
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


def test_the_shim_slows_nixls_progress_thread_and_wraps_the_topology() -> None:
    require_engine()
    shimmed = _probe(with_shim=True)
    assert shimmed["delay_us"] == PROGRESS_DELAY_US and shimmed["progress_thread"] is True  # slowed, still on
    assert shimmed["idle_cpu_s"] < 0.5, shimmed  # an idle agent over 2 s: no busy loop
    assert shimmed["topology_wrapped"] == "sitecustomize"
    plain = _probe(with_shim=False)
    assert plain["delay_us"] == 0  # what NIXL 1.5.1 does on its own
    assert plain["topology_wrapped"] != "sitecustomize"
