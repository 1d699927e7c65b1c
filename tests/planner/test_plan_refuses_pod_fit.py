"""`ascend-deploy plan` refuses the stacks whose engine pods `render` refuses (CPU and memory fit), with
the same message, exit 2, before any Plan is printed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.cli import main
from ascend_runtime.hardware import hardware_spec
from ascend_runtime.planner.pod_resources import (
    ENGINE_HOST_BASE_GIB,
    ENGINE_HOST_GIB_PER_NPU,
    MIN_CPUS_PER_NPU,
)

A2, CM = hardware_spec("atlas-800i-a2"), hardware_spec("cm384")
FITS_A2 = A2.engine_memory_gib - (ENGINE_HOST_BASE_GIB + ENGINE_HOST_GIB_PER_NPU * A2.devices_per_node)
FITS_CM = CM.engine_memory_gib - (ENGINE_HOST_BASE_GIB + ENGINE_HOST_GIB_PER_NPU * CM.devices_per_node)

#: (stack, kubernetes keys, the key the refusal names, or None: accepted by both)
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("a2-staging", {"shm_size_gib": FITS_A2 + 1}, "kubernetes.shm_size_gib"),
    ("a2-staging", {"shm_size_gib": 64, "engine_memory_gib": 200}, "kubernetes.shm_size_gib"),
    ("a2-staging", {"engine_cpu": MIN_CPUS_PER_NPU * A2.devices_per_node - 1}, "kubernetes.engine_cpu"),
    ("cm384-prod", {"shm_size_gib": FITS_CM + 1}, "kubernetes.shm_size_gib"),
    ("a2-staging", {"shm_size_gib": FITS_A2}, None),  # exactly fills the limit
    ("a2-staging", {"engine_cpu": MIN_CPUS_PER_NPU * A2.devices_per_node}, None),
    ("kind", {"shm_size_gib": 4096}, None),  # simulated engines: no NPU-sized check
]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_and_render_refuse_the_same_stacks_with_the_same_message(
        stack_copy: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for n, (stack, keys, refused) in enumerate(CASES):
        stacks = stack_copy(stack, edit_config=lambda c, k=keys: c["ascend-deepseek:kubernetes"].update(k))
        args = ["--stack", stack, "--stacks-dir", str(stacks)]
        out_dir = tmp_path / f"out-{n}"
        render = _run(["render", *args, "--out", str(out_dir)], capsys)
        for flags in ([], ["--json"], ["--advise"]):
            plan = _run(["plan", *args, *flags], capsys)
            if refused is None:
                assert plan[0] == 0 and render[0] == 0, (stack, keys, flags, plan[2], render[2])
                assert plan[1], flags  # the Plan is printed
                continue
            assert plan[0] == 2 and render[0] == 2, (stack, keys, flags, plan[2], render[2])
            assert plan[1] == "", (flags, plan[1][:200])  # nothing printed before the refusal
            assert refused in plan[2] and "Traceback" not in plan[2], plan[2]
            assert plan[2] == render[2], (plan[2], render[2])  # the same message, word for word
        if refused:
            assert not (out_dir / "plan.json").exists()


def test_plan_refuses_what_the_release_conformance_check_of_render_refuses(
        stack_copy: Callable[..., Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # an environment variable vLLM-Ascend 0.23.0 does not read (MLAP0 with a zero): the planner's own rules pass it
    stacks = stack_copy("a2-staging", edit_config=lambda c: c["ascend-deepseek:engine"].setdefault(
        "extra_env", {}).update({"VLLM_ASCEND_ENABLE_MLAP0": "1"}))
    args = ["--stack", "a2-staging", "--stacks-dir", str(stacks)]
    render = _run(["render", *args, "--out", str(tmp_path / "out")], capsys)
    plan = _run(["plan", *args], capsys)
    assert render[0] == 2 and plan[0] == 2, (plan, render)
    assert "VLLM_ASCEND_ENABLE_MLAP0" in plan[2] and plan[1] == "" and plan[2] == render[2]
