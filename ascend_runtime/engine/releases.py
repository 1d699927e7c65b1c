"""What each supported vLLM-Ascend release needs that its surface cannot show.

A release's *surface* (:mod:`ascend_runtime.engine.surface`, extracted from
the released sources by ``tools/engine_surface.py``) says which flags, env
vars, ``--additional-config`` keys, connectors and metrics exist. This module
holds the rest, one table per concern, each entry naming the upstream file and
tag it was read from:

- :data:`RELEASES`: per release, the KV connectors the kit speaks, how graph
  mode is asked for, how redundant experts reach the engine, which env switch
  or config key carries each operator option, the image tag per hardware and the image's own
  environment scripts the launch scripts source (a pod ``command:`` skips the image's ENTRYPOINT);
- :func:`decode_graph_tokens`: the smallest ``max_num_batched_tokens`` the
  decode graph of a release fits in (the rule that crashed decode at capture);
- :data:`METRICS`: the engine metric names the kit reads (dashboard, proxy,
  checks), per release.

Renderers look releases up here; nothing else in the kit branches on version
numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, Mapping

from ascend_runtime.engine.surface import UnknownRelease, supported_releases

Dialect = Literal["llmdatadist", "mooncake"]
GraphKind = Literal["torchair", "aclgraph"]
RedundancyForm = Literal["init_redundancy_expert", "eplb_config"]

#: Container image repository of the vLLM-Ascend project (README "Quick start" of each tag).
IMAGE_REPOSITORY = "quay.io/ascend/vllm-ascend"
#: Image tag suffix per hardware: the plain tag is built on the 910B CANN image (Dockerfile);
#: A3 (910C, CloudMatrix 384) needs the ``-a3`` image (Dockerfile.a3,
#: v0.11.0 .github/workflows/image_a3_ubuntu.yml ``type=pep440,pattern={{raw}},suffix=-a3``; v0.23.0
#: .github/workflows/schedule_image_build_and_push.yaml, ``dockerfile: Dockerfile.a3`` with ``suffix: 'a3'``).
IMAGE_SUFFIX: Mapping[str, str] = MappingProxyType({"atlas-800i-a2": "", "cm384": "-a3"})


@dataclass(frozen=True)
class Connector:
    """One KV connector class as ``--kv-transfer-config`` names it."""

    dialect: Dialect
    kv_connector: str  # registry name (KVConnectorFactory.register_connector)
    module_path: str  # kv_connector_module_path
    needs_rank_table: bool  # reads DISAGGREGATED_PREFILL_RANK_TABLE_PATH
    extra_config: bool  # takes kv_connector_extra_config {prefill/decode dp_size, tp_size}


@dataclass(frozen=True)
class EngineRelease:
    """What one vLLM-Ascend release reads beyond its surface; ``sources`` cites each field."""

    version: str
    vllm: str
    connectors: Mapping[str, Connector]
    default_dialect: Dialect
    graph: GraphKind
    redundancy: RedundancyForm
    #: concern -> env var that switches it (only concerns the release has).
    env_switches: Mapping[str, str]
    #: concern -> ``--additional-config`` key path ("section.key" or "key").
    config_keys: Mapping[str, str]
    llmdd_rpc_port_env: str | None
    mtp_method: str
    #: eplb_policy_type value per policy name (empty where EPLB has no selectable policy).
    eplb_policies: Mapping[str, int] = field(default_factory=dict)
    #: hardware kinds on which the release's MoE dispatch selection consults the fused-MC2 switch.
    fused_mc2_hardware: frozenset[str] = frozenset()
    #: ``vllm serve`` flags the release accepts but resets on Ascend, with the reason (and stack key to change).
    ignored_flags: Mapping[str, str] = field(default_factory=dict)
    #: Environment scripts of the release's image (CANN toolkit, ATB, BiSheng IR) that its ENTRYPOINT sources;
    #: a pod ``command:`` replaces that ENTRYPOINT, so the launch script sources them itself (each if present).
    image_env_scripts: tuple[str, ...] = ()
    #: Directories the release's own multi-node launcher puts in front of LD_LIBRARY_PATH (the image adds
    #: /usr/local/lib in ~/.bashrc, which a non-interactive bash never reads).
    image_library_dirs: tuple[str, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)

    def connector(self, dialect: str) -> Connector:
        """The connector of a dialect; KeyError when the release lacks it."""
        return self.connectors[dialect]


LLMDATADIST_0_11 = Connector(
    "llmdatadist", "LLMDataDistCMgrConnector", "vllm_ascend.distributed.llmdatadist_c_mgr_connector", True, False
)
MOONCAKE_0_11 = Connector("mooncake", "MooncakeConnectorV1", "vllm_ascend.distributed.mooncake_connector", False, True)
MOONCAKE_0_23 = Connector(
    "mooncake", "MooncakeConnectorV1", "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector", False, True
)


#: The rule table, one row per supported release (oldest first).
RELEASES: Mapping[str, EngineRelease] = MappingProxyType(
    {
        "0.11.0": EngineRelease(
            version="0.11.0",
            vllm="0.11.0",
            connectors=MappingProxyType({"llmdatadist": LLMDATADIST_0_11, "mooncake": MOONCAKE_0_11}),
            default_dialect="mooncake",
            graph="torchair",
            redundancy="init_redundancy_expert",
            env_switches=MappingProxyType(
                {"mlapo": "VLLM_ASCEND_ENABLE_MLAPO", "flashcomm1": "VLLM_ASCEND_ENABLE_FLASHCOMM1",
                 "dynamic_eplb": "DYNAMIC_EPLB"}
            ),
            config_keys=MappingProxyType(
                {
                    "graph": "torchair_graph_config.enabled",
                    "graph_batch_sizes": "torchair_graph_config.graph_batch_sizes",
                    "multistream_mla": "torchair_graph_config.enable_multistream_mla",
                    "multistream_shared_expert": "multistream_overlap_shared_expert",
                    "recompute_scheduler": "recompute_scheduler_enable",
                    "redundant_experts": "init_redundancy_expert",
                    "dynamic_eplb": "dynamic_eplb",
                    "eplb_update_interval": "num_iterations_eplb_update",
                    "expert_map_path": "expert_map_path",
                }
            ),
            llmdd_rpc_port_env="VLLM_ASCEND_LLMDD_RPC_PORT",
            mtp_method="deepseek_mtp",
            # Dockerfile (v0.11.0) sources both before building; docs/source/faqs.md "Failed to infer device type"
            image_env_scripts=("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnal/atb/set_env.sh"),
            sources=MappingProxyType(
                {
                    "image_env_scripts": "Dockerfile / Dockerfile.a3 RUN ... source set_env.sh; docs/source/faqs.md #6 (v0.11.0)",
                    "connectors": "vllm_ascend/distributed/__init__.py register_connector (v0.11.0)",
                    "graph": "vllm_ascend/ascend_config.py TorchairGraphConfig; torchair/torchair_model_runner.py (v0.11.0)",
                    "redundancy": "vllm_ascend/ascend_config.py init_redundancy_expert; ops/common_fused_moe.py "
                    "global_redundant_expert_num (v0.11.0)",
                    "env_switches": "vllm_ascend/envs.py (v0.11.0); DYNAMIC_EPLB: vllm_ascend/eplb/ (v0.11.0)",
                }
            ),
        ),
        "0.23.0": EngineRelease(
            version="0.23.0",
            vllm="0.23.0",
            connectors=MappingProxyType({"mooncake": MOONCAKE_0_23}),
            default_dialect="mooncake",
            graph="aclgraph",
            redundancy="eplb_config",
            # MLAPO and fused MC2 are read through AscendConfig._get_config_value: the additional_config key
            # wins, the VLLM_ASCEND_* env fallback logs "will be removed in the next release" (ascend_config.py)
            env_switches=MappingProxyType({"dynamic_eplb": "DYNAMIC_EPLB"}),
            config_keys=MappingProxyType(
                {
                    "mlapo": "enable_mlapo",
                    "fused_mc2": "enable_fused_mc2",
                    "multistream_shared_expert": "multistream_overlap_shared_expert",
                    "recompute_scheduler": "recompute_scheduler_enable",
                    "weight_nz": "weight_nz_mode",
                    "flashcomm1": "enable_flashcomm1",
                    "dynamic_eplb": "eplb_config.dynamic_eplb",
                    "redundant_experts": "eplb_config.num_redundant_experts",
                    "eplb_heat_interval": "eplb_config.expert_heat_collection_interval",
                    "eplb_algorithm_interval": "eplb_config.algorithm_execution_interval",
                    "eplb_policy": "eplb_config.eplb_policy_type",
                    "eplb_heat_stage": "eplb_config.eplb_heat_collection_stage",
                    "expert_map_path": "eplb_config.expert_map_path",
                }
            ),
            llmdd_rpc_port_env=None,
            # vLLM v0.23.0 vllm/config/speculative.py SpeculativeConfig.__post_init__: every other MTP model type
            # ("deepseek_mtp", ...) "is deprecated and replaced with mtp"; vllm_ascend tests method == "mtp"
            mtp_method="mtp",
            eplb_policies=MappingProxyType({"random": 0, "default": 1, "swift_balancer": 2, "flashlb": 3}),
            fused_mc2_hardware=frozenset({"cm384"}),
            ignored_flags=MappingProxyType(
                {
                    "--enable-dbo": "vllm_ascend/platform.py _fix_incompatible_config resets enable_dbo to False "
                    "on Ascend (v0.23.0); remove <role>.micro_batching",
                }
            ),
            # What vLLM-Ascend's own LeaderWorkerSet entrypoint does before `vllm serve` (v0.23.0
            # tests/e2e/nightly/multi_node/scripts/run.sh); the image is FROM quay.io/ascend/cann:9.1.0-* (Dockerfile,
            # Dockerfile.a3), whose ENTRYPOINT sources the same three scripts.
            image_env_scripts=(
                "/usr/local/Ascend/ascend-toolkit/set_env.sh",
                "/usr/local/Ascend/cann-9.1.0/share/info/ascendnpu-ir/bin/set_env.sh",
                "/usr/local/Ascend/nnal/atb/set_env.sh",
            ),
            image_library_dirs=("/usr/local/Ascend/ascend-toolkit/latest/python/site-packages", "/usr/local/lib"),
            sources=MappingProxyType(
                {
                    "image_env_scripts": "tests/e2e/nightly/multi_node/scripts/run.sh (LWS pods, `command:` bash run.sh); "
                    "Dockerfile FROM quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.12, ~/.bashrc LD_LIBRARY_PATH "
                    "/usr/local/lib (v0.23.0)",
                    "fused_mc2": "vllm_ascend/ascend_forward_context.py select_moe_comm_method: only "
                    "_select_a3_moe_comm_method reads enable_fused_mc2; 2 = dispatch_gmm_combine_decode on decode "
                    "within the MC2 token capacity, W8A8 (envs.py) (v0.23.0)",
                    "connectors": "vllm_ascend/distributed/kv_transfer/__init__.py register_connector (v0.23.0)",
                    "graph": "vllm/config/vllm.py _set_cudagraph_sizes (vllm v0.23.0); vllm_ascend/platform.py "
                    "_get_default_max_cudagraph_capture_size (v0.23.0)",
                    "redundancy": "vllm_ascend/eplb/core/eplb_utils.py init_eplb_config: num_redundant_experts "
                    "counts only with dynamic_eplb or an expert map (v0.23.0)",
                    "eplb_policies": "docs/source/user_guide/feature_guide/expert_parallelism_load_balancer.md, "
                    "ascend_config.py EplbConfig eplb_policy_type in [0, 1, 2, 3] (v0.23.0)",
                    "env_switches": "vllm_ascend/envs.py; DYNAMIC_EPLB asserted in ascend_config.py EplbConfig (v0.23.0)",
                }
            ),
        ),
    }
)


def release(version: str) -> EngineRelease:
    """The rule row of a release; :class:`UnknownRelease` listing the supported ones otherwise."""
    row = RELEASES.get(version)
    if row is None or version not in supported_releases():
        raise UnknownRelease(
            f"vLLM-Ascend {version!r} has no engine surface; supported: {', '.join(supported_releases())}"
        )
    return row


def default_image(version: str, hardware: str) -> str:
    """The project's published image for a release and hardware kind."""
    return f"{IMAGE_REPOSITORY}:v{version}{IMAGE_SUFFIX[hardware]}"


@dataclass(frozen=True)
class GraphNeed:
    """What the decode graph of a stage needs (tokens per DP rank)."""

    tokens: int  # the largest graph batch, in tokens
    seqs_after_padding: int  # sequences the engine pads max_num_seqs to
    source: str


def decode_graph_tokens(
    version: str, max_num_seqs: int, spec_tokens: int, kv_consumer: bool, hardware: str, tp: int
) -> GraphNeed:
    """Tokens the largest decode graph of ``max_num_seqs`` sequences takes, per DP rank.

    The stage's ``max_num_batched_tokens`` must be at least this.

    - 0.11.0, torchair (vllm_ascend/torchair/torchair_model_runner.py ``_may_pad_kv_consumer_num_seq``,
      ``update_torchair_graph_batch_sizes`` and ``_align_graph_size_divisible_by_tp_size`` at v0.11.0):
      a KV consumer with MTP pads n sequences to n + ceil(n/16) + ceil(n*(1+k)/256) and captures one graph
      of that many sequences times (1+k) tokens; on A3 with EP the size is rounded up to a multiple of tp and
      every size above max_num_batched_tokens is dropped (then ``max([])`` fails); the dummy run asserts
      num_tokens <= max_num_batched_tokens (worker/model_runner_v1.py ``_dummy_run``).
    - 0.23.0, aclgraph (vllm/config/vllm.py ``_set_cudagraph_sizes`` at vLLM v0.23.0 clips capture sizes to
      max_num_batched_tokens; vllm_ascend/platform.py ``_get_default_max_cudagraph_capture_size`` at v0.23.0
      sizes the largest graph min(n*(1+k), 512); ascend_forward_context.py ``set_mc2_tokens_capacity`` caps
      MC2 at 512 tokens per TP rank): a full decode step of n sequences is n*(1+k) tokens and fits one graph
      only when max_num_batched_tokens >= n*(1+k) (and n*(1+k) <= 512).
    """
    row = release(version)
    per_req = 1 + spec_tokens
    if row.graph == "torchair":
        n = max_num_seqs
        if kv_consumer and spec_tokens:
            n = max_num_seqs + math.ceil(max_num_seqs / 16) + math.ceil(max_num_seqs * per_req / 256)
        tokens = n * per_req
        if hardware == "cm384" and tp > 1:
            tokens = tokens * tp // math.gcd(tokens, tp)
        return GraphNeed(tokens, n, row.sources["graph"])
    return GraphNeed(max_num_seqs * per_req, max_num_seqs, row.sources["graph"])


#: Largest decode graph, in tokens, of an aclgraph release (platform.py cap, v0.23.0).
ACLGRAPH_MAX_CAPTURE = 512


#: Engine metrics the kit reads, by what it uses them for; base names (counters gain ``_total``,
#: histograms ``_bucket``/``_sum``/``_count`` when exposed). vLLM v0.11.0 and v0.23.0
#: vllm/v1/metrics/loggers.py; both releases use the same names for these.
METRICS: Mapping[str, str] = MappingProxyType(
    {
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "kv_cache_usage": "vllm:kv_cache_usage_perc",
        "prompt_tokens": "vllm:prompt_tokens",
        "generation_tokens": "vllm:generation_tokens",
        "request_success": "vllm:request_success",
        "ttft": "vllm:time_to_first_token_seconds",
        "itl": "vllm:inter_token_latency_seconds",
        "e2e": "vllm:e2e_request_latency_seconds",
    }
)
