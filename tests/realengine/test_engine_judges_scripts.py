"""The engine's own code judges every rendered launch script (docs/engine-judge.md).

Every rank script of every committed stack runs under bash with a stand-in ``vllm`` that records what it is
handed; each argv and environment then goes through vLLM 0.23.0's ``vllm serve`` CLI down to
``create_engine_config``, which runs vLLM-Ascend v0.23.0's ``NPUPlatform.check_and_update_config``
(``AscendConfig``, ``FinegrainedTPConfig``, ``EplbConfig``) on the config it builds: in the real engine's
interpreter, one process for all scripts (tests/realengine/engine_judge/judge.py), vLLM-Ascend from the vendored
sources of its tag. Planted errors in rendered scripts, which the kit's own checks never see, must be refused
by the engine's code.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.local.vllm_engine.install import engine_env
from ascend_runtime.planner import load_plan
from ascend_runtime.planner.plan import Plan, RankPlan
from tests.realengine.conftest import require_engine
from tests.realengine.engine_judge.cases import (
    VENDOR,
    all_stack_cases,
    case,
    committed_stacks,
    rendered_scripts,
    run_judge,
)

pytestmark = pytest.mark.slow

#: vLLM-Ascend's tag and commit of the vendored files (VENDOR/README.md)
UPSTREAM_TAG, UPSTREAM_COMMIT = "v0.23.0", "5cb98caaadeff42b5b62b996e34bb2aaa29d20fd"
MIRROR = Path(os.environ.get("UPSTREAM_MIRRORS", "/nonexistent")) / "vllm-project+vllm-ascend" / "repo"
STACKS = committed_stacks()
#: vLLM-Ascend modules an import looks for that the tag has no source of, and why that is the real engine's case too
ABSENT_UPSTREAM = {
    "vllm_ascend.quantization.AscendCompressedTensorsConfig": "a class the package's __getattr__ provides "
    "(vllm_ascend/quantization/__init__.py), looked for as a submodule too; the tag has no such file either",
}


@dataclass(frozen=True)
class Planted:
    """One error planted in a rendered launch script, and the engine code that must refuse it."""

    stack: str
    rank: str
    old: str  #: text of the rendered script (exactly once)
    new: str
    refused_in: str  #: the engine file whose code raises (a frame of the refusal)
    message: str  #: words of the engine's message


PLANTED = {
    # FinegrainedTPConfig (vllm_ascend/ascend_config.py): every module TP size divides data_parallel_size (32)
    "finegrained-tp-does-not-divide": Planted(
        "a2-staging", "decode-0-rank0", '"mlp_tensor_parallel_size":8', '"mlp_tensor_parallel_size":3',
        "vllm_ascend/ascend_config.py", "finegrained tp sizes must divide by data_parallel_size"),
    # EplbConfig._validate_config: dynamic_eplb needs DYNAMIC_EPLB (or EXPERT_MAP_RECORD) in the environment
    "dynamic-eplb-unset": Planted(
        "a2-staging", "prefill-0-rank0", "export DYNAMIC_EPLB=true\n", "",
        "vllm_ascend/ascend_config.py", "DYNAMIC_EPLB"),
    # EplbConfig.__init__: a key it does not define raises
    "eplb-key-typo": Planted(
        "a2-staging", "prefill-0-rank0", '"expert_heat_collection_interval":', '"expert_heat_colection_interval":',
        "vllm_ascend/ascend_config.py", "Config has no attribute 'expert_heat_colection_interval'"),
    # vLLM's SchedulerConfig: a step must hold one token of every sequence (decode: max_num_seqs 72)
    "batched-tokens-below-max-num-seqs": Planted(
        "a2-staging", "decode-0-rank0", "  --max-num-batched-tokens\n  256\n", "  --max-num-batched-tokens\n  71\n",
        "vllm/engine/arg_utils.py", "max_num_batched_tokens (71)"),
}


def planted_case(name: str, root: Path) -> dict[str, Any]:
    """The judge case of a rendered script with one planted error."""
    planted = PLANTED[name]
    plan, scripts, watch = rendered_scripts(planted.stack)
    script = scripts[planted.rank]
    assert script.count(planted.old) == 1, f"{name}: {planted.old!r} is not in {planted.rank}'s script once"
    return case(f"planted/{name}", plan, script.replace(planted.old, planted.new), watch, root)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The engine's verdict on every rank script of every stack and on each planted error, from one run."""
    require_engine()
    root = tmp_path_factory.mktemp("engine-judge")
    cases = all_stack_cases(root / "scripts") + [planted_case(name, root / "scripts") for name in PLANTED]
    return run_judge(engine_env().python, cases, root)


def refusal(verdict: dict[str, Any]) -> str:
    """What a failed verdict says, with the tail of its log."""
    log = Path(verdict["log"]).read_text(errors="replace")[-3000:] if Path(verdict["log"]).exists() else ""
    return (f"{verdict.get('error_type')} at {verdict.get('stage')}: {verdict.get('message', '')[-1500:]}\n"
            f"refused by: {verdict.get('refused_by')}\n--- log tail ---\n{log}")


@pytest.mark.parametrize("stack", STACKS)
def test_the_engine_accepts_every_rank_script_of_the_stack(stack: str, verdicts: dict[str, dict[str, Any]]) -> None:
    plan = load_plan(stack)
    assert plan.ranks, f"{stack} renders no rank script"
    for rank, dp_rank in servers(plan):
        case_id = f"{stack}/{rank.name}" + ("" if dp_rank is None else f"/dp{dp_rank}")
        verdict = verdicts[case_id]
        assert verdict["ok"], f"{case_id}: " + refusal(verdict)
        built, inst = verdict["config"], plan.instance(rank.instance)
        stage = plan.config[inst.role]
        # one server per DP rank (vLLM's external load balancer, data_parallel_size_local 1), else the node's
        assert (built["data_parallel_rank"], built["data_parallel_external_lb"]) == (
            (dp_rank, True) if dp_rank is not None else (built["data_parallel_rank"], False))
        # vLLM-Ascend's platform built it, to the end, for the device the stack's image is built for
        assert built["platform"] == "vllm_ascend.platform.NPUPlatform"
        assert built["check_and_update_config_returned"] >= 1
        assert built["device_type"] == ("A3" if plan.hardware == "cm384" else "A2")
        assert built["worker_cls"] == "vllm_ascend.worker.worker.NPUWorker"
        # and the config is the Plan's, as the engine reads it
        assert (built["data_parallel_size"], built["data_parallel_size_local"], built["tensor_parallel_size"]) == (
            inst.dp, rank.dp_local if dp_rank is None else 1, inst.tp)
        assert built["enable_expert_parallel"] == (inst.ep > 1)
        assert (built["max_num_seqs"], built["max_num_batched_tokens"]) == (
            stage["max_num_seqs"], stage["max_num_batched_tokens"])
        assert built["kv_role"] == ("kv_producer" if inst.role == "prefill" else "kv_consumer")
        assert built["dynamic_eplb"] == bool(stage.get("eplb"))
        assert built["num_redundant_experts"] == (inst.redundant_experts if stage.get("eplb") else 0)
        assert built["speculative_method"] == ("mtp" if stage.get("mtp") else None)


def servers(plan: Plan) -> list[tuple[RankPlan, int | None]]:
    """Every server the Plan's rank scripts start: (node group, None) under ``serving: instance``, (node group,
    DP rank) for each DP rank under ``serving: rank``."""
    if plan.config.get("serving") != "rank":
        return [(rank, None) for rank in plan.ranks]
    return [(rank, dp_rank) for rank in plan.ranks for dp_rank in rank.dp_ranks]


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_engine_refuses_a_planted_error(name: str, verdicts: dict[str, dict[str, Any]]) -> None:
    planted, verdict = PLANTED[name], verdicts[f"planted/{name}"]
    assert not verdict["ok"], f"the engine accepted the planted error {name}"
    assert any(frame.startswith(planted.refused_in) for frame in verdict["refused_by"]), refusal(verdict)
    assert planted.message in verdict["message"], refusal(verdict)
    # the same script without the error is accepted (the stack test), so this is the refusal of that error
    assert verdicts[f"{planted.stack}/{planted.rank}"]["ok"]


def vendored_sources() -> set[str]:
    """Paths (from ``vllm_ascend/``) of the vendored vLLM-Ascend sources."""
    return {p.relative_to(VENDOR).as_posix() for p in (VENDOR / "vllm_ascend").rglob("*.py")}


def test_the_vendored_sources_are_the_modules_the_engine_looked_for(verdicts: dict[str, dict[str, Any]]) -> None:
    """Every vLLM-Ascend module an import looked for is vendored (also those whose import then failed: a missing
    file would change which branch a guarded import takes), and nothing else is."""
    imports = {name: path for verdict in verdicts.values() for name, path in verdict["vllm_ascend_imports"].items()}
    found = {path for path in imports.values() if path}
    assert found, "no case imported vLLM-Ascend"
    assert found == vendored_sources(), (sorted(found - vendored_sources()), sorted(vendored_sources() - found))
    assert {name for name, path in imports.items() if path is None} <= set(ABSENT_UPSTREAM)


@pytest.mark.skipif(not (MIRROR / "HEAD").exists(), reason="no vllm-project/vllm-ascend mirror on this machine")
def test_the_vendored_sources_are_the_upstream_tag_unmodified() -> None:
    def show(spec: str) -> bytes:
        return subprocess.run(["git", f"--git-dir={MIRROR}", "show", spec], check=True, capture_output=True).stdout

    tagged = subprocess.run(["git", f"--git-dir={MIRROR}", "rev-parse", f"{UPSTREAM_TAG}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    assert tagged == UPSTREAM_COMMIT
    for path in sorted(vendored_sources()) + ["LICENSE"]:
        assert (VENDOR / path).read_bytes() == show(f"{UPSTREAM_COMMIT}:{path}"), path
