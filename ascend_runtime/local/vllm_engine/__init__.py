"""The local real-engine target: vLLM's own OpenAI server (the CPU build of the vLLM release vLLM-Ascend
runs on) serving each Plan instance of a local stack, with NixlConnector moving KV between prefill and decode.

The simulator stays the default local engine and the only one that models NPU timing; this target is how
the proxy, the checks and the rollouts meet the real engine. The engine lives in a virtual environment of
its own (:mod:`.install`, ``ascend-deploy engine install``), never in the kit's, and serves a tiny model
the kit generates (:mod:`.model`).
"""

from __future__ import annotations

from pathlib import Path


class EngineNotReady(RuntimeError):
    """The real engine cannot start here; the message says what is missing and the command that fixes it."""


def prepare(seed: int) -> Path:
    """Check the engine is installed and generate (or find) the model of ``seed``; returns the model directory.
    Raises :class:`EngineNotReady` naming what is missing."""
    import subprocess  # noqa: PLC0415

    from ascend_runtime.local.vllm_engine.install import engine_env, missing_reason  # noqa: PLC0415
    from ascend_runtime.local.vllm_engine.model import ensure_model  # noqa: PLC0415

    reason = missing_reason()
    if reason is not None:
        raise EngineNotReady(reason)
    try:
        return ensure_model(engine_env(), seed)
    except subprocess.CalledProcessError as exc:
        raise EngineNotReady(f"generating the model failed (exit {exc.returncode}): "
                             f"{(exc.stderr or '').strip().splitlines()[-1:] or ''}") from None
