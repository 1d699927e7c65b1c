"""Everything rendered for every stack exists in the release it targets; planted mutations are caught.

The surfaces (ascend_runtime/engine/surfaces/) are extracted from the released
sources by tools/engine_surface.py; these tests need no network.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ascend_runtime.engine import conformance
from ascend_runtime.engine.releases import METRICS, RELEASES
from ascend_runtime.engine.surface import load_surface, supported_releases
from ascend_runtime.planner import Plan
from ascend_runtime.render import engine_args
from ascend_runtime.render.objects.balancer import balancer_objects
from ascend_runtime.render.objects.common import Context
from ascend_runtime.render.objects.monitoring import dashboard_json
from tests.conftest import STACK_NAMES

ROOT = Path(__file__).resolve().parents[2]
#: Modules that read engine metrics at run time (proxy routing, checks).
from ascend_runtime.checks.kv_handover import METRICS_READ  # noqa: E402

METRIC_READERS = ("ascend_runtime/proxy", "ascend_runtime/checks", "ascend_runtime/balancer")


def _dashboard(plan: Plan) -> str:
    ctx = Context(plan)
    return dashboard_json(ctx, bool(balancer_objects(ctx)))


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_every_stack_conforms_to_its_release(plans: dict[str, Plan], stack: str) -> None:
    plan = plans[stack]
    assert conformance.plan_violations(plan, _dashboard(plan)) == []


def test_both_supported_releases_have_rows_and_surfaces() -> None:
    assert {"0.11.0", "0.23.0"} <= set(supported_releases())
    assert set(RELEASES) <= set(supported_releases())


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_release_rows_name_only_what_the_surface_has(version: str) -> None:
    """Every connector, module path, env switch and config key of a rule row exists in its release."""
    row, surface = RELEASES[version], load_surface(version)
    for conn in row.connectors.values():
        assert surface.kv_connectors.get(conn.kv_connector) == conn.module_path
        assert conn.module_path in surface.connector_modules
    for env in row.env_switches.values():
        assert env in surface.env_vars, env
    if row.llmdd_rpc_port_env:
        assert row.llmdd_rpc_port_env in surface.env_vars
    for path in row.config_keys.values():
        *section, key = path.split(".")
        assert key in surface.additional_config.get(section[0] if section else "", frozenset()), path
        if section:
            assert section[0] in surface.additional_config[""], path
    if row.eplb_policies:
        assert set(surface.eplb_policies) >= set(row.eplb_policies.values())
    for name in METRICS.values():
        assert name in surface.metrics, (version, name)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_metric_names_read_by_proxy_checks_balancer_exist(version: str) -> None:
    surface = load_surface(version)
    names: set[str] = set()
    for folder in METRIC_READERS:
        for path in (ROOT / folder).rglob("*.py"):
            names |= conformance.metric_names_in(path.read_text())
    names -= {"vllm"}
    assert names, "no metric names found: the scan is broken"
    # the smoke check's KV handover item reads connector counters that older releases do not export; there
    # it fails saying the engine exports no such counter (tests/checks: ..._fails_when_decode_exports_no_counters)
    optional = set(METRICS_READ) - surface.exposed_metric_names() if version != "0.23.0" else set()
    assert conformance.metric_violations(names - optional, surface, "runtime readers") == []


@pytest.mark.parametrize("version", ["0.11.0", "0.23.0"])
def test_0_11_and_0_23_plans_conform(edited_plan, version: str) -> None:
    def edit(cfg):
        cfg["engine"]["vllm_ascend_version"] = version
        if version == "0.11.0":
            for role in ("prefill", "decode"):
                cfg[role].pop("eplb", None)
                cfg[role].pop("modules", None)  # finegrained_tp_config is 0.23-only (planner/modules.py)
                cfg[role]["max_num_batched_tokens"] = max(cfg[role]["max_num_batched_tokens"], 256)

    plan = edited_plan("a2-staging", edit)
    assert conformance.plan_violations(plan, _dashboard(plan)) == []


# -- mutations: each must be caught -------------------------------------------------------------------------------


def test_misspelt_flag_is_caught(plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plans["a2-staging"]
    original = engine_args.engine_command
    monkeypatch.setattr(engine_args, "engine_command", lambda p, r: original(p, r) + ["--max-num-seq", "8"])
    found = conformance.plan_violations(plan)
    assert found and all("--max-num-seq " in v for v in found)


def test_flag_of_another_release_is_caught(plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch) -> None:
    """--api-server-count exists in 0.23 but the mutation renders a flag removed before 0.23 (V0 engine)."""
    plan = plans["a2-staging"]
    surface_011, surface_023 = load_surface("0.11.0"), load_surface("0.23.0")
    only_011 = sorted(surface_011.serve_flags - surface_023.serve_flags)
    assert only_011, "no flag of 0.11 is gone in 0.23"
    original = engine_args.engine_command
    monkeypatch.setattr(engine_args, "engine_command", lambda p, r: original(p, r) + [only_011[0]])
    assert conformance.plan_violations(plan)


def test_unknown_additional_config_key_is_caught(plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plans["cm384-prod"]
    original = engine_args.additional_config

    def mutated(p, inst):
        extra = original(p, inst)
        extra["enable_weight_nz_layout"] = True  # documented in the 0.23 large-EP guide, not read by its code
        extra.setdefault("eplb_config", {})["num_redundant_expert"] = 1
        return extra

    monkeypatch.setattr(engine_args, "additional_config", mutated)
    found = "\n".join(conformance.plan_violations(plan))
    assert "enable_weight_nz_layout" in found and "eplb_config.num_redundant_expert" in found


def test_connector_module_of_another_release_is_caught(plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plans["a2-staging"]
    original = engine_args.kv_transfer_config

    def mutated(p, rank):
        cfg = original(p, rank)
        cfg["kv_connector_module_path"] = "vllm_ascend.distributed.mooncake_connector"  # the 0.11 path
        return cfg

    monkeypatch.setattr(engine_args, "kv_transfer_config", mutated)
    assert any("kv_connector_module_path" in v for v in conformance.plan_violations(plan))


@pytest.mark.parametrize("release", ["0.23.0", "0.11.0"])
def test_registry_name_with_its_own_module_path_is_refused(release: str) -> None:
    """vLLM 0.23.0 takes the class named kv_connector from an explicit module path before its registry
    (factory.py get_connector_class); the Mooncake module defines MooncakeConnector, not the registry name
    MooncakeConnectorV1, so that pair stops the engine. The registered name alone passes."""
    surface = load_surface(release)
    module = surface.kv_connectors["MooncakeConnectorV1"]
    assert surface.kv_connector_classes["MooncakeConnectorV1"] == "MooncakeConnector"
    bad = {"kv_connector": "MooncakeConnectorV1", "kv_connector_module_path": module}
    found = conformance.kv_transfer_violations(bad, surface, "rank")
    assert len(found) == 1 and "defines 'MooncakeConnector'" in found[0] and "drop kv_connector_module_path" in found[0]
    assert conformance.kv_transfer_violations({"kv_connector": "MooncakeConnectorV1"}, surface, "rank") == []


def test_misspelt_env_is_caught(plans: dict[str, Plan]) -> None:
    plan = plans["a2-staging"]
    cfg = json.loads(json.dumps(plan.config))
    cfg["engine"]["extra_env"] = {"VLLM_ASCEND_ENABLE_MLAP0": "1"}
    mutated = dataclasses.replace(plan, config=cfg)
    assert any("VLLM_ASCEND_ENABLE_MLAP0" in v for v in conformance.plan_violations(mutated))


def test_metric_of_another_release_is_caught(plans: dict[str, Plan]) -> None:
    plan = plans["a2-staging"]
    dash = _dashboard(plan).replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert any("gpu_cache_usage_perc" in v for v in conformance.plan_violations(plan, dash))


# -- JSON options, deprecated spellings and flags the release resets -------------------------------------------------


def _mutated_json(monkeypatch: pytest.MonkeyPatch, name: str, edit) -> None:
    original = getattr(engine_args, name)

    def mutated(p, x):
        value = original(p, x)
        edit(value)
        return value

    monkeypatch.setattr(engine_args, name, mutated)


def test_deprecated_mtp_spelling_is_caught(plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.23 rewrites "deepseek_mtp" to "mtp" with a warning (vllm/config/speculative.py); 0.11 keeps it."""
    plan = plans["a2-staging"]
    assert RELEASES["0.23.0"].mtp_method == "mtp" and RELEASES["0.11.0"].mtp_method == "deepseek_mtp"
    assert load_surface("0.23.0").speculative_method_rewrites["deepseek_mtp"] == "mtp"
    assert "deepseek_mtp" not in load_surface("0.11.0").speculative_method_rewrites  # vllm_ascend patches it out
    monkeypatch.setattr(engine_args, "engine_release", lambda p: dataclasses.replace(
        RELEASES[p.vllm_ascend_version], mtp_method="deepseek_mtp"))
    found = conformance.plan_violations(plan)
    assert found and all("'deepseek_mtp' is deprecated" in v for v in found), found[:2]


def test_unknown_keys_of_json_options_are_caught(plans: dict[str, Plan], monkeypatch: pytest.MonkeyPatch) -> None:
    """KVTransferConfig / CompilationConfig forbid extra keys (vllm/config/utils.py config: extra="forbid")."""
    plan = plans["a2-staging"]
    _mutated_json(monkeypatch, "kv_transfer_config", lambda c: c.update(kv_connector_extra_confg={}))
    _mutated_json(monkeypatch, "compilation_config", lambda c: c and c.update(cudagraph_mode="FULL_DECODE"))
    found = "\n".join(conformance.plan_violations(plan))
    assert "--kv-transfer-config key 'kv_connector_extra_confg'" in found
    assert "cudagraph_mode 'FULL_DECODE' is not a CUDAGraphMode" in found


def test_every_rendered_json_option_key_is_a_field(plans: dict[str, Plan]) -> None:
    """The check has data to work with: the rendered keys are a non-empty subset of the surface's fields."""
    for plan in plans.values():
        surface = load_surface(plan.vllm_ascend_version)
        for rank in plan.ranks:
            argv = engine_args.engine_command(plan, rank)
            for flag in ("--kv-transfer-config", "--speculative-config", "--compilation-config"):
                if flag in argv:
                    keys = set(json.loads(argv[argv.index(flag) + 1]))
                    assert keys and keys <= surface.json_option_fields[flag], (plan.stack, flag, keys)


def test_micro_batching_is_refused_where_ascend_resets_enable_dbo(plans, with_stage_setting) -> None:
    """vLLM-Ascend 0.23 accepts --enable-dbo and resets it to False (platform.py _fix_incompatible_config).

    The stack rules refuse ``micro_batching`` there first (tests/planner/test_modules.py); this is the
    render-time check behind them, on a Plan that carries the setting anyway."""
    plan = with_stage_setting(plans["a2-staging"], "prefill", "micro_batching", True)
    found = conformance.plan_violations(plan)
    assert found and all("--enable-dbo is ignored by vLLM-Ascend 0.23.0" in v and "micro_batching" in v
                         for v in found), found[:2]
    assert len(found) == len(plan.by_role("prefill")[0].ranks)
