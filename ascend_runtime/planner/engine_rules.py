"""Checks of a stack against the engine release it targets (rules no surface shows).

Each rule names the upstream file it comes from (see
:mod:`ascend_runtime.engine.releases`); a violation is a :class:`Problem`
naming the stack key to change, so the engine never starts with a setting that
the released code would crash on, silently ignore, or degrade under.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from ascend_runtime.config.errors import Problem
from ascend_runtime.config.stack import Role, StackConfig
from ascend_runtime.engine.releases import (
    ACLGRAPH_MAX_CAPTURE,
    IMAGE_REPOSITORY,
    IMAGE_SUFFIX,
    EngineRelease,
    decode_graph_tokens,
)
from ascend_runtime.engine.surface import load_surface

ROLES: tuple[Role, Role] = ("prefill", "decode")
def runs_micro_batching(row: EngineRelease) -> bool:
    """Whether the release runs vLLM's two-micro-batch overlap (``--enable-dbo``) rather than resetting it on
    Ascend (``EngineRelease.ignored_flags``: vllm_ascend/platform.py ``_fix_incompatible_config``, v0.23.0)."""
    return "--enable-dbo" not in row.ignored_flags


MTP_SPEC_TOKENS = 1  # the kit renders the MTP method (EngineRelease.mtp_method) with one speculative token


def graph_mode_on(config: StackConfig, role: Role) -> bool:
    """Graph mode of a stage: the stage's setting, else on for decode and off for prefill."""
    explicit = config.stage(role).graph_mode
    return role == "decode" if explicit is None else explicit


def check_image(config: StackConfig, row: EngineRelease) -> list[Problem]:
    """An explicit image of the project's repository matches the release and the hardware's CANN base.

    The plain tag is built on the 910B CANN image, ``-a3`` on the A3 one (Dockerfile / Dockerfile.a3; the
    suffix in .github/workflows/image_a3_ubuntu.yml at v0.11.0, schedule_image_build_and_push.yaml at v0.23.0).
    """
    image = config.engine.image
    if not image:
        return []
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return [Problem("engine.image", "needs an explicit tag", image, "write it as <repository>:<tag>")]
    suffix = IMAGE_SUFFIX[config.hardware]
    problems: list[Problem] = []
    if suffix and not tag.endswith(suffix):
        problems.append(
            Problem("engine.image", f"{config.hardware} (910C) needs the {suffix} image; the plain tag is built for 910B",
                    image, f"use {name}:v{row.version}{suffix} or leave engine.image unset")
        )
    if not suffix and tag.endswith("-a3"):
        problems.append(
            Problem("engine.image", f"{config.hardware} (910B) cannot run the A3 image", image,
                    f"use {name}:v{row.version} or leave engine.image unset")
        )
    if name == IMAGE_REPOSITORY and not tag.startswith(f"v{row.version}"):
        problems.append(
            Problem("engine.image", f"tag does not match engine.vllm_ascend_version {row.version}", image,
                    f"use {IMAGE_REPOSITORY}:v{row.version}{suffix}")
        )
    return problems


def check_graphs(config: StackConfig, row: EngineRelease) -> list[Problem]:
    """The decode graph fits the token budget (:func:`ascend_runtime.engine.releases.decode_graph_tokens`)."""
    problems: list[Problem] = []
    for role in ROLES:
        stage = config.stage(role)
        if not graph_mode_on(config, role):
            continue
        spec = MTP_SPEC_TOKENS if stage.mtp else 0
        need = decode_graph_tokens(row.version, stage.max_num_seqs, spec, role == "decode", config.hardware, stage.tp)
        if stage.max_num_batched_tokens < need.tokens:
            problems.append(
                Problem(
                    f"{role}.max_num_batched_tokens",
                    f"the graph of max_num_seqs {stage.max_num_seqs} sequences"
                    + (f" (padded to {need.seqs_after_padding})" if need.seqs_after_padding != stage.max_num_seqs else "")
                    + f" x {1 + spec} tokens needs {need.tokens} tokens per step on vLLM-Ascend {row.version} "
                    f"({need.source})",
                    stage.max_num_batched_tokens,
                    f"set it to {need.tokens} or more (or lower max_num_seqs)",
                )
            )
        if row.graph == "aclgraph" and need.tokens > ACLGRAPH_MAX_CAPTURE and not stage.graph_capture_sizes:
            problems.append(
                Problem(
                    f"{role}.max_num_seqs",
                    f"{stage.max_num_seqs} x {1 + spec} = {need.tokens} decode tokens exceed the largest default graph "
                    f"({ACLGRAPH_MAX_CAPTURE}, vllm_ascend/platform.py v{row.version}); steps would run eager",
                    stage.max_num_seqs,
                    f"at most {ACLGRAPH_MAX_CAPTURE // (1 + spec)} sequences, or list graph_capture_sizes",
                )
            )
        sizes = stage.graph_capture_sizes
        if sizes:
            over = [s for s in sizes if s > stage.max_num_batched_tokens or s < 1]
            if over:
                problems.append(
                    Problem(f"{role}.graph_capture_sizes", "sizes must be 1..max_num_batched_tokens", over)
                )
            elif role == "decode" and max(sizes) < need.tokens:
                problems.append(
                    Problem(f"{role}.graph_capture_sizes", f"the largest size must hold a full decode step ({need.tokens} tokens)",
                            max(sizes), f"add {need.tokens}")
                )
    return problems


def check_experts(config: StackConfig, row: EngineRelease) -> list[Problem]:
    """Redundant experts reach the engine in the form the release reads; EPLB only where it can run.

    0.23.0: ``eplb_config.num_redundant_experts`` counts only when ``dynamic_eplb`` is on or a map is
    loaded (vllm_ascend/eplb/core/eplb_utils.py ``init_eplb_config``); EPLB needs expert parallelism
    (same function: ``assert not eplb_enable`` when ep_size == 1). 0.11.0: ``init_redundancy_expert``
    adds slots with or without dynamic EPLB (ops/common_fused_moe.py).
    """
    problems: list[Problem] = []
    for role in ROLES:
        stage = config.stage(role)
        if stage.eplb is not None and stage.ep == 1:
            problems.append(Problem(f"{role}.eplb", "expert balancing needs expert parallelism (ep > 1)",
                                    hint=f"set {role}.ep or remove {role}.eplb"))
        if stage.redundant_experts and row.redundancy == "eplb_config" and stage.eplb is None:
            problems.append(
                Problem(
                    f"{role}.eplb",
                    f"vLLM-Ascend {row.version} places redundant experts only under in-engine EPLB "
                    f"({row.sources['redundancy']}); {stage.redundant_experts} redundant experts would never be used",
                    hint=f"add {role}.eplb: {{mode: dynamic}} or set {role}.redundant_experts to 0",
                )
            )
        if stage.eplb is not None and stage.ep > 1:
            problems += _eplb_guide(config, role)
        if stage.eplb is not None and not row.eplb_policies and stage.eplb.policy != "default":
            problems.append(Problem(f"{role}.eplb.policy", f"vLLM-Ascend {row.version} has no selectable EPLB policy",
                                    stage.eplb.policy, "use default"))
    return problems


#: Where the EPLB guide (docs/source/user_guide/feature_guide/expert_parallelism_load_balancer.md, v0.23.0,
#: "Usage Recommendations") says EPLB costs more than it gains: prefill with prompts under 1024 tokens, decode
#: with 8 or fewer routed experts per die.
EPLB_MIN_PREFILL_PROMPT = 1024
EPLB_MAX_DECODE_EXPERTS_PER_DIE = 8


def _eplb_guide(config: StackConfig, role: Role) -> list[Problem]:
    """Refuse EPLB where the release's guide says it degrades performance (the workload is throughput_check's)."""
    stage = config.stage(role)
    if role == "prefill" and config.throughput_check.input_len < EPLB_MIN_PREFILL_PROMPT:
        return [Problem("prefill.eplb", f"the EPLB guide advises against EPLB on prefill with prompts under "
                        f"{EPLB_MIN_PREFILL_PROMPT} tokens (the stack's workload: throughput_check.input_len "
                        f"{config.throughput_check.input_len})", hint="remove prefill.eplb and its redundant_experts")]
    per_die = config.model.num_routed_experts / stage.ep
    if role == "decode" and per_die <= EPLB_MAX_DECODE_EXPERTS_PER_DIE:
        return [Problem("decode.eplb", f"the EPLB guide advises against EPLB on decode with {per_die:g} routed experts "
                        f"per die (<= {EPLB_MAX_DECODE_EXPERTS_PER_DIE}; ep {stage.ep})",
                        hint="remove decode.eplb and set decode.redundant_experts to 0, or use a smaller ep")]
    return []


def check_options(config: StackConfig, row: EngineRelease) -> list[Problem]:
    """Per-stage engine options exist in the release and apply to the stage's role."""
    problems: list[Problem] = []
    surface = load_surface(row.version)
    for i, arg in enumerate(config.engine.extra_args):
        if arg.startswith("--") and not surface.has_flag(arg):
            problems.append(
                Problem(f"engine.extra_args[{i}]", f"vllm serve of vLLM {row.vllm} has no such flag", arg[:60],
                        "check the spelling against `vllm serve --help` of that release")
            )
    for role in ROLES:
        stage = config.stage(role)
        if stage.recompute_scheduler and role == "prefill":
            problems.append(
                Problem("prefill.recompute_scheduler",
                        "the recompute scheduler runs on KV consumers (decode) only (vllm_ascend/ascend_config.py "
                        f"recompute_scheduler_enable, v{row.version})", True, "remove it from prefill")
            )
        if stage.recompute_scheduler and "recompute_scheduler" not in row.config_keys:
            problems.append(Problem(f"{role}.recompute_scheduler", f"vLLM-Ascend {row.version} has no recompute scheduler", True))
        if stage.micro_batching and not surface.has_flag("--enable-dbo"):
            problems.append(Problem(f"{role}.micro_batching", f"vLLM {row.vllm} has no --enable-dbo", True))
        elif stage.micro_batching and not runs_micro_batching(row):
            problems.append(Problem(f"{role}.micro_batching", f"vLLM-Ascend {row.version} resets --enable-dbo to False "
                                    f"on Ascend ({row.ignored_flags['--enable-dbo'].split(';')[0]})", True,
                                    f"remove {role}.micro_batching"))
        if stage.api_server_count and not surface.has_flag("--api-server-count"):
            problems.append(Problem(f"{role}.api_server_count", f"vLLM {row.vllm} has no --api-server-count",
                                    stage.api_server_count))
        if stage.graph_capture_sizes and row.graph == "torchair" and role == "decode" and stage.mtp:
            problems.append(
                Problem(f"{role}.graph_capture_sizes",
                        "a KV consumer with MTP on torchair captures only max_num_seqs "
                        "(torchair_model_runner.py update_torchair_graph_batch_sizes, v0.11.0)",
                        stage.graph_capture_sizes, "remove it")
            )
    return problems


#: vLLM-Ascend's balance scheduling switch: the ``--additional-config`` key, and the deprecated variable it
#: falls back to when the key is absent (vllm_ascend/ascend_config.py lines 78-83 and ``_get_config_value``
#: lines 354-365, v0.23.0; the variable is ``bool(int(os.getenv(...)))``, vllm_ascend/envs.py line 105).
BALANCE_KEY = "enable_balance_scheduling"
BALANCE_ENV = "VLLM_ASCEND_BALANCE_SCHEDULING"
ADDITIONAL_CONFIG = "--additional-config"


#: Options of ``vllm serve`` the kit renders itself (render/engine_args.py ``engine_command``; a render test keeps
#: the two in step), with vLLM 0.23.0's short aliases (vllm/engine/arg_utils.py ``add_cli_args``,
#: vllm/entrypoints/openai/cli_args.py). ``--additional-config`` is not here: engine.extra_args may add keys to it.
KIT_OPTIONS: frozenset[str] = frozenset({
    "--api-server-count", "-asc", "--compilation-config", "--data-parallel-address", "-dpa",
    "--data-parallel-rpc-port", "-dpp", "--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl",
    "--data-parallel-start-rank", "-dpr", "--enable-dbo", "--enable-expert-parallel", "-ep", "--enforce-eager",
    "--gpu-memory-utilization", "--headless", "--host", "--kv-transfer-config", "--max-model-len",
    "--max-num-batched-tokens", "--max-num-seqs", "--port", "--quantization", "-q", "--seed",
    "--served-model-name", "--speculative-config", "--tensor-parallel-size", "-tp", "--trust-remote-code",
})


def _option_name(arg: str) -> str | None:
    """The option an ``engine.extra_args`` word names, spelt as the kit renders it (None: not an option):
    ``=value`` and ``.key`` dropped, ``_`` read as ``-`` and ``--no-X`` as ``--X`` (vLLM 0.23.0's
    ``FlexibleArgumentParser`` and its boolean ``--no-`` options, vllm/utils/argparse_utils.py)."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None
    name = arg.split("=", 1)[0].split(".", 1)[0]
    if name.startswith("--"):
        name = name.replace("_", "-")
        if name.startswith("--no-"):
            name = "--" + name[5:]
    return name


def check_extra_args_repeat(config: StackConfig) -> list[Problem]:
    """``engine.extra_args`` must not give an option the kit renders: vLLM 0.23.0 keeps the last occurrence (it
    only logs "Found duplicate keys", vllm/utils/argparse_utils.py) and joins dotted forms (``--opt.key v``)
    into one JSON appended after every other argument, so either would silently replace the kit's value
    (for ``--kv-transfer-config``, the PD connection itself)."""
    problems = []
    for i, arg in enumerate(config.engine.extra_args):
        name = _option_name(arg)
        if name in KIT_OPTIONS:
            problems.append(Problem(f"engine.extra_args[{i}]", f"{name} is rendered by the kit from the stack; "
                                    "vLLM keeps the last one given, so this would replace the kit's value", arg[:60],
                                    "remove it and set the stack key that renders it (docs/rendering.md)"))
    return problems


class ExtraConfig(NamedTuple):
    """What ``engine.extra_args`` give ``--additional-config`` (:func:`extra_additional_config`)."""

    values: dict[str, Any]  #: the keys, one nested dict
    rest: list[str]  #: the other words, in order
    problems: list[tuple[int, str]]  #: (word index, message)
    origin: dict[str, int]  #: top-level key -> index of the word whose value set it


def extra_additional_config(args: list[str]) -> ExtraConfig:
    """Split ``engine.extra_args`` into the ``--additional-config`` they give and the other words.

    Forms (vLLM 0.23.0 ``FlexibleArgumentParser``): ``--additional-config JSON`` / ``=JSON`` (a JSON object;
    a later one replaces an earlier one, as vLLM's last-one-wins), and ``--additional-config.a.b VALUE`` /
    ``=VALUE`` (VALUE read as JSON, else as text), merged over the whole-JSON ones. The renderer merges the
    result into the kit's own ``--additional-config`` (render/engine_args.py) instead of passing a second one,
    which vLLM would keep in place of the kit's."""
    whole: dict[str, Any] = {}
    dotted: dict[str, Any] = {}
    whole_at: dict[str, int] = {}
    dotted_at: dict[str, int] = {}
    rest: list[str] = []
    problems: list[tuple[int, str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, inline = arg.partition("=")
        if name.startswith("--"):  # vLLM reads `_` as `-` up to the first `.` only: dotted keys stay as written
            option, dot, keys_text = name.partition(".")
            name = option.replace("_", "-") + dot + keys_text
        if name != ADDITIONAL_CONFIG and not name.startswith(ADDITIONAL_CONFIG + "."):
            rest.append(arg)
            i += 1
            continue
        if eq:
            text, at, i = inline, i, i + 1
        elif i + 1 < len(args):
            text, at, i = args[i + 1], i + 1, i + 2
        else:
            problems.append((i, f"{name} needs a value"))
            break
        if name == ADDITIONAL_CONFIG:
            try:
                value = json.loads(text)
            except ValueError as exc:
                problems.append((at, f"--additional-config is not JSON ({exc})"))
                continue
            if not isinstance(value, dict):
                problems.append((at, "--additional-config must be a JSON object"))
                continue
            whole, whole_at = value, dict.fromkeys(value, at)
            continue
        keys = name.split(".")[1:]
        if not all(keys):
            problems.append((at - (0 if eq else 1), f"{name}: an empty key"))
            continue
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        node = dotted
        for key in keys[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[keys[-1]] = value
        dotted_at[keys[0]] = at
    return ExtraConfig(merge_config(whole, dotted), rest, problems, {**whole_at, **dotted_at})


def merge_config(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``update`` merged in, nested dicts key by key (a new dict; the inputs are not changed)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


def check_extra_additional_config(config: StackConfig) -> list[Problem]:
    """``--additional-config`` in ``engine.extra_args`` is a JSON object (or dotted keys) the renderer can merge."""
    return [Problem(f"engine.extra_args[{i}]", message, hint="give a JSON object, or --additional-config.KEY=VALUE")
            for i, message in extra_additional_config(list(config.engine.extra_args)).problems]


def check_balance_scheduling(config: StackConfig, row: EngineRelease) -> list[Problem]:
    """Balance scheduling stays off: vLLM-Ascend refuses it at start-up unless the engine is PD-mixed
    (``kv_role`` ``kv_both``), and every engine the kit renders is a KV producer or consumer
    (vllm_ascend/platform.py ``check_and_update_config`` lines 677-684, v0.23.0: ValueError
    "enable_balance_scheduling only supports PD-mixed mode"). The ``--additional-config`` key, when
    given, decides; else the variable does (``_get_config_value``), which must also be an integer
    (``int()`` of it is evaluated at start-up whether or not the key is given)."""
    surface = load_surface(row.version)
    if BALANCE_KEY not in surface.additional_config.get("", frozenset()) and BALANCE_ENV not in surface.env_vars:
        return []  # a release without balance scheduling
    why = (f"vLLM-Ascend {row.version} refuses balance scheduling in PD-disaggregated mode at start-up "
           "(vllm_ascend/platform.py check_and_update_config), and every engine of the kit is a KV producer "
           "or consumer")
    problems: list[Problem] = []
    env = config.engine.extra_env.get(BALANCE_ENV)
    env_on = False
    if isinstance(env, dict):
        problems.append(Problem(f"engine.extra_env.{BALANCE_ENV}", "a secret reference hides whether balance "
                                "scheduling is on; " + why, hint=f"remove {BALANCE_ENV} from engine.extra_env"))
    elif env is not None:
        try:
            env_on = bool(int(env))
        except ValueError:
            problems.append(Problem(f"engine.extra_env.{BALANCE_ENV}", "vLLM-Ascend reads it with int() at start-up "
                                    "(vllm_ascend/envs.py) and would stop on this value", env[:60],
                                    f"remove {BALANCE_ENV} from engine.extra_env (or set it to 0)"))
    extra = extra_additional_config(list(config.engine.extra_args))
    given = (extra.origin[BALANCE_KEY], extra.values[BALANCE_KEY]) if BALANCE_KEY in extra.values else None
    if given is not None and given[1]:
        problems.append(Problem(f"engine.extra_args[{given[0]}]", f"--additional-config {BALANCE_KEY} is on; {why}",
                                str(given[1])[:60], f"remove {BALANCE_KEY} from the --additional-config of "
                                "engine.extra_args"))
    elif given is None and env_on:
        problems.append(Problem(f"engine.extra_env.{BALANCE_ENV}", f"turns balance scheduling on; {why}", env,
                                f"remove {BALANCE_ENV} from engine.extra_env"))
    return problems


def recompute_on(config: StackConfig, row: EngineRelease, role: Role) -> bool:
    """The recompute scheduler as rendered: decode only, on unless the stage turns it off, where the release has it."""
    explicit = config.stage(role).recompute_scheduler
    return role == "decode" and "recompute_scheduler" in row.config_keys and explicit is not False


def check_engine(config: StackConfig, row: EngineRelease, connector: str) -> list[Problem]:
    """Every engine rule of the targeted release."""
    from ascend_runtime.planner.modules import check_modules  # noqa: PLC0415  (per-module rules)

    problems = check_image(config, row) + check_graphs(config, row) + check_experts(config, row)
    problems += check_options(config, row) + check_balance_scheduling(config, row)
    problems += check_extra_args_repeat(config) + check_extra_additional_config(config)
    problems += check_modules(config, row.version, {r: graph_mode_on(config, r) for r in ROLES},
                              {r: recompute_on(config, row, r) for r in ROLES})
    return problems
