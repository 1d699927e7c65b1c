"""The engine judges rendered launch scripts: run inside the real engine's interpreter, never imported by the kit.

Usage: ``python judge.py CASES.json VERDICTS.json LOG_DIR`` with ``PYTHONPATH`` holding the vendored vLLM-Ascend
sources and ``site/`` (its ``sitecustomize.py`` puts the NPU-only stand-ins in place at interpreter start, in
this process and in any Python subprocess vLLM starts).

Each case is one rank's ``vllm serve`` argv and environment, as its launch script hands them to the engine. The
parent imports vLLM, torch and transformers once; every case runs in a child forked from it, so no case sees
another's environment variables, plugin registrations or module caches. In the child, the case's environment is
exported, then vLLM's own CLI runs as ``vllm serve`` does (``cli_env_setup``, the ``serve`` sub-parser,
``ServeSubcommand.validate`` and ``ServeSubcommand.cmd``), down to ``EngineArgs.create_engine_config``, which
builds the ``VllmConfig`` and, inside it, runs vLLM-Ascend's ``NPUPlatform.check_and_update_config``
(``AscendConfig``, ``FinegrainedTPConfig``, ``EplbConfig``, ...). Once the config is built the judge stops the
launch: nothing listens on a port and no engine process starts.

What the judge changes, each named in the verdict's ``substitutions`` (docs/engine-judge.md):

- the model path: the rendered weights directory exists only on the nodes; the positional model argument
  (and only when it is exactly the case's ``weights_path``) points to a directory holding the files the
  case gives (the stack's model shape as a Hugging Face ``config.json``; ModelSlim's
  ``quant_model_description.json`` for W8A8). No weights: building the config reads no tensor;
- ``setup_server``: the leader's listening socket is not bound (the address would be the node's);
- ``EngineArgs.create_engine_config``: the engine's own function runs to its end, then the judge stops the
  launch with the config it returned.

A verdict is ``{"ok": true, "config": {...}}`` or ``{"ok": false, "error_type", "message", "refused_by"}``
where ``refused_by`` lists the frames of vLLM and vLLM-Ascend code the error passed through (deepest last).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

#: Seconds one case may take (the first also inspects the model classes, in a vLLM subprocess).
CASE_TIMEOUT_S = 600
#: Packages whose frames name what refused a script.
ENGINE_PACKAGES = ("vllm", "vllm_ascend")


class ConfigBuilt(Exception):
    """Raised right after ``create_engine_config`` returned: the launch stops with the built config."""

    def __init__(self, config: Any) -> None:
        super().__init__("engine config built")
        self.config = config


def relative_engine_path(path: str) -> str | None:
    """``vllm/...`` or ``vllm_ascend/...`` part of a source path (the last such directory), else None."""
    parts = Path(path).parts
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] in ENGINE_PACKAGES:
            return "/".join(parts[index:])
    return None


def engine_frames(tb: Any) -> list[str]:
    """``package/path.py:line function`` of every vLLM / vLLM-Ascend frame of a traceback, outermost first."""
    frames = []
    for frame in traceback.extract_tb(tb):
        rel = relative_engine_path(frame.filename)
        if rel is not None:
            frames.append(f"{rel}:{frame.lineno} {frame.name}")
    return frames


def write_model_dir(files: dict[str, Any]) -> str:
    """A directory holding the model files of a case (JSON documents), no weights."""
    path = tempfile.mkdtemp(prefix="judge-model-")
    for name, document in files.items():
        Path(path, name).write_text(json.dumps(document, indent=1))
    return path


def substituted_argv(case: dict[str, Any], model_dir: str) -> list[str]:
    """The case's argv after ``vllm serve`` with the weights path (exactly that word) replaced."""
    argv = list(case["argv"])
    if argv[:2] != ["vllm", "serve"]:
        raise ValueError(f"not a `vllm serve` command line: {argv[:3]}")
    if argv[2] != case["weights_path"]:
        raise ValueError(f"the model argument {argv[2]!r} is not the weights path {case['weights_path']!r}")
    argv[2] = model_dir
    return argv[1:]


def install_stops() -> None:
    """The two launch-side substitutions: no socket is bound, and the launch stops once the config is built."""
    import vllm.engine.arg_utils as arg_utils
    import vllm.entrypoints.cli.serve as serve
    import vllm.entrypoints.openai.api_server as api_server

    real_create = arg_utils.EngineArgs.create_engine_config

    def create_then_stop(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ConfigBuilt(real_create(self, *args, **kwargs))

    def no_socket(args: Any) -> tuple[str, None]:
        return f"{args.host}:{args.port} (not bound by the judge)", None

    arg_utils.EngineArgs.create_engine_config = create_then_stop  # type: ignore[method-assign]
    serve.setup_server = no_socket
    api_server.setup_server = no_socket


#: vLLM / vLLM-Ascend frames of the last exception that left a recorded engine function (pydantic turns the
#: exceptions of a config's ``__post_init__`` into a ValidationError without their frames)
INNER_FRAMES: list[str] = []


def record_platform_check() -> dict[str, int]:
    """Count the calls of ``NPUPlatform.check_and_update_config`` that returned, and keep the frames of an
    exception leaving it or ``VllmConfig.__post_init__``; the originals run unchanged."""
    from vllm.config import VllmConfig
    from vllm_ascend.platform import NPUPlatform

    counts = {"returned": 0}
    original_check = NPUPlatform.check_and_update_config.__func__  # type: ignore[attr-defined]
    original_post_init = VllmConfig.__post_init__

    def recorded_check(cls: Any, vllm_config: Any) -> None:
        try:
            original_check(cls, vllm_config)
        except BaseException as exc:
            INNER_FRAMES[:] = engine_frames(exc.__traceback__)
            raise
        counts["returned"] += 1

    def recorded_post_init(self: Any) -> None:
        try:
            original_post_init(self)
        except BaseException as exc:
            INNER_FRAMES[:] = engine_frames(exc.__traceback__) if not INNER_FRAMES else INNER_FRAMES
            raise

    NPUPlatform.check_and_update_config = classmethod(recorded_check)  # type: ignore[method-assign, assignment]
    VllmConfig.__post_init__ = recorded_post_init  # type: ignore[method-assign]
    return counts


def validated_class(exc: BaseException) -> list[str]:
    """For pydantic's ValidationError of a vLLM config class: ``vllm/config/<file>.py <Class>``."""
    import inspect

    import vllm.config

    cls = getattr(vllm.config, getattr(exc, "title", ""), None)
    if cls is None or not inspect.isclass(cls):
        return []
    return [f"{relative_engine_path(inspect.getsourcefile(cls) or '')} {cls.__name__}"]


def summary(config: Any, platform_checks: dict[str, int]) -> dict[str, Any]:
    """What the verdict reports of a built ``VllmConfig`` and of vLLM-Ascend's state after it."""
    from vllm.platforms import current_platform
    from vllm_ascend.ascend_config import get_ascend_config
    from vllm_ascend.utils import get_ascend_device_type

    ascend = get_ascend_config()
    parallel, scheduler, kv = config.parallel_config, config.scheduler_config, config.kv_transfer_config
    return {
        "platform": f"{type(current_platform).__module__}.{type(current_platform).__name__}",
        "device_type": get_ascend_device_type().name,
        "check_and_update_config_returned": platform_checks["returned"],
        "data_parallel_size": parallel.data_parallel_size,
        "data_parallel_size_local": parallel.data_parallel_size_local,
        "data_parallel_rank": parallel.data_parallel_rank,
        "data_parallel_external_lb": parallel.data_parallel_external_lb,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "enable_expert_parallel": parallel.enable_expert_parallel,
        "worker_cls": parallel.worker_cls,
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "kv_connector": kv.kv_connector if kv else None,
        "kv_role": kv.kv_role if kv else None,
        "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
        "quantization": config.model_config.quantization,
        "speculative_method": config.speculative_config.method if config.speculative_config else None,
        "dynamic_eplb": bool(ascend.eplb_config.dynamic_eplb),
        "num_redundant_experts": ascend.eplb_config.num_redundant_experts,
        "finegrained_tp": {k: v for k, v in vars(ascend.finegrained_tp_config).items() if v},
    }


class ImportRecorder:
    """A meta-path finder that finds nothing: it records every vLLM-Ascend module an import looks for, with the
    file the path-based finder would load (None: no such file), whether or not the import then succeeds."""

    def __init__(self) -> None:
        self.attempted: dict[str, str | None] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] == "vllm_ascend" and name not in self.attempted:
            import importlib.machinery

            spec = importlib.machinery.PathFinder.find_spec(name, path)
            origin = spec.origin if spec is not None and spec.has_location else None
            self.attempted[name] = None if origin is None else relative_engine_path(origin)
        return None


def judge(case: dict[str, Any]) -> dict[str, Any]:
    """Run one case through vLLM's CLI down to the built config (in a forked child)."""
    os.environ.update(case["env"])
    os.environ["ASCEND_DEPLOY_JUDGE_DEVICE_TYPE"] = case["device_type"]
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    install_stops()
    platform_checks = record_platform_check()
    model_dir = write_model_dir(case["model_files"])
    verdict: dict[str, Any] = {"substitutions": {"model": model_dir}}
    stage = "parse"
    try:
        cli_env_setup()
        parser = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        command = ServeSubcommand()
        command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
        args = parser.parse_args(substituted_argv(case, model_dir))
        stage = "validate"
        command.validate(args)
        stage = "serve"
        args.dispatch_function(args)
        verdict.update(ok=False, stage=stage, error_type="NoConfig",
                       message="vllm serve returned without building an engine config", refused_by=[])
    except ConfigBuilt as built:
        verdict.update(ok=True, config=summary(built.config, platform_checks))
    except SystemExit as exc:  # argparse's error(): the message went to stderr (the case's log)
        verdict.update(ok=False, stage=stage, error_type="SystemExit", message=f"exit {exc.code}",
                       refused_by=engine_frames(exc.__traceback__))
    except BaseException as exc:  # noqa: BLE001 - every refusal is a verdict
        verdict.update(ok=False, stage=stage, error_type=type(exc).__name__, message=str(exc)[-3000:],
                       refused_by=engine_frames(exc.__traceback__) + INNER_FRAMES + validated_class(exc))
    verdict["vllm_ascend_imports"] = dict(sorted(IMPORTS.attempted.items()))
    verdict["imported"] = [name for name in sys.modules if name not in PARENT_MODULES]
    return verdict


#: vLLM-Ascend modules looked for in this process (the parent's, then each child's own copy)
IMPORTS = ImportRecorder()
#: Modules the parent had imported when it forked the child (what a child imports beyond them is reported).
PARENT_MODULES: set[str] = set()


def untouched_engine_state() -> bool:
    """No plugin loaded, no device type read, no vLLM-Ascend config built in this process (the parent)."""
    plugins = sys.modules.get("vllm.plugins")
    utils = sys.modules.get("vllm_ascend.utils")
    config = sys.modules.get("vllm_ascend.ascend_config")
    return (not getattr(plugins, "plugins_loaded", False)
            and getattr(utils, "_ascend_device_type", None) is None
            and getattr(config, "_ASCEND_CONFIG", None) is None)


def warm_up(modules: list[str]) -> None:
    """Import in the parent what the first case imported from vLLM and other libraries (not vLLM-Ascend), so
    later children start with it; raises when that touched vLLM-Ascend's per-case state."""
    import importlib

    for name in modules:
        if name.split(".")[0] == "vllm_ascend" or name in sys.modules:
            continue
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if not untouched_engine_state():
        raise RuntimeError("warming up the judge loaded a plugin or built vLLM-Ascend state before a case")


def run_child(case: dict[str, Any], out: Path, log: Path) -> None:
    """The forked child: output to the case's log, the verdict to ``out``; never returns."""
    code = 0
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        out.write_text(json.dumps(judge(case)))
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def wait_child(pid: int, timeout_s: float) -> int:
    """Exit status of a child, killing it after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.05)


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def main(argv: list[str]) -> int:
    cases_file, verdicts_file, log_dir = Path(argv[0]), Path(argv[1]), Path(argv[2])
    cases = json.loads(cases_file.read_text())
    sys.meta_path.insert(0, IMPORTS)
    log_dir.mkdir(parents=True, exist_ok=True)
    # what every case needs, imported once before forking (seconds); no plugin is loaded here
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import vllm.engine.arg_utils  # noqa: F401
    import vllm.entrypoints.cli.serve  # noqa: F401
    import vllm.entrypoints.openai.api_server  # noqa: F401

    verdicts = {}
    for number, case in enumerate(cases):
        PARENT_MODULES.clear()
        PARENT_MODULES.update(sys.modules)
        stem = case["id"].replace("/", "--")
        out, log = log_dir / f"{stem}.json", log_dir / f"{stem}.log"
        out.unlink(missing_ok=True)
        pid = os.fork()
        if pid == 0:
            run_child(case, out, log)
        status = wait_child(pid, CASE_TIMEOUT_S)
        if out.exists():
            verdicts[case["id"]] = json.loads(out.read_text())
        else:
            verdicts[case["id"]] = {"ok": False, "stage": "judge", "error_type": "ChildFailed",
                                    "message": f"exit status {status}\n{tail(log)}", "refused_by": []}
        verdicts[case["id"]]["log"] = str(log)
        if number == 0:
            warm_up(verdicts[case["id"]].pop("imported", []))
        verdicts[case["id"]].pop("imported", None)
    verdicts_file.write_text(json.dumps(verdicts, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
