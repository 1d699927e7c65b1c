"""Engine simulator: a vLLM-Ascend prefill or decode instance without NPUs.

A test double and an explicit deployment target (``local``, ``kind``), never a
fallback. Modules, one job each:

- :mod:`.config`   SimConfig (CLI/Plan options) and hardware profiles.
- :mod:`.timing`   the documented, calibrated per-step timing model.
- :mod:`.experts`  skewed, drifting expert routing; expert maps and their validation.
- :mod:`.engine`   continuous-batching scheduler and step loop.
- :mod:`.kv`       KV block store, KV TCP server and client (PD transfer).
- :mod:`.metrics`  Prometheus exposition (vLLM names plus ``ascend_sim:*``).
- :mod:`.faults`   runtime fault injection state.
- :mod:`.api`      OpenAI-compatible request parsing and response shapes.
- :mod:`.server`   the aiohttp application, ``start_simulator`` / ``run_simulator``.

See docs/simulator.md for the timing model and the wire protocol.
"""

from ascend_runtime.sim.config import SimConfig

__all__ = ["SimConfig"]
