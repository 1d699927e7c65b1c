"""Engine simulator: a vLLM-Ascend prefill or decode instance without NPUs.

A test double and an explicit deployment target (``local``, ``kind``), never a
fallback. Its options (``SimConfig``, their flags) and the timing model it steps
on belong to the model layer (:mod:`ascend_runtime.perf`: ``sim_config``,
``sim_flags``, ``timing``, ``capacity``). Modules, one job each:

- :mod:`.experts`  skewed, drifting expert routing; expert maps and their validation.
- :mod:`.engine`   continuous-batching scheduler and step loop.
- :mod:`.kv`       KV block store, KV TCP server and client (PD transfer).
- :mod:`.metrics`  Prometheus exposition (vLLM names plus ``ascend_sim:*``).
- :mod:`.faults`   runtime fault injection state.
- :mod:`.api`      OpenAI-compatible request parsing and response shapes.
- :mod:`.server`   the aiohttp application, ``start_simulator`` / ``run_simulator``.

See docs/simulator.md for the timing model and the wire protocol.
"""
