"""The model layer's performance model: hardware figures, the calibrated timing model and what is built on it.

Modules, one job each:

- :mod:`.profiles`        per-NPU hardware figures (``HARDWARE``) and published instance shapes (``ROLE_DEFAULTS``).
- :mod:`.sim_config`      ``SimConfig``: one engine instance's shape and the simulator's options.
- :mod:`.sim_flags`       the simulator's command-line form: ``SimConfig`` fields as flags, ``argv_from_config``.
- :mod:`.timing`          the documented, calibrated per-step timing model (``TimingModel``).
- :mod:`.capacity`        HBM budget of one NPU: weights and KV cache capacity.
- :mod:`.model`           closed-form stage model on the timing model (``StageShape``; ``plan --advise``, the P:D planner).
- :mod:`.fit`             the model's constants fitted on published points, and held-out predictions.
- :mod:`.proxy_capacity`  the PD proxy's measured relay cost and the workers a token rate needs.
- :mod:`.from_plan`       a Plan's instances as model inputs (``stage_shape``, ``sim_config_from_plan``).

The engine simulator (``ascend_runtime.sim``), the planner and the renderer import these; nothing here
imports a runtime package (the simulator, the proxy, the P:D planner, the local launcher).
"""
