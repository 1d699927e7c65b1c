"""What the engine judge is given: every rendered launch script's hand-over to the engine, as judge cases.

A case is what one rank's launch script passes to ``vllm serve``: the script, as ``ascend-deploy render`` writes it,
runs under bash with a stand-in ``vllm`` on ``PATH`` that records its argv and environment (the scripts' own
probes of the leader are answered by a stand-in ``timeout``). The environment handed over is what the script
exported: the recorded one less the variables this harness started bash with.

Each case also carries what the judge needs besides the script: the model directory's files (the stack's model
shape as the Hugging Face ``config.json`` of DeepSeek-V3, and ModelSlim's ``quant_model_description.json`` for
W8A8 weights) and the device type of the vLLM-Ascend build the stack's image carries.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from ascend_runtime.config.loader import stacks_dir
from ascend_runtime.engine.releases import IMAGE_SUFFIX
from ascend_runtime.planner import load_plan
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.artifacts import render_artifacts
from ascend_runtime.render.paths import LEADER_WATCH

JUDGE = Path(__file__).with_name("judge.py")
#: the stand-ins for NPU-only software (sitecustomize.py) and the plugin entry points of vLLM-Ascend
STAND_INS = Path(__file__).with_name("site")
#: vLLM-Ascend v0.23.0's sources the judge imports (README.md there)
VENDOR = Path(__file__).parents[1] / "vendor" / "vllm_ascend_0_23_0"

STUB_VLLM = """#!/usr/bin/env bash
printf '%s\\0' "$@" > "$STUB_OUT/argv.$$"
env -0 > "$STUB_OUT/env.$$"
# a DP rank's server stays up a moment: its node script stops every other rank when one exits
case " $* " in *" --data-parallel-rank "*) sleep 3 ;; esac
"""
#: the exit of a rank-serving node script whose servers all exited 0 (templates/rank-servers.sh.j2: restart me)
RANK_SCRIPT_RESTART = 75
#: the scripts' TCP probes of the leader (``timeout 2 bash -c ...``) succeed at once
STUB_TIMEOUT = "#!/usr/bin/env bash\nexit 0\n"
#: variables bash sets by itself
BASH_OWN = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})
#: the device type of the vLLM-Ascend build in the image the kit deploys, by image suffix (setup.py
#: gen_build_info, v0.23.0: the plain image is built for 910B, SOC ascend910b1 -> A2; -a3 for ascend910_9391 -> A3)
BUILD_DEVICE_TYPE = {"": "A2", "-a3": "A3"}


def committed_stacks() -> list[str]:
    """Every stack file under stacks/."""
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in stacks_dir().glob("Pulumi.*.yaml"))


def hf_config(model: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's ``config.json`` (huggingface.co/deepseek-ai/DeepSeek-V3) with the stack's model shape.

    Shape keys come from the stack (``model:``); the rest are the published file's values. No ``auto_map``:
    transformers reads ``deepseek_v3`` natively, so ``--trust-remote-code`` loads no code from the directory.
    No ``quantization_config``: the FP8 checkpoint's is dropped by BF16 conversion and by ModelSlim.
    """
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
        "first_k_dense_replace": model["num_dense_layers"], "hidden_act": "silu", "hidden_size": model["hidden_size"],
        "initializer_range": 0.02, "intermediate_size": model["dense_intermediate_size"],
        "kv_lora_rank": model["kv_lora_rank"], "max_position_embeddings": 163840,
        "moe_intermediate_size": model["moe_intermediate_size"], "moe_layer_freq": 1,
        "n_group": model["num_expert_groups"], "n_routed_experts": model["num_routed_experts"],
        "n_shared_experts": model["num_shared_experts"], "norm_topk_prob": True,
        "num_attention_heads": model["num_attention_heads"], "num_experts_per_tok": model["experts_per_token"],
        "num_hidden_layers": model["num_layers"], "num_key_value_heads": model["num_attention_heads"],
        "num_nextn_predict_layers": model["num_mtp_layers"], "q_lora_rank": model["q_lora_rank"],
        "qk_nope_head_dim": model["qk_nope_head_dim"], "qk_rope_head_dim": model["qk_rope_head_dim"],
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True,
        "v_head_dim": model["v_head_dim"], "vocab_size": model["vocab_size"],
    }


def model_files(plan: Plan) -> dict[str, Any]:
    """The JSON files of the stack's model directory that building the engine config reads.

    W8A8 weights are ModelSlim's: their directory holds ``quant_model_description.json`` (vLLM-Ascend's
    ``maybe_update_config`` refuses ``--quantization ascend`` without it). ModelSlim writes one entry per
    weight as well; building the config reads none of them, loading the weights does.
    """
    model = plan.config["model"]
    files: dict[str, Any] = {"config.json": hf_config(model)}
    if model["quantization"] == "w8a8":
        files["quant_model_description.json"] = {"model_quant_type": "W8A8_DYNAMIC"}
    return files


def stub_bin(root: Path) -> Path:
    """A directory with the stand-in ``vllm`` and ``timeout``."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("vllm", STUB_VLLM), ("timeout", STUB_TIMEOUT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def dp_rank_of(argv: list[str]) -> int | None:
    """The ``--data-parallel-rank`` an argv names (a rank-serving server), else None."""
    return int(argv[argv.index("--data-parallel-rank") + 1]) if "--data-parallel-rank" in argv else None


def handovers(script: str, leader_watch: str, workdir: Path, bin_dir: Path) -> list[tuple[list[str], dict[str, str]]]:
    """(argv, exported environment) of every ``vllm`` a launch script starts when run under bash: one, or
    under ``serving: rank`` one per DP rank of the node (in rank order)."""
    out = workdir / "out"
    out.mkdir(parents=True)
    (workdir / "rank.sh").write_text(script)
    (workdir / LEADER_WATCH).write_text(leader_watch)
    harness = {"PATH": f"{bin_dir}:/usr/bin:/bin", "STUB_OUT": str(out), "ASCEND_DEPLOY_CHECK_FILES": "0",
               "ASCEND_DEPLOY_LEADER_POLL_S": "0.1", "ASCEND_DEPLOY_LEADER_FAILURES": "1",
               "ASCEND_DEPLOY_STARTUP_TIMEOUT_S": "20"}
    result = subprocess.run(["bash", str(workdir / "rank.sh")], cwd=workdir, env=harness, capture_output=True,
                            text=True, timeout=120)
    started = sorted(out.glob("argv.*"))
    rank_serving = any("--data-parallel-rank" in f.read_text().split("\0") for f in started)
    if not started or result.returncode not in ((0, RANK_SCRIPT_RESTART) if rank_serving else (0,)):
        raise AssertionError(f"{workdir.name}: the launch script did not start vllm (exit {result.returncode}):\n"
                             f"{result.stderr[-2000:]}")
    several = len(started) > 1
    servers = []
    for argv_file in started:
        argv = ["vllm", *argv_file.read_text().split("\0")[:-1]]
        env_file = out / argv_file.name.replace("argv.", "env.", 1)
        recorded = dict(item.split("=", 1) for item in env_file.read_text().split("\0") if "=" in item)
        servers.append((argv, {k: v for k, v in recorded.items() if k not in BASH_OWN and harness.get(k) != v}))
    if several and any(dp_rank_of(argv) is None for argv, _ in servers):
        raise AssertionError(f"{workdir.name}: several vllm servers, not all with --data-parallel-rank")
    return sorted(servers, key=lambda server: dp_rank_of(server[0]) or 0)


def handover(script: str, leader_watch: str, workdir: Path, bin_dir: Path) -> tuple[list[str], dict[str, str]]:
    """(argv, exported environment) a launch script that starts one ``vllm`` hands to it."""
    (server,) = handovers(script, leader_watch, workdir, bin_dir)
    return server


def _case(case_id: str, plan: Plan, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    return {"id": case_id, "argv": argv, "env": env, "weights_path": plan.config["model"]["weights_path"],
            "device_type": BUILD_DEVICE_TYPE[IMAGE_SUFFIX[plan.hardware]], "model_files": model_files(plan)}


def case(case_id: str, plan: Plan, script: str, leader_watch: str, root: Path) -> dict[str, Any]:
    """The judge case of one launch script of ``plan`` that starts one ``vllm``."""
    argv, env = handover(script, leader_watch, root / case_id.replace("/", "--"), stub_bin(root))
    return _case(case_id, plan, argv, env)


def script_cases(case_id: str, plan: Plan, script: str, leader_watch: str, root: Path) -> list[dict[str, Any]]:
    """The judge cases of one launch script: ``case_id`` for its one server, or ``<case_id>/dp<rank>`` for
    each DP rank's server under ``serving: rank``."""
    servers = handovers(script, leader_watch, root / case_id.replace("/", "--"), stub_bin(root))
    if len(servers) == 1 and dp_rank_of(servers[0][0]) is None:
        return [_case(case_id, plan, *servers[0])]
    return [_case(f"{case_id}/dp{dp_rank_of(argv)}", plan, argv, env) for argv, env in servers]


def rendered_scripts(stack: str) -> tuple[Plan, dict[str, str], str]:
    """(Plan, {rank: launch script text}, leader-watch.sh text) as ``ascend-deploy render`` writes them."""
    plan = load_plan(stack)
    files = render_artifacts(plan)
    scripts = {rank.name: files[f"launch/{rank.name}.sh"] for rank in plan.ranks}
    return plan, scripts, files[f"launch/{LEADER_WATCH}"]


def stack_cases(stack: str, root: Path) -> list[dict[str, Any]]:
    """One case per server a rank script of the stack's render starts (ids ``<stack>/<rank>``, with
    ``/dp<rank>`` under ``serving: rank``)."""
    plan, scripts, watch = rendered_scripts(stack)
    return [c for rank, text in scripts.items() for c in script_cases(f"{stack}/{rank}", plan, text, watch, root)]


def all_stack_cases(root: Path) -> list[dict[str, Any]]:
    """The cases of every rank script of every committed stack."""
    return [c for stack in committed_stacks() for c in stack_cases(stack, root)]


def run_judge(python: Path, cases: list[dict[str, Any]], root: Path, sources: Path = VENDOR,
              timeout_s: float = 3600) -> dict[str, dict[str, Any]]:
    """Verdicts of the engine on ``cases``: one run of judge.py in the engine's interpreter ``python``, with
    vLLM-Ascend from ``sources`` (a folder holding ``vllm_ascend/``) and the stand-ins of ``site/``.

    The judge starts with nothing of the caller's environment but PATH and locale, and a HOME of its own under
    ``root`` (vLLM caches model-class facts there, vLLM-Ascend writes its log there)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "cases.json").write_text(json.dumps(cases))
    home = root / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TMPDIR")}
    env.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(sources), str(STAND_INS)]))
    result = subprocess.run([str(python), str(JUDGE), str(root / "cases.json"), str(root / "verdicts.json"),
                             str(root / "logs")], env=env, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise AssertionError(f"the engine judge failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads((root / "verdicts.json").read_text())
