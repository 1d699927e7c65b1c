"""Engine surfaces: the loader on the committed data files, and the extractor on synthetic sources.

The extractor (tools/engine_surface.py + tools/engine_surface_rules.py) is imported by path; these
tests run offline and need no wheels, except the one ``--check`` test that is skipped unless the
released sources are at their default locations.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from ascend_runtime.engine.surface import (
    EngineSurface,
    UnknownRelease,
    load_surface,
    supported_releases,
)

ROOT = Path(__file__).resolve().parents[2]
SURFACES = ROOT / "ascend_runtime" / "engine" / "surfaces"


def _import_tool(name: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


tool = _import_tool("engine_surface")
rules = tool.rules


def tree(files: dict[str, str]) -> object:
    return rules.SourceTree({p: textwrap.dedent(t) for p, t in files.items()}, label="test")


# --------------------------------------------------------------------------- #
# Loader on the committed files
# --------------------------------------------------------------------------- #

FLAGS_0_23 = ["--host", "--port", "--headless", "--api-server-count", "--served-model-name", "--data-parallel-size", "--data-parallel-size-local", "--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-start-rank", "--tensor-parallel-size", "--enable-expert-parallel", "--seed", "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--trust-remote-code", "--enforce-eager", "--quantization", "--speculative-config", "--kv-transfer-config", "--additional-config", "--compilation-config", "--no-enable-prefix-caching", "--async-scheduling"]

METRICS_0_23 = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_success": "counter",
}


def test_supported_releases_are_the_committed_files() -> None:
    files = sorted(p.name[len("vllm-ascend-"):-len(".json")] for p in SURFACES.glob("vllm-ascend-*.json"))
    assert supported_releases() == ("0.11.0", "0.23.0")
    assert sorted(supported_releases()) == files


def test_unknown_release_lists_supported() -> None:
    with pytest.raises(UnknownRelease) as info:
        load_surface("9.9.9")
    assert isinstance(info.value, ValueError)
    assert "0.11.0" in str(info.value) and "0.23.0" in str(info.value)
    assert info.value.supported == supported_releases()


def test_load_is_cached_and_accepts_v_prefix() -> None:
    assert load_surface("0.23.0") is load_surface("0.23.0")
    assert load_surface("v0.23.0") == load_surface("0.23.0")
    assert isinstance(load_surface("0.11.0"), EngineSurface)


def test_sources_and_pairing_recorded() -> None:
    s23, s11 = load_surface("0.23.0"), load_surface("0.11.0")
    assert (s23.release, s23.vllm_version, s11.release, s11.vllm_version) == ("0.23.0", "0.23.0", "0.11.0", "0.11.0")
    assert re.fullmatch(r"vllm-0\.23\.0-\S+\.whl sha256:[0-9a-f]{64}", s23.sources["vllm"])
    assert re.fullmatch(r"git tag v0\.23\.0 commit [0-9a-f]{40}", s23.sources["vllm_ascend"])
    assert re.fullmatch(r"vllm_ascend-0\.11\.0-\S+\.whl sha256:[0-9a-f]{64}", s11.sources["vllm_ascend"])


@pytest.mark.parametrize("flag", FLAGS_0_23)
def test_0_23_serve_flags(flag: str) -> None:
    assert flag in load_surface("0.23.0").serve_flags


def test_has_flag_normalises() -> None:
    s = load_surface("0.23.0")
    assert s.has_flag("--max_num_seqs") and s.has_flag("--max-num-seqs=8")
    assert s.has_flag("--no-enable-prefix-caching") and s.has_flag("--no_enable_prefix_caching")
    assert s.has_flag("--compilation-config.mode")
    assert not s.has_flag("--max-num-seq") and not s.has_flag("-tp") and not s.has_flag("max-num-seqs")
    assert all(not f.startswith("--") or "_" not in f for f in s.serve_flags)


def test_flags_that_differ_between_releases() -> None:
    s23, s11 = load_surface("0.23.0"), load_surface("0.11.0")
    assert s11.has_flag("--swap-space") and not s23.has_flag("--swap-space")
    assert s11.has_flag("--num-redundant-experts") and not s23.has_flag("--num-redundant-experts")
    assert s23.has_flag("--eplb-config") and s23.has_flag("--no-async-scheduling")
    assert not s23.has_flag("--no-max-num-seqs")  # ints get no --no- form


def test_additional_config() -> None:
    s23, s11 = load_surface("0.23.0"), load_surface("0.11.0")
    assert {"dynamic_eplb", "expert_map_path", "expert_heat_collection_interval", "algorithm_execution_interval",
            "expert_map_record_path", "num_redundant_experts", "eplb_policy_type",
            "eplb_heat_collection_stage"} == s23.additional_config["eplb_config"]
    assert {"recompute_scheduler_enable", "multistream_overlap_shared_expert", "enable_shared_expert_dp",
            "finegrained_tp_config", "eplb_config"} <= s23.additional_config[""]
    assert {"torchair_graph_config", "ascend_scheduler_config", "expert_map_path", "dynamic_eplb",
            "init_redundancy_expert"} <= s11.additional_config[""]
    assert "torchair_graph_config" not in s23.additional_config[""]
    assert "eplb_config" not in s11.additional_config[""]
    assert {"enabled", "graph_batch_sizes"} <= s11.additional_config["torchair_graph_config"]
    assert {"fuse_muls_add", "enable_npugraph_ex"} <= s23.additional_config["ascend_compilation_config"]
    for surface in (s23, s11):
        assert all(section in surface.additional_config[""] for section in surface.additional_config if section)


def test_metrics() -> None:
    s23, s11 = load_surface("0.23.0"), load_surface("0.11.0")
    for name, kind in METRICS_0_23.items():
        assert s23.metrics[name] == kind
        assert s11.metrics[name] == kind
    assert set(s23.metrics.values()) <= {"gauge", "counter", "histogram"}
    assert "vllm:gpu_cache_usage_perc" in s11.metrics and "vllm:gpu_cache_usage_perc" not in s23.metrics
    assert not any(n.endswith("_total") and k == "counter" for n, k in s23.metrics.items())


def test_exposed_metric_names() -> None:
    exposed = load_surface("0.23.0").exposed_metric_names()
    assert {"vllm:prompt_tokens_total", "vllm:num_requests_running"} <= exposed
    assert "vllm:prompt_tokens" not in exposed  # a counter is exposed only as <name>_total
    assert {"vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
            "vllm:e2e_request_latency_seconds_count"} <= exposed
    assert "vllm:num_requests_running_total" not in exposed
    assert not any(n.endswith("_created") for n in exposed)


def test_connectors() -> None:
    s23, s11 = load_surface("0.23.0"), load_surface("0.11.0")
    assert s11.kv_connectors["LLMDataDistCMgrConnector"] == "vllm_ascend.distributed.llmdatadist_c_mgr_connector"
    assert "LLMDataDistCMgrConnector" not in s23.kv_connectors
    assert s23.kv_connectors["MooncakeConnectorV1"] == "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector"
    assert s11.kv_connectors["MooncakeConnectorV1"] == "vllm_ascend.distributed.mooncake_connector"
    assert s23.kv_connectors["MultiConnector"].startswith("vllm_ascend.")  # vllm_ascend overrides vLLM's
    for surface in (s23, s11):
        assert set(surface.kv_connectors.values()) <= surface.connector_modules
        assert "NixlConnector" in surface.kv_connectors


def test_env_expert_map_policies() -> None:
    s23, s11 = load_surface("0.23.0"), load_surface("0.11.0")
    assert {"VLLM_HOST_IP", "DYNAMIC_EPLB", "VLLM_ASCEND_ENABLE_NZ"} <= s23.env_vars
    assert {"VLLM_HOST_IP", "DYNAMIC_EPLB", "VLLM_ASCEND_ENABLE_MLAPO"} <= s11.env_vars
    for surface in (s23, s11):
        assert {"moe_layer_count", "layer_list", "layer_id", "device_count", "device_list", "device_id",
                "device_expert"} == surface.expert_map_keys
        assert set(surface.eplb_policies) == {0, 1, 2, 3}
        assert surface.eplb_policies[0] == "RandomLoadBalance" and surface.eplb_policies[3] == "FlashLB"


@pytest.mark.parametrize("path", sorted(SURFACES.glob("vllm-ascend-*.json")), ids=lambda p: p.name)
def test_committed_files_are_canonical(path: Path) -> None:
    text = path.read_text()
    data = json.loads(text)
    assert tool.render(data) == text  # sorted keys, fixed indent, trailing newline

    def lists(value: object) -> list[list[object]]:
        if isinstance(value, list):
            return [value]
        if isinstance(value, dict):
            return [x for v in value.values() for x in lists(v)]
        return []

    assert all(v == sorted(v) for v in lists(data))
    assert not re.search(r"/(tmp|root|home|work)/", text)
    assert tool.sanity_failures(data) == []


def test_surfaces_dir_is_a_package() -> None:
    assert (SURFACES / "__init__.py").exists()
    assert (SURFACES.parent / "__init__.py").exists()


# --------------------------------------------------------------------------- #
# Extractor rules on synthetic sources
# --------------------------------------------------------------------------- #

ARG_UTILS = '''
import argparse
from types import UnionType
from vllm.config import ModelConfig, CacheConfig

def get_type_hints(type_hint):
    if origin in {Union, UnionType}:
        pass

def _compute_kwargs(cls):
    if type_hints == {bool, str, type(None)}:
        pass

class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        model_kwargs = get_kwargs(ModelConfig)
        group = parser.add_argument_group("ModelConfig")
        group.add_argument("--max-model-len", **model_kwargs["max_model_len"])
        group.add_argument("--enforce-eager", **model_kwargs["enforce_eager"])
        group.add_argument("--tensor-parallel-size", "-tp", **model_kwargs["tensor_parallel_size"])
        group.add_argument("--hf-token", **model_kwargs["hf_token"])
        group.add_argument("--quantization", "-q", **model_kwargs["quantization"])
        cache_kwargs = get_kwargs(CacheConfig)
        group.add_argument("--enable-prefix-caching", **{**cache_kwargs["enable_prefix_caching"], "default": None})
        group.add_argument("--chunked", **cache_kwargs["chunked"])
        lora = cache_kwargs["lora"]
        group.add_argument("--lora", **lora)
        group.add_argument("--enable-lora-x", action=argparse.BooleanOptionalAction, help="x")
        group.add_argument("--disable-log-stats", action="store_true")
        for arg, type in [("--old-a", str), ("--old-b", bool)]:
            group.add_argument(arg, type=type, deprecated=True)
        return parser

class AsyncEngineArgs(EngineArgs):
    @staticmethod
    def add_cli_args(parser, async_args_only=False):
        parser = EngineArgs.add_cli_args(parser)
        parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction)
        current_platform.pre_register_and_update(parser)
        return parser
'''

CONFIG_MODEL = '''
from dataclasses import dataclass
from typing import Optional, Literal
from pydantic import SkipValidation

MaybeBool = bool | None

@dataclass
class ModelConfig:
    max_model_len: int = 0
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    hf_token: bool | str | None = None
    quantization: Optional[Literal["fp8", "awq"]] = None

@dataclass
class CacheConfig:
    enable_prefix_caching: MaybeBool = None
    chunked: SkipValidation[bool] = None
    lora: Optional[bool] = None
'''

CLI_ARGS = '''
from dataclasses import dataclass
from vllm.engine.arg_utils import AsyncEngineArgs

@dataclass
class FrontendArgs:
    host: str | None = None
    port: int = 8000
    allow_credentials: bool = False
    lora_modules: bool = False
    gone: bool = False

    @classmethod
    def _customize(cls, frontend_kwargs):
        frontend_kwargs["lora_modules"]["action"] = LoRAParserAction
        frontend_kwargs["port"]["flags"] = ["-P"]
        del frontend_kwargs["gone"]
        return frontend_kwargs

    @classmethod
    def add_cli_args(cls, parser):
        frontend_kwargs = get_kwargs(cls)
        frontend_kwargs = cls._customize(frontend_kwargs)
        for key, value in frontend_kwargs.items():
            extra_flags = value.pop("flags", [])
            parser.add_argument(*extra_flags, f"--{key.replace('_', '-')}", **value)
        return parser

def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--api-server-count", "-asc", type=int)
    parser = FrontendArgs.add_cli_args(parser)
    parser = AsyncEngineArgs.add_cli_args(parser)
    return parser
'''

SERVE = '''
from vllm.entrypoints.openai.cli_args import make_arg_parser

class ServeSubcommand:
    def subparser_init(self, subparsers):
        serve_parser = subparsers.add_parser("serve")
        serve_parser = make_arg_parser(serve_parser)
        return serve_parser
'''


#: The three config classes the JSON-valued options are parsed into (shapes of vLLM v0.23.0 vllm/config/).
JSON_CONFIGS = {
    "vllm/config/kv_transfer.py": '''
        from dataclasses import field
        from typing import Any, Literal
        from vllm.config.utils import config
        KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]
        @config
        class KVTransferConfig:
            kv_connector: str | None = None
            kv_role: KVRole | None = None
            kv_port: int = 14579
            kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
            _private: int = field(default=0, init=False)
    ''',
    "vllm/config/speculative.py": '''
        from typing import Literal, get_args
        from vllm.config.utils import config
        MTPModelTypes = Literal["deepseek_mtp", "ernie_mtp", "mtp"]
        EagleModelTypes = Literal["eagle", MTPModelTypes]
        SpeculativeMethod = Literal["ngram", EagleModelTypes]
        @config
        class SpeculativeConfig:
            num_speculative_tokens: int | None = None
            method: SpeculativeMethod | None = None
            def __post_init__(self):
                if self.method in get_args(MTPModelTypes) and self.method != "mtp":
                    self.method = "mtp"
    ''',
    "vllm/config/compilation.py": '''
        import enum
        from vllm.config.utils import config
        class CUDAGraphMode(enum.Enum):
            NONE = 0
            FULL = 2
            FULL_DECODE_ONLY = (FULL, NONE)
            def decode_mode(self):
                return self
        @config
        class CompilationConfig:
            cudagraph_mode: CUDAGraphMode = None
            cudagraph_capture_sizes: list[int] = None
    ''',
}


def synthetic_vllm(arg_utils: str = ARG_UTILS, extra: dict[str, str] | None = None) -> object:
    files = {
        "vllm/__init__.py": "",
        "vllm/config/__init__.py": "from vllm.config.model import ModelConfig, CacheConfig\n",
        "vllm/config/model.py": CONFIG_MODEL,
        "vllm/engine/arg_utils.py": arg_utils,
        "vllm/entrypoints/openai/cli_args.py": CLI_ARGS,
        "vllm/entrypoints/cli/serve.py": SERVE,
        **JSON_CONFIGS,
    }
    files.update(extra or {})
    return tree(files)


def test_serve_flags_from_dataclass_fields_and_actions() -> None:
    flags = rules.extract_serve_flags(synthetic_vllm())
    long = flags.long
    # dataclass field via **kwargs: bool gets --no-, int / Literal do not
    assert {"--enforce-eager", "--no-enforce-eager", "--max-model-len", "--quantization"} <= long
    assert "--no-max-model-len" not in long and "--no-quantization" not in long
    # bool | str | None is an optional value (nargs="?") when the release special-cases it
    assert "--hf-token" in long and "--no-hf-token" not in long
    # alias resolution, {**kw["f"], ...}, a name bound to kw["f"], SkipValidation[bool]
    assert {"--no-enable-prefix-caching", "--no-chunked", "--no-lora"} <= long
    # explicit actions
    assert {"--enable-lora-x", "--no-enable-lora-x", "--enable-log-requests", "--no-enable-log-requests"} <= long
    assert "--disable-log-stats" in long and "--no-disable-log-stats" not in long
    # literal-loop options, deprecated
    assert {"--old-a", "--old-b"} <= flags.deprecated and "--no-old-b" not in long
    # serve-level and generated frontend options
    assert {"--headless", "--api-server-count", "--host", "--port", "--allow-credentials",
            "--no-allow-credentials", "--lora-modules"} <= long
    assert "--no-lora-modules" not in long  # action overridden in _customize
    assert "--gone" not in long  # deleted from the kwargs
    assert {"-tp", "-q", "-asc", "-P"} <= flags.short
    assert "model_tag" not in long and not any("_" in f for f in long)


def test_serve_flags_pep604_unions_follow_release_semantics() -> None:
    old = ARG_UTILS.replace("{Union, UnionType}", "Union").replace("== {bool, str, type(None)}", "is None")
    long = rules.extract_serve_flags(synthetic_vllm(old)).long
    assert "--no-enable-prefix-caching" not in long  # ``bool | None`` alias is opaque without UnionType
    assert "--no-lora" in long  # Optional[bool] still flattens
    assert "--no-hf-token" not in long  # bool | str | None is opaque too


def test_serve_flags_unknown_pattern_is_an_error() -> None:
    bad = ARG_UTILS.replace('group.add_argument("--disable-log-stats", action="store_true")',
                            'group.add_argument(make_name(), action="store_true")')
    with pytest.raises(rules.ExtractionError):
        rules.extract_serve_flags(synthetic_vllm(bad))


def test_env_table_and_direct_reads() -> None:
    t = tree({
        "vllm_ascend/envs.py": '''
            import os
            env_variables = {
                "VLLM_ASCEND_A": lambda: os.getenv("VLLM_ASCEND_A", "0"),
                "VLLM_ASCEND_B": lambda: int(os.environ.get("ASCEND_HOME_PATH", "1")),
            }
            env_variables["VLLM_ASCEND_C"] = lambda: None
            def __getattr__(name):
                return env_variables[name]()
        ''',
        "vllm_ascend/ascend_config.py": '''
            import os
            from os import environ
            a = os.getenv("DYNAMIC_EPLB", "false")
            b = os.environ.get("EXPERT_MAP_RECORD")
            c = os.environ["HCCL_X"]
            d = "SHM_BARRIER" in os.environ
            e = environ.get("FROM_IMPORT")
            f = os.getenv("VLLM_ASCEND_A")
            os.environ["WRITTEN_ONLY"] = "1"
            os.getenv(name_var)
        ''',
    })
    keys = rules.extract_env_table(t, "vllm_ascend/envs.py")
    assert keys == ["VLLM_ASCEND_A", "VLLM_ASCEND_B", "VLLM_ASCEND_C"]
    direct = rules.extract_direct_env_reads(t, "vllm_ascend", "vllm_ascend/envs.py", keys)
    assert direct == ["ASCEND_HOME_PATH", "DYNAMIC_EPLB", "EXPERT_MAP_RECORD", "FROM_IMPORT", "HCCL_X",
                      "SHM_BARRIER", "VLLM_ASCEND_A"]
    assert rules.extract_env_writes(t, "vllm_ascend") == ["WRITTEN_ONLY"]


ASCEND_CONFIG = '''
from dataclasses import dataclass

class AscendConfig:
    def __init__(self, vllm_config):
        additional_config = vllm_config.additional_config or {}
        eplb_config = additional_config.get("eplb_config", {})
        self.eplb_config = EplbConfig(eplb_config)
        graph = additional_config.get("graph_config", {})
        self.graph = GraphConfig(graph, vllm_config)
        comp = additional_config.get("compilation", {})
        self.comp = CompilationCfg(**comp)
        sched = additional_config.get("scheduler", {})
        self.sched = SchedulerCfg(sched)
        self.plain = additional_config.get("plain_key", False)
        self.sub = additional_config["sub_key"]
        self.present = "present_key" in additional_config
        self.helper = self._get_config_value(additional_config, "helper_key", "ENV", None)
        self.sparse = additional_config.get("sparse", {"enabled": False, "path": ""})
        self.chained = vllm_config.additional_config.get("chained", {}).get("inner", 1)

    @staticmethod
    def _get_config_value(additional_config, config_key, env_key, env_value):
        if config_key in additional_config:
            return additional_config[config_key]
        return env_value

    def use(self):
        return self.sparse["enabled"]

class EplbConfig:
    _defaults = {"dynamic_eplb": False, "expert_map_path": None}
    def __init__(self, user_config=None):
        self.config = dict(self._defaults)

class GraphConfig:
    def __init__(self, graph_config, vllm_config):
        self.enabled = graph_config.get("enabled", False)
        self.sizes = graph_config["sizes"]
        self.other = vllm_config.get("not_a_section_key")

class CompilationCfg:
    def __init__(self, fuse_a=True, fuse_b=False, **kwargs):
        self.fuse_c = kwargs.get("fuse_c", True)

class SchedulerCfg:
    def __init__(self, cfg):
        self.enabled = cfg.get("enabled", False)
        for k, v in cfg.items():
            setattr(self, k, v)
'''


def test_additional_config_patterns() -> None:
    t = tree({
        "vllm_ascend/ascend_config.py": ASCEND_CONFIG,
        "vllm_ascend/core/schedule_config.py": '''
            from dataclasses import dataclass, field
            @dataclass
            class SchedulerCfg:
                policy: str = "fcfs"
                internal: int = field(init=False)
        ''',
        "vllm_ascend/other.py": '''
            def f(vllm_config):
                cfg = vllm_config.additional_config.get("graph_config", {})
                return cfg.get("from_other_module")
        ''',
    })
    result = rules.extract_additional_config(t)
    keys = result.keys
    assert {"eplb_config", "graph_config", "compilation", "scheduler", "plain_key", "sub_key", "present_key",
            "helper_key", "sparse", "chained"} <= keys[""]
    assert "config_key" not in keys[""]
    assert keys["eplb_config"] == {"dynamic_eplb", "expert_map_path"}  # _defaults dict
    assert keys["graph_config"] == {"enabled", "sizes", "from_other_module"}  # .get / [] / other module
    assert keys["compilation"] == {"fuse_a", "fuse_b", "fuse_c"}  # Cls(**section): params + kwargs.get
    assert keys["scheduler"] == {"enabled", "policy"}  # open section: fields of the same-named dataclass
    assert "scheduler" in result.open_sections
    assert keys["sparse"] == {"enabled", "path"}  # literal default + self.sparse["enabled"]
    assert keys["chained"] == {"inner"}


def test_register_connector_calls() -> None:
    vllm = tree({
        "vllm/distributed/kv_transfer/kv_connector/factory.py": '''
            class KVConnectorFactory:
                @classmethod
                def register_connector(cls, name, module_path, class_name): ...
            KVConnectorFactory.register_connector("MultiConnector", "vllm.distributed.kv.multi", "MultiConnector")
            KVConnectorFactory.register_connector("NixlConnector", "vllm.distributed.kv.nixl", "NixlConnector")
        ''',
        "vllm/distributed/ec_transfer/factory.py": '''
            ECConnectorFactory.register_connector("ECExample", "vllm.ec.example", "ECExample")
        ''',
        "vllm/distributed/kv/multi.py": "class MultiConnector(KVConnectorBase_V1): ...\n",
        "vllm/distributed/kv/base.py": "class KVConnectorBase_V1: ...\n",
    })
    ascend = tree({
        "vllm_ascend/distributed/__init__.py": '''
            from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
            def register_connector():
                KVConnectorFactory._registry.pop("MultiConnector")
                KVConnectorFactory.register_connector("MultiConnector", "vllm_ascend.multi", "AscendMulti")
                KVConnectorFactory.register_connector("MooncakeConnectorV1", "vllm_ascend.distributed.mooncake", "Mooncake")
                try:
                    import vllm.v1.missing_feature
                except ImportError:
                    pass
                else:
                    KVConnectorFactory.register_connector("Guarded", "vllm_ascend.guarded", "Guarded")
        ''',
        "vllm_ascend/distributed/mooncake.py": "class Mooncake(KVConnectorBase_V1): ...\nclass Helper: ...\n",
        "vllm_ascend/distributed/sub.py": "class Sub(Mooncake): ...\n",
    })
    registry = rules.extract_kv_connectors(vllm, ascend)
    assert {n: c.module for n, c in registry.items()} == {
        "MultiConnector": "vllm_ascend.multi",
        "NixlConnector": "vllm.distributed.kv.nixl",
        "MooncakeConnectorV1": "vllm_ascend.distributed.mooncake",
    }
    assert (registry["MultiConnector"].cls, registry["MultiConnector"].origin) == ("AscendMulti", "vllm_ascend")
    modules, missing = rules.extract_connector_modules(vllm, ascend, registry.values())
    assert modules == ["vllm.distributed.kv.multi", "vllm_ascend.distributed.mooncake", "vllm_ascend.distributed.sub"]
    assert missing == ["vllm.distributed.kv.nixl", "vllm_ascend.multi"]


def test_metrics_patterns() -> None:
    t = tree({
        "vllm/__init__.py": "from vllm.v1.metrics import loggers\n",
        "vllm/v1/metrics/loggers.py": '''
            from prometheus_client import Counter, Gauge, Histogram
            class PrometheusStatLogger:
                _gauge_cls = Gauge
                _counter_cls = Counter
                _histogram_cls = Histogram
                def __init__(self):
                    self._gauge_cls(name="vllm:num_requests_running", documentation="x")
                    self._counter_cls(name="vllm:prompt_tokens", documentation="x")
                    Counter("vllm:request_success_total", "x")
                    self._histogram_cls(name="vllm:e2e_request_latency_seconds", documentation="x")
                    if self.show_hidden_metrics:
                        self._gauge_cls(name="vllm:gpu_cache_usage_perc", documentation="x")
                    Gauge(name="other:not_vllm", documentation="x")
                def info(self, kind):
                    if kind == "cache_config":
                        name = "vllm:cache_config_info"
                    self._gauge_cls(name=name, documentation="x")
        ''',
        "vllm/engine/metrics.py": '''
            import prometheus_client
            g = prometheus_client.Gauge(name="vllm:dead_v0_metric", documentation="x")
        ''',
    })
    metrics, skipped = rules.extract_metrics(t, "vllm")
    assert {n: m.type for n, m in metrics.items()} == {
        "vllm:num_requests_running": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:request_success": "counter",  # prometheus_client strips _total from counter names
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:gpu_cache_usage_perc": "gauge",
        "vllm:cache_config_info": "gauge",
    }
    assert metrics["vllm:gpu_cache_usage_perc"].hidden and not metrics["vllm:prompt_tokens"].hidden
    assert skipped == ["vllm.engine.metrics"]


def test_expert_map_and_policies() -> None:
    t = tree({
        "vllm_ascend/eplb/utils.py": '''
            import json
            def expert_file_to_tensor(expert_map_path, layer_id):
                with open(expert_map_path) as f:
                    data = json.load(f)
                n = data["moe_layer_count"]
                for device in data["layer_list"][layer_id]["device_list"]:
                    x = device["device_expert"]
            def unrelated(path):
                with open(path) as f:
                    cfg = json.load(f)
                return cfg["not_expert_map"]
            def export(maps, expert_map_record_path):
                record = {"moe_layer_count": 1, "layer_list": []}
                record["layer_list"].append({"layer_id": 0, "device_list": [{"device_id": 0, "device_expert": []}]})
                with open(expert_map_record_path, "w") as f:
                    json.dump(record, f)
        ''',
        "vllm_ascend/eplb/core/policy/policy_factory.py": '''
            class PolicyFactory:
                @staticmethod
                def generate_policy(policy_type):
                    policy = {0: RandomLoadBalance, 1: DefaultEplb, 3: FlashLB}
                    return policy.get(policy_type, RandomLoadBalance)()
        ''',
    })
    keys = rules.extract_expert_map_keys(t)
    assert keys.read == {"moe_layer_count", "layer_list", "device_list", "device_expert"}
    assert keys.written == {"moe_layer_count", "layer_list", "layer_id", "device_list", "device_id", "device_expert"}
    assert rules.extract_eplb_policies(t) == {0: "RandomLoadBalance", 1: "DefaultEplb", 3: "FlashLB"}
    assert rules.extract_eplb_policies(tree({"vllm_ascend/x.py": ""})) == {}


def test_json_options_fields_enums_and_method_rewrites() -> None:
    vllm = synthetic_vllm()
    opts = rules.extract_json_options(vllm)
    assert opts.fields == {
        "--kv-transfer-config": ["kv_connector", "kv_connector_extra_config", "kv_port", "kv_role"],
        "--speculative-config": ["method", "num_speculative_tokens"],
        "--compilation-config": ["cudagraph_capture_sizes", "cudagraph_mode"],
    }
    assert opts.cudagraph_modes == ["NONE", "FULL", "FULL_DECODE_ONLY"]  # members, not methods
    assert opts.speculative_methods == ["deepseek_mtp", "eagle", "ernie_mtp", "mtp", "ngram"]  # nested aliases
    assert opts.speculative_method_rewrites == {"deepseek_mtp": "mtp", "ernie_mtp": "mtp"}
    # a plugin that replaces __post_init__ (vllm_ascend 0.11 patch_config.py) decides instead of vLLM's
    ascend = tree({"vllm_ascend/patch/platform/patch_config.py": '''
        from vllm.config import SpeculativeConfig
        def __post_init__(self):
            if self.method in ("[ngram]",):
                self.method = "ngram"
        SpeculativeConfig.__post_init__ = __post_init__
    '''})
    assert rules.extract_json_options(vllm, ascend).speculative_method_rewrites == {"[ngram]": "ngram"}
    broken = dict(JSON_CONFIGS, **{"vllm/config/speculative.py": "class SpeculativeConfig:\n    method: int = 0\n"})
    with pytest.raises(rules.ExtractionError, match="Literal"):
        rules.extract_json_options(synthetic_vllm(extra=broken))
    with pytest.raises(rules.ExtractionError, match="KVTransferConfig"):
        rules.extract_json_options(synthetic_vllm(extra={"vllm/config/kv_transfer.py": ""}))


# --------------------------------------------------------------------------- #
# --check
# --------------------------------------------------------------------------- #


def _fake_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the tool at one synthetic release whose sources are built in memory."""
    vllm = synthetic_vllm(extra={
        "vllm/envs.py": 'environment_variables = {"VLLM_HOST_IP": None}\ndef __getattr__(n):\n    return environment_variables[n]\n',
    })
    vllm.label = "vllm-9.0.0-py3-none-any.whl sha256:" + "0" * 64
    ascend = tree({
        "vllm_ascend/envs.py": 'env_variables = {"VLLM_ASCEND_X": None}\ndef __getattr__(n):\n    return env_variables[n]\n',
        "vllm_ascend/ascend_config.py": ASCEND_CONFIG,
    })
    ascend.label = "git tag v9.0.0 commit " + "0" * 40
    monkeypatch.setattr(tool, "RELEASES", {"9.0.0": tool.Release("9.0.0", "9.0.0", "git", "v9.0.0")})
    monkeypatch.setattr(tool, "load_sources", lambda release, args, surfaces_dir: (vllm, ascend))
    # the sources are in memory: no upstream repository to reach first
    monkeypatch.setattr(tool, "require_upstream", lambda *args, **kwargs: None)


def test_check_reports_diff_and_exit_codes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    _fake_release(monkeypatch)
    assert tool.main(["--surfaces-dir", str(tmp_path)]) == 0
    written = tmp_path / "vllm-ascend-9.0.0.json"
    assert json.loads(written.read_text())["sources"]["vllm_ascend"].startswith("git tag v9.0.0 commit")
    assert tool.main(["--check", "--surfaces-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    written.write_text(written.read_text().replace('"--headless",\n', ""))
    assert tool.main(["--check", "--surfaces-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "+    \"--headless\"," in out and "differs" in out


def _default_sources_present() -> bool:
    cache = tool.default_cache_dir() / "wheels"
    for release in tool.RELEASES.values():
        dists = [("vllm", release.vllm_version)] + ([("vllm_ascend", release.version)]
                                                    if release.ascend_source == "wheel" else [])
        for dist, version in dists:
            if not tool._wheel_candidates(cache, dist, version):
                return False
        if release.ascend_source == "git" and not tool._has_tag(tool.DEFAULT_MIRROR, release.git_tag):
            return False
    return True


@pytest.mark.skipif(not _default_sources_present(), reason="released sources not at their default locations")
def test_check_against_released_sources(capsys: pytest.CaptureFixture[str]) -> None:
    assert tool.main(["--check", "--no-download"]) == 0, capsys.readouterr().out


def test_check_reaches_the_upstream_repository_before_downloading_anything(tmp_path: Path, monkeypatch,
                                                                            capsys) -> None:
    """An unreachable vllm-ascend repository stops the run before any wheel is downloaded (hundreds of MB)."""
    downloads: list[str] = []
    monkeypatch.setattr(tool, "_pip_download", lambda requirement, dest, recorded: downloads.append(requirement))
    monkeypatch.setattr(tool, "DEFAULT_MIRROR", tmp_path / "no-mirror")
    monkeypatch.setattr(tool, "UPSTREAM_GIT_URL", (tmp_path / "unreachable.git").as_uri())
    assert tool.main(["--check", "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert downloads == []
    assert "v0.23.0" in err and "--vllm-ascend-git" in err and "nothing was downloaded" in err
