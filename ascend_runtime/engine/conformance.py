"""Does everything the kit renders for a Plan exist in the release it targets?

:func:`plan_violations` walks the engine command line of every rank (flags,
``--additional-config`` keys at every level, the KV connector name and module
path), every rank's environment, and every engine metric the kit reads (the
rendered Grafana dashboard and the names in :data:`ascend_runtime.engine.releases.METRICS`),
and checks each against the release's surface, extracted from its released
sources. ``render`` and the Pulumi program refuse a Plan with violations; the
conformance tests run it for every stack.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from ascend_runtime.engine.releases import METRICS, RELEASES
from ascend_runtime.engine.surface import EngineSurface, load_surface
from ascend_runtime.planner.plan import Plan

METRIC_NAME = re.compile(r"vllm:[a-z_:]+")
JSON_FLAGS = ("--additional-config", "--kv-transfer-config", "--speculative-config", "--compilation-config")


def flag_violations(argv: list[str], surface: EngineSurface, where: str,
                    ignored: Mapping[str, str] | None = None) -> list[str]:
    """Every ``--flag`` of an argv that ``vllm serve`` of the release does not accept, or accepts and resets.

    ``ignored``: flag -> why the release resets it on Ascend (``EngineRelease.ignored_flags``).
    """
    out = []
    for word in argv[2:]:
        if word.startswith("--"):
            flag = word.split("=", 1)[0]
            if not surface.has_flag(flag):
                out.append(f"{where}: flag {flag} is not accepted by vllm serve of vLLM {surface.vllm_version}")
            elif ignored and flag in ignored:
                out.append(f"{where}: flag {flag} is ignored by vLLM-Ascend {surface.release}: {ignored[flag]}")
    return out


def json_option_violations(flag: str, config: Mapping[str, Any], surface: EngineSurface, where: str) -> list[str]:
    """Keys of a JSON-valued option its vLLM config class lacks (the class forbids extra keys), bad enum values.

    ``--speculative-config`` ``method`` must be a value the release accepts and not a deprecated spelling it
    rewrites; ``--compilation-config`` ``cudagraph_mode`` must name a ``CUDAGraphMode`` member.
    """
    out = []
    fields = surface.json_option_fields.get(flag)
    if fields is not None:
        out += [f"{where}: {flag} key {key!r} is not a field of vLLM {surface.vllm_version}'s config for it"
                for key in config if key not in fields]
    if flag == "--speculative-config" and "method" in config:
        method = config["method"]
        if method not in surface.speculative_methods:
            out.append(f"{where}: {flag} method {method!r} is not accepted by vLLM {surface.vllm_version}")
        elif method in surface.speculative_method_rewrites:
            out.append(f"{where}: {flag} method {method!r} is deprecated in vLLM {surface.vllm_version} (rewritten "
                       f"to {surface.speculative_method_rewrites[method]!r}); render the new name")
    if flag == "--compilation-config" and "cudagraph_mode" in config:
        mode = config["cudagraph_mode"]
        if mode not in surface.cudagraph_modes:
            out.append(f"{where}: {flag} cudagraph_mode {mode!r} is not a CUDAGraphMode of vLLM {surface.vllm_version}")
    return out


def additional_config_violations(config: Mapping[str, Any], surface: EngineSurface, where: str) -> list[str]:
    """Keys of ``--additional-config`` the release does not read (top level and one section level)."""
    out = []
    top = surface.additional_config.get("", frozenset())
    for key, value in config.items():
        if key not in top:
            out.append(f"{where}: --additional-config key {key!r} is not read by vLLM-Ascend {surface.release}")
            continue
        if isinstance(value, dict):
            section = surface.additional_config.get(key)
            if section is None:
                out.append(f"{where}: --additional-config {key!r} is not a section in vLLM-Ascend {surface.release}")
                continue
            for sub in value:
                if sub not in section:
                    out.append(
                        f"{where}: --additional-config key {key}.{sub} is not read by vLLM-Ascend {surface.release}"
                    )
    return out


def kv_transfer_violations(config: Mapping[str, Any], surface: EngineSurface, where: str) -> list[str]:
    """The connector is registered in the release, and a ``kv_connector_module_path``, if given, loads it.

    vLLM 0.23.0 (vllm/distributed/kv_transfer/kv_connector/factory.py ``get_connector_class``) tries an
    external module path *before* its registry: it imports the module and takes the attribute named
    ``kv_connector`` from it, raising ``AttributeError`` when there is none. vLLM-Ascend registers
    ``MooncakeConnectorV1`` for the class ``MooncakeConnector``
    (vllm_ascend/distributed/kv_transfer/__init__.py, v0.23.0), so the registry name next to its own module
    path stops every rank while its config is built. (vLLM 0.11.0's factory reads the registry first, so
    the path is ignored there; the rule holds for both.) The kit renders no module path: the release's
    ``vllm.general_plugins`` entry point registers the name in every process.
    """
    out = []
    name = config.get("kv_connector")
    module = config.get("kv_connector_module_path")
    if name not in surface.kv_connectors:
        out.append(f"{where}: KV connector {name!r} is not registered in vLLM-Ascend {surface.release}")
    elif module is not None and module != surface.kv_connectors[name]:
        out.append(
            f"{where}: kv_connector_module_path {module!r} is not where vLLM-Ascend {surface.release} "
            f"registers {name} ({surface.kv_connectors[name]})"
        )
    elif module is not None and surface.kv_connector_classes.get(name, name) != name:
        out.append(
            f"{where}: with kv_connector_module_path, vLLM {surface.vllm_version} loads the class named "
            f"{name!r} from {module}, which defines {surface.kv_connector_classes[name]!r}: the rank would stop "
            f"at start-up; drop kv_connector_module_path (the registry name is enough)"
        )
    if module is not None and module not in surface.connector_modules:
        out.append(f"{where}: module {module!r} does not exist in vLLM-Ascend {surface.release}")
    return out


def command_violations(argv: list[str], surface: EngineSurface, where: str,
                       ignored: Mapping[str, str] | None = None) -> list[str]:
    """Flags, additional-config keys, the KV connector and the JSON options' keys of one engine command line."""
    out = flag_violations(argv, surface, where, ignored)
    for flag in JSON_FLAGS:
        if flag in argv:
            value = json.loads(argv[argv.index(flag) + 1])
            if flag == "--additional-config":
                out += additional_config_violations(value, surface, where)
                continue
            if flag == "--kv-transfer-config":
                out += kv_transfer_violations(value, surface, where)
            out += json_option_violations(flag, value, surface, where)
    return out


def env_violations(env: Mapping[str, str], surface: EngineSurface, runtime_env: Iterable[str], where: str) -> list[str]:
    """Variables neither the release nor the runtime (CANN, torch_npu) reads."""
    known = set(runtime_env)
    return [
        f"{where}: env {name} is not read by vLLM {surface.vllm_version} / vLLM-Ascend {surface.release}"
        for name in env
        if name not in known and name not in surface.env_vars
    ]


def metric_violations(names: Iterable[str], surface: EngineSurface, where: str) -> list[str]:
    """Metric names (as exposed: with _total/_bucket/...) the release does not export."""
    exposed = surface.exposed_metric_names()
    return [
        f"{where}: metric {name} is not exported by vLLM {surface.vllm_version}"
        for name in sorted(set(names))
        if name not in exposed
    ]


def metric_names_in(text: str) -> set[str]:
    """Every ``vllm:...`` name in a text (dashboard JSON, source)."""
    return {m.rstrip(":") for m in METRIC_NAME.findall(text)}


def plan_violations(plan: Plan, dashboard: str | None = None) -> list[str]:
    """Every rendered engine setting or metric of a Plan that its release does not have."""
    from ascend_runtime.render.engine_args import engine_command
    from ascend_runtime.render.environment import RUNTIME_ENV, rank_env

    surface = load_surface(plan.vllm_ascend_version)
    out: list[str] = []
    row = RELEASES.get(plan.vllm_ascend_version)
    ignored = row.ignored_flags if row is not None else None
    for rank in plan.ranks:
        out += command_violations(engine_command(plan, rank), surface, rank.name, ignored)
        out += env_violations(rank_env(plan, rank), surface, RUNTIME_ENV, rank.name)
    base = set(METRICS.values())
    missing = sorted(base - set(surface.metrics))
    out += [f"kit metrics: {name} is not registered by vLLM {surface.vllm_version}" for name in missing]
    if dashboard is not None:
        out += metric_violations(metric_names_in(dashboard), surface, "grafana dashboard")
    return out


def require_conformance(plan: Plan, dashboard: str | None = None) -> None:
    """Raise ConfigError listing every violation; called before anything is written or registered."""
    from ascend_runtime.config.errors import ConfigError, Problem

    found = plan_violations(plan, dashboard)
    if found:
        raise ConfigError(
            [Problem("engine", v, hint="check engine.extra_args / engine.extra_env, or report a kit bug") for v in found],
            f"conformance with vLLM-Ascend {plan.vllm_ascend_version}",
        )
