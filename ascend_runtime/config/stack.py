"""Typed stack configuration: what one environment (a Pulumi stack) asks for.

A stack is ``stacks/Pulumi.<stack>.yaml``. Its ``config:`` map uses the
project's Pulumi namespace (``ascend-deepseek:<key>``); keys of other
namespaces (``kubernetes:context``, ...) belong to other providers and are
ignored here. Secrets (``secure:`` values) are never read into this model:
only the Pulumi program reads them, through ``pulumi.Config().get_secret``.

Every model forbids unknown keys, so a misspelt key is an error naming its
path. Units: milliseconds for SLOs, GiB for memory, seconds for timeouts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ascend_runtime.config.inventory import Inventory
from ascend_runtime.config.model import ModelShape

PROJECT = "ascend-deepseek"
Role = Literal["prefill", "decode"]
Target = Literal["kubernetes", "kind", "local"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    max_num_batched_tokens: int = Field(8192, ge=1, description="Tokens per scheduler step per DP rank.")
    redundant_experts: int = Field(0, ge=0, description="Extra physical expert slots per MoE layer.")
    mtp: bool = Field(False, description="Multi-token prediction (deepseek_mtp, 1 speculative token).")
    context_len: int = Field(4096, ge=1, description="Context per sequence used to size the KV cache (tokens).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Share of HBM vLLM may use.")
    reserve_gib: float = Field(2.0, ge=0, description="Activations and workspace per NPU outside weights and KV (GiB).")
    hccl_buffsize_mb: int | None = Field(
        None, ge=1, description="HCCL_BUFFSIZE (MB); default 256 on prefill, 1024 on decode."
    )
    graph_mode: bool | None = Field(None, description="torchair graph mode; default on for decode, off for prefill.")
    hccl_intra: Literal["pcie", "roce"] = Field(
        "pcie", description="HCCL path inside a node: sets HCCL_INTRA_PCIE_ENABLE=1 (pcie) or HCCL_INTRA_ROCE_ENABLE=1 (roce)."
    )


class ModelStagingConfig(_Strict):
    """Weights pre-staged on every host; the preflight playbook checks the directory is complete."""

    dir: str = Field(description="Model directory on the hosts.")
    files: dict[str, int] = Field(default_factory=dict, description="File name -> size in bytes.")


class EngineConfig(_Strict):
    """The vLLM-Ascend engine image and version-dependent switches."""

    image: str = Field("quay.io/ascend/vllm-ascend:v0.9.1", description="Engine container image.")
    vllm_ascend_version: str = Field("0.9.1", description="vLLM-Ascend release; picks the KV connector dialect.")
    kv_connector: Literal["auto", "llmdatadist", "mooncake"] = Field(
        "auto", description="auto: LLMDataDist for 0.9.1 to 0.10.x, Mooncake from 0.11."
    )
    dynamic_eplb: bool = Field(False, description="In-engine dynamic EPLB (sets DYNAMIC_EPLB=true).")
    expert_map_path: str | None = Field(None, description="Static expert map file inside the container.")
    hccl_connect_timeout_s: int = Field(7200, ge=120, le=7200, description="HCCL_CONNECT_TIMEOUT (s).")
    extra_args: list[str] = Field(default_factory=list, description="Extra engine command-line arguments.")
    extra_env: dict[str, str] = Field(default_factory=dict, description="Extra engine environment variables.")


class PortsConfig(_Strict):
    """Port bases; per-instance ports are base + instance ordinal (prefill first)."""

    api_base: int = Field(8000, ge=1024, le=65535, description="OpenAI API port of instance 0.")
    kv_base: int | None = Field(None, ge=1024, le=65535, description="KV transfer port base (default by hardware).")
    rpc_base: int = Field(5557, ge=1024, le=65535, description="LLMDataDist RPC port of instance 0.")
    dp_rpc_base: int = Field(13355, ge=1024, le=65535, description="Data-parallel RPC port of instance 0.")
    proxy: int = Field(9000, ge=1024, le=65535, description="PD proxy API port.")
    balancer_metrics: int = Field(9100, ge=1024, le=65535, description="Balancer metrics port.")


class SloConfig(_Strict):
    """Service level objectives used by goodput."""

    ttft_ms: float = Field(2000.0, gt=0, description="Time to first token (ms).")
    tpot_ms: float = Field(100.0, gt=0, description="Time per output token (ms).")


class ThroughputCheckConfig(_Strict):
    """Shape of the post-deploy throughput check."""

    input_len: int = Field(2048, ge=1)
    output_len: int = Field(2048, ge=1)
    concurrency: int = Field(64, ge=1)
    num_prompts: int = Field(256, ge=1)
    min_goodput: float = Field(0.0, ge=0, description="Requests/s meeting every SLO, below which the check fails.")
    published_decode_tokens_per_npu: float | None = Field(
        None, gt=0, description="Published per-NPU decode figure the report compares against (tokens/s)."
    )


class SimulatorConfig(_Strict):
    """Engine simulator settings, used only by the explicit `local` and `kind` targets."""

    speedup: float = Field(1.0, gt=0, description="Divides all simulated time.")
    startup_delay_s: float = Field(0.0, ge=0, description="Seconds before /health turns 200.")
    link_gbps: float = Field(50.0, gt=0, description="Modelled KV link rate between nodes (GB/s).")
    image: str = Field("ascend-deploy-runtime:dev", description="Runtime image running the simulator on kind.")


class DevicePluginConfig(_Strict):
    """The Ascend device plugin DaemonSet, installed only when the cluster lacks it."""

    install: bool = Field(False, description="Install the Ascend device plugin DaemonSet.")
    image: str = Field("ascendhub.huawei.com/public-ascendhub/ascend-k8sdeviceplugin", description="Device plugin image.")
    version: str = Field("v6.0.0", description="Device plugin image tag.")


class KubernetesConfig(_Strict):
    """Cluster-side settings for the Pulumi program."""

    namespace: str = Field("deepseek", description="Namespace of every namespaced object.")
    version: str = Field("1.30", description="Kubernetes minor version the objects are validated against.")
    npu_resource: str = Field("huawei.com/Ascend910", description="Extended resource of the device plugin.")
    runtime_image: str = Field("ascend-deploy-runtime:0.1.0", description="Image with proxy, balancer, checks.")
    device_plugin: DevicePluginConfig = Field(default_factory=DevicePluginConfig, description="Ascend device plugin.")
    runtime_class: str | None = Field(None, description="RuntimeClass of engine pods (created with handler `ascend`); None: default runtime.")
    runtime_class_handler: str = Field("ascend", description="CRI handler of the RuntimeClass.")
    shm_size_gib: int = Field(64, ge=1, description="Memory-backed /dev/shm of each engine pod (GiB).")
    model_source: Literal["hostPath", "pvc"] = Field("hostPath", description="Weights pre-staged on every node, or a shared PVC.")
    model_host_path: str = Field("/data/models", description="Host directory holding the weights (hostPath source).")
    model_pvc_name: str | None = Field(None, description="PersistentVolumeClaim holding the weights (pvc source).")
    startup_probe_seconds: int = Field(3600, ge=60, description="Time an engine may take to load before it is restarted (s).")
    termination_grace_seconds: int = Field(120, ge=0, description="Grace period of engine pods (s).")
    taint_nodes: bool = Field(True, description="Taint serving nodes `ascend-deepseek/serving=<role>:NoSchedule`.")
    proxy_replicas: int = Field(2, ge=1, description="PD proxy replicas.")
    prometheus_operator: bool = Field(False, description="The cluster has the Prometheus operator CRDs (ServiceMonitor/PodMonitor).")
    monitoring_namespace: str = Field("monitoring", description="Namespace of Prometheus (allowed to scrape engine ports).")
    grafana_dashboard: bool = Field(True, description="Create the Grafana dashboard ConfigMap (label grafana_dashboard=1).")
    post_deploy_checks: bool = Field(True, description="Run the smoke + throughput check Job; its failure fails `pulumi up`.")
    checks_timeout_seconds: int = Field(1800, ge=60, description="Deadline of the post-deploy check Job (s).")

    @model_validator(mode="after")
    def _pvc_named(self) -> "KubernetesConfig":
        if self.model_source == "pvc" and not self.model_pvc_name:
            raise ValueError("model_source 'pvc' needs model_pvc_name")
        return self


class StackConfig(_Strict):
    """Everything one stack asks for (the project's Pulumi config namespace)."""

    hardware: Literal["atlas-800i-a2", "cm384"] = Field(description="Server kind of every node.")
    target: Target = Field("kubernetes", description="kubernetes (real NPUs), kind or local (simulated NPUs).")
    inventory: str = Field(description="Host inventory file, relative to stacks/.")
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
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig, description="Cluster settings of the Pulumi program.")

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
