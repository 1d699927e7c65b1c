"""Renderers: pure functions from the Plan to what HCCL, vLLM-Ascend and operators read.

- :mod:`.paths`       paths inside the engine container (one place);
- :mod:`.ranktables`  HCCL rank tables v1.0 / v1.2, the LLMDataDist PD table, the global grouped table;
- :mod:`.environment` HCCL and runtime environment of one rank;
- :mod:`.engine_args` the ``vllm serve`` argv of one rank (one version table for both KV connector dialects);
- :mod:`.launch`      Jinja2 text artifacts: per-rank entrypoint script, ``hccn.conf`` per node, deployment sheet;
- :mod:`.artifacts`   every file of ``ascend-deploy render`` as ``{relative_path: text}``.
"""

from __future__ import annotations

from ascend_runtime.render.artifacts import render_artifacts, write_artifacts

__all__ = ["render_artifacts", "write_artifacts"]
