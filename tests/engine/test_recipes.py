"""The rendered engine settings against vLLM-Ascend v0.23.0's own PD deployment recipes.

With ``VLLM_ASCEND_SRC`` naming a checkout of the v0.23.0 tag, the A3 PD recipes of the tag are parsed
(docs/source/tutorials/models/DeepSeek-V3.1.md "run_dp_template.sh script(A3)",
docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md "Non-layerwise"): every env var,
``vllm serve`` flag, ``--additional-config`` key and ``--kv-transfer-config`` key where a rank of the kit's
stacks differs from the recipe of its role must have a row in the table "Against the vLLM-Ascend v0.23.0
recipes" of docs/rendering.md. A recipe env var that 0.23 reads as an ``--additional-config`` key
(ascend_config.py ``_get_config_value``) counts as the same setting. The parser itself is tested on a
synthetic recipe, so this file checks something without the sources too.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from ascend_runtime.engine.surface import load_surface
from ascend_runtime.planner import Plan
from ascend_runtime.render.engine_args import engine_command
from ascend_runtime.render.environment import rank_env

ROOT = Path(__file__).resolve().parents[2]
VLLM_ASCEND_SRC = Path(os.environ.get("VLLM_ASCEND_SRC", "/nonexistent"))
needs_src = pytest.mark.skipif(not (VLLM_ASCEND_SRC / "docs" / "source" / "tutorials").is_dir(),
                               reason="VLLM_ASCEND_SRC does not point at a vllm-ascend v0.23.0 checkout")
#: (recipe file, first line of its A3 PD section, first line after it).
RECIPES = (
    ("docs/source/tutorials/models/DeepSeek-V3.1.md", "`run_dp_template.sh` script(A3)",
     "`run_dp_template.sh` script(Ascend 950DT)"),
    ("docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md", "#### Non-layerwise",
     "### Start the service"),
)
#: Labels, not engine settings.
LABELS = {"--served-model-name"}
JSON_FLAGS = ("--additional-config", "--kv-transfer-config", "--speculative-config", "--compilation-config")
DOC = ROOT / "docs" / "rendering.md"
TABLE_HEADING = "## Against the vLLM-Ascend v0.23.0 recipes"

Launch = tuple[dict[str, str], dict[str, Any]]


def parse_launch(text: str) -> Launch:
    """``({VAR: value}, {--flag: value | True})`` of one node's script in a recipe (markdown removed).

    ``--x_y`` is read as ``--x-y`` (argparse accepts both); JSON-valued flags are parsed.
    """
    lines = [ln for ln in text.splitlines() if not re.match(r"\s*(```|:::|#)", ln)]
    env: dict[str, str] = {}
    for ln in lines:
        m = re.match(r"\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$", ln)
        if m:
            words = shlex.split(m.group(2)) or [""]
            env[m.group(1)] = words[0]
    body = "\n".join(lines)
    start = body.find("vllm serve")
    if start < 0:
        raise AssertionError("no `vllm serve` in a recipe node: the recipe format changed")
    words = shlex.split(body[start:].replace("\\\n", " "))[3:]  # vllm serve MODEL
    flags: dict[str, Any] = {}
    i = 0
    while i < len(words):
        flag = words[i]
        if not flag.startswith("--"):
            raise AssertionError(f"stray word {flag!r} in a recipe command line: the recipe format changed")
        flag = "--" + flag[2:].replace("_", "-")
        if i + 1 < len(words) and not words[i + 1].startswith("--"):
            value: Any = words[i + 1]
            flags[flag] = json.loads(value) if flag in JSON_FLAGS else value
            i += 2
        else:
            flags[flag] = True
            i += 1
    return env, flags


def recipe_nodes(src: Path) -> list[tuple[str, str, Launch]]:
    """``(file, role, launch)`` of every node script of the A3 PD recipes."""
    out = []
    for name, begin, end in RECIPES:
        text = (src / name).read_text()
        first = text.index(begin)
        section = text[first:text.rfind("\n", 0, text.index(end, first))]  # up to the line naming the next part
        for item in re.split(r"^\s*::::\{tab-item\}.*$", section, flags=re.M)[1:]:
            env, flags = parse_launch(item)
            role = {"kv_producer": "prefill", "kv_consumer": "decode"}[flags["--kv-transfer-config"]["kv_role"]]
            out.append((name, role, (env, flags)))
    assert {r for _, r, _ in out} == {"prefill", "decode"}, "the A3 recipes lost a role"
    return out


def ours(plan: Plan, role: str) -> Launch:
    rank = plan.by_role(role)[0].ranks[0]
    _, flags = parse_launch("vllm serve " + shlex.join(engine_command(plan, rank)[2:]))
    return rank_env(plan, rank), flags


def env_config_keys(src: Path) -> dict[str, str]:
    """Env var -> ``--additional-config`` key, from ``_get_config_value(additional_config, "key", "ENV", ...)``."""
    mod = ast.parse((src / "vllm_ascend" / "ascend_config.py").read_text())
    pairs = {}
    for node in ast.walk(mod):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "_get_config_value" and len(node.args) >= 3):
            key, env = node.args[1], node.args[2]
            if isinstance(key, ast.Constant) and isinstance(env, ast.Constant):
                pairs[env.value] = key.value
    assert {"VLLM_ASCEND_ENABLE_MLAPO", "VLLM_ASCEND_ENABLE_FLASHCOMM1"} <= set(pairs)
    return pairs


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and a.startswith("$"):
        return True  # a per-node value of the recipe (its script's positional argument or a shell variable)
    return str(a).lower() in {"1", "true"} if isinstance(b, bool) else str(a) == str(b)


def differences(recipe: Launch, kit: Launch, env_keys: dict[str, str], rewrites: dict[str, str]) -> set[str]:
    """Names of the settings where the kit's launch differs from the recipe's."""
    (r_env, r_flags), (k_env, k_flags) = recipe, kit
    k_extra = k_flags.get("--additional-config", {})
    r_extra = dict(r_flags.get("--additional-config", {}))
    for var, key in env_keys.items():  # a recipe env var 0.23 reads as an additional-config key
        if var in r_env and var not in k_env and key not in r_extra:
            r_extra[key] = r_env.pop(var)
    out = set()
    for name in set(r_env) | set(k_env):
        if name not in r_env or name not in k_env or not _same(r_env[name], k_env[name]):
            out.add(name)
    for flag in (set(r_flags) | set(k_flags)) - LABELS - set(JSON_FLAGS):
        if flag not in r_flags or flag not in k_flags or not _same(r_flags[flag], k_flags[flag]):
            out.add(flag)
    for key in set(r_extra) | set(k_extra):
        if key not in r_extra or key not in k_extra or not _same(r_extra[key], k_extra[key]):
            out.add(key)
    r_kv, k_kv = r_flags["--kv-transfer-config"], k_flags["--kv-transfer-config"]
    assert (r_kv["kv_connector"], r_kv["kv_role"]) == (k_kv["kv_connector"], k_kv["kv_role"])
    assert r_kv["kv_connector_extra_config"].keys() == k_kv["kv_connector_extra_config"].keys()
    for key in (set(r_kv) | set(k_kv)) - {"kv_connector", "kv_role", "kv_connector_extra_config"}:
        if key not in r_kv or key not in k_kv or r_kv[key] != k_kv[key]:
            out.add(key)
    for flag in ("--speculative-config", "--compilation-config"):
        r, k = dict(r_flags.get(flag) or {}), dict(k_flags.get(flag) or {})
        if "method" in r:
            r["method"] = rewrites.get(r["method"], r["method"])  # vLLM 0.23 rewrites deepseek_mtp to mtp
        if r != k:
            out.add(flag)
    return out


def documented() -> set[str]:
    """Setting names (backticked) in the first column of the recipe table of docs/rendering.md."""
    text = DOC.read_text()
    assert TABLE_HEADING in text, f"docs/rendering.md lost the section {TABLE_HEADING!r}"
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith(("| setting", "|---")):
            names |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


SYNTHETIC = """
::::{tab-item} Decoder node
```shell
# a comment
export HCCL_BUFFSIZE=600
export HCCL_IF_IP=$local_ip
export VLLM_ASCEND_ENABLE_MLAPO=1
vllm serve /weights/x \\
  --data-parallel-rank $4 \\
  --max-num-batched-tokens 256 \\
  --no-enable-prefix-caching \\
  --speculative-config '{"num_speculative_tokens": 1, "method":"deepseek_mtp"}' \\
  --additional_config '{"recompute_scheduler_enable":true}' \\
  --kv-transfer-config \\
  '{"kv_connector": "MooncakeConnectorV1",
  "kv_role": "kv_consumer",
  "kv_port": "36200",
  "kv_connector_extra_config": {"prefill": {"dp_size": 2, "tp_size": 8}, "decode": {"dp_size": 32, "tp_size": 1}}
  }'
::::
"""


def test_recipe_parser_and_difference_rules() -> None:
    env, flags = parse_launch(SYNTHETIC)
    assert env == {"HCCL_BUFFSIZE": "600", "HCCL_IF_IP": "$local_ip", "VLLM_ASCEND_ENABLE_MLAPO": "1"}
    assert flags["--max-num-batched-tokens"] == "256" and flags["--no-enable-prefix-caching"] is True
    assert flags["--additional-config"] == {"recompute_scheduler_enable": True}
    assert flags["--kv-transfer-config"]["kv_port"] == "36200"
    kit_env = {"HCCL_BUFFSIZE": "1024", "HCCL_IF_IP": "192.0.2.1"}
    kit_flags = {
        "--max-num-batched-tokens": "256", "--speculative-config": {"method": "mtp", "num_speculative_tokens": 1},
        "--additional-config": {"recompute_scheduler_enable": True, "enable_mlapo": True},
        "--kv-transfer-config": {**flags["--kv-transfer-config"], "kv_port": "36200", "engine_id": "x-0"},
    }
    got = differences((env, flags), (kit_env, kit_flags), {"VLLM_ASCEND_ENABLE_MLAPO": "enable_mlapo"},
                      {"deepseek_mtp": "mtp"})
    # HCCL_IF_IP is per node, MLAPO is the same setting by env and by key, the MTP spelling is rewritten
    assert got == {"HCCL_BUFFSIZE", "--data-parallel-rank", "--no-enable-prefix-caching", "engine_id"}
    with pytest.raises(AssertionError, match="stray word"):
        parse_launch("vllm serve /w --seed 1 2")


def test_recipe_table_rows_name_settings() -> None:
    names = documented()
    assert {"HCCL_CONNECT_TIMEOUT", "--no-enable-prefix-caching", "VLLM_ENGINE_READY_TIMEOUT_S"} <= names


@needs_src
@pytest.mark.parametrize("stack", ("cm384-prod", "a2-staging"))
def test_every_difference_from_the_a3_pd_recipes_is_documented(plans: dict[str, Plan], stack: str) -> None:
    plan = plans[stack]
    env_keys = env_config_keys(VLLM_ASCEND_SRC)
    rewrites = dict(load_surface(plan.vllm_ascend_version).speculative_method_rewrites)
    table = documented()
    missing: dict[str, set[str]] = {}
    for name, role, recipe in recipe_nodes(VLLM_ASCEND_SRC):
        for setting in differences(recipe, ours(plan, role), env_keys, rewrites) - table:
            missing.setdefault(setting, set()).add(f"{role} ({Path(name).name})")
    assert not missing, ("settings that differ from the v0.23.0 recipes without a row in docs/rendering.md "
                         f"{TABLE_HEADING!r}: {missing}")
