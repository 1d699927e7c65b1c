"""One engine instance as the timing model and the simulator take it: ``SimConfig``.

``SimConfig`` carries exactly the ``ascend-deploy sim`` options (one field per
flag, :mod:`ascend_runtime.perf.sim_flags`; ``admin_token`` is the value of the
variable ``--admin-token-env`` names). Shape fields left ``None`` take the role's
published default for the hardware (``resolved()`` fills them, from
:data:`ascend_runtime.perf.profiles.ROLE_DEFAULTS`). The timing model reads the
shape fields; the simulator (``ascend_runtime.sim``) runs with all of them;
:func:`ascend_runtime.perf.from_plan.sim_config_from_plan` builds one from a
stack's Plan.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ascend_runtime.config.model import ModelShape
from ascend_runtime.perf.profiles import HARDWARE, ROLE_DEFAULTS, HardwareProfile

Role = Literal["prefill", "decode"]
HardwareName = Literal["atlas-800i-a2", "cm384"]


def split_host_port(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port); ValueError naming the problem."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port (a port 1..65535; 0 picks a free one, in-process use)")
    return host, int(port)


class SimConfig(BaseModel):
    """Options of one simulated vLLM-Ascend instance (mirrors ``ascend-deploy sim`` flags).

    Times: ``startup_delay`` is wall-clock seconds; ``kv_timeout_s`` is engine
    (modelled) seconds, so it is divided by ``speedup`` like every modelled time.
    """

    model_config = ConfigDict(extra="forbid")

    role: Role
    instance: str = Field(..., min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535, description="HTTP port; 0 picks a free one (in-process use).")
    kv_port: int = Field(0, ge=0, le=65535, description="KV transfer TCP port; 0 picks a free one.")
    kv_host: str | None = Field(None, description="Address announced in kv_transfer_params (default: host).")
    hardware: HardwareName = "atlas-800i-a2"
    npus: int | None = Field(None, ge=1)
    dp: int | None = Field(None, ge=1)
    tp: int | None = Field(None, ge=1)
    ep: int | None = Field(None, ge=1)
    nodes: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1, description="Per DP rank, as vLLM.")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Per DP rank, as vLLM.")
    redundant_experts: int = Field(0, ge=0)
    mtp: bool = False
    mtp_acceptance: float = Field(0.9, ge=0.0, le=1.0, description="Probability the MTP draft token is accepted.")
    speedup: float = Field(1.0, gt=0.0, description="Divides every modelled time.")
    startup_delay: float = Field(0.0, ge=0.0, description="Wall-clock seconds /health answers 503.")
    link_gbps: float | None = Field(None, gt=0.0, description="KV link rate in Gbit/s (default from hardware).")
    kv_timeout_s: float = Field(120.0, gt=0.0, description="Prefill frees unpulled KV after this (modelled s).")
    kv_wire_scale: float = Field(
        1.0 / 1024, gt=0.0, le=1.0, description="Wire bytes = modelled KV bytes x this (test speed)."
    )
    seed: int = 0
    model: str = "deepseek-ai/DeepSeek-R1"
    expert_map: str | None = Field(None, description="Path of a vLLM-Ascend expert map JSON applied at start.")
    gpu_memory_utilization: float = Field(0.95, gt=0.0, le=1.0)
    block_size: int = Field(128, ge=1, description="KV block size in tokens (vLLM-Ascend default 128).")
    enable_prefix_caching: bool = Field(
        True, description="Automatic prefix caching per DP rank (vLLM 0.23.0 CacheConfig default True; "
                          "sim/prefix_cache.py)."
    )
    rank_endpoints: tuple[str, ...] = Field(
        (), description="Rank serving: the ``host:port`` of each DP rank's own API server, in rank order (one per "
                        "DP rank; a request to rank r's is admitted to DP rank r only). Empty: one server for the "
                        "whole instance on host:port."
    )
    exit_on_fault: bool = Field(
        True, description="POST /admin/faults exit=true ends the process (False: only stops the server; in-process use)."
    )
    admin_token: str | None = Field(
        None, repr=False, exclude=True,
        description="Bearer token of the /admin API; None refuses every admin call (403). Never a flag value: "
                    "the CLI reads it from the variable --admin-token-env names.",
    )

    @model_validator(mode="after")
    def _check_hardware_role(self) -> "SimConfig":
        if (self.hardware, self.role) not in ROLE_DEFAULTS:
            raise ValueError(f"no defaults for hardware {self.hardware!r} role {self.role!r}")
        return self

    @model_validator(mode="after")
    def _check_rank_endpoints(self) -> "SimConfig":
        seen: set[tuple[str, int]] = set()
        for text in self.rank_endpoints:
            host, port = split_host_port(text)
            if port and (host, port) in seen:
                raise ValueError(f"rank_endpoints: {text} is given twice (every DP rank listens on its own address)")
            seen.add((host, port))
        if self.rank_endpoints and self.dp is not None and len(self.rank_endpoints) != self.dp:
            raise ValueError(f"rank_endpoints: {len(self.rank_endpoints)} given for dp = {self.dp} (one per DP rank)")
        return self

    @property
    def rank_addresses(self) -> list[tuple[str, int]]:
        """``rank_endpoints`` as (host, port) pairs, in DP rank order."""
        return [split_host_port(t) for t in self.rank_endpoints]

    @property
    def profile(self) -> HardwareProfile:
        """The hardware profile named by ``hardware``."""
        return HARDWARE[self.hardware]

    def model_shape(self) -> ModelShape:
        """The served model's shape (DeepSeek-V3/R1 defaults, name from ``model``)."""
        return ModelShape(name=self.model)

    def resolved(self) -> "SimConfig":
        """A copy with every shape field filled and checked; raises ValueError naming the problem."""
        d = ROLE_DEFAULTS[(self.hardware, self.role)]
        tp = self.tp or (d.tp if not self.npus or self.npus % d.tp == 0 else 1)
        if self.npus is None:
            npus = (self.dp * tp) if self.dp else d.npus
        else:
            npus = self.npus
        dp = self.dp or max(1, npus // tp)
        ep = self.ep or dp * tp
        nodes = self.nodes or math.ceil(npus / self.profile.npus_per_node)
        if dp * tp != npus:
            raise ValueError(f"dp x tp = {dp} x {tp} = {dp * tp} but npus = {npus}")
        if ep != npus:
            raise ValueError(f"ep = {ep} but expert parallelism spans dp x tp = {npus} NPUs")
        if self.rank_endpoints and len(self.rank_endpoints) != dp:
            raise ValueError(f"{len(self.rank_endpoints)} rank endpoints for dp = {dp} (one per DP rank)")
        if nodes * self.profile.npus_per_node < npus:
            raise ValueError(f"{npus} NPUs do not fit on {nodes} node(s) of {self.profile.npus_per_node}")
        shape = self.model_shape()
        if (shape.num_routed_experts + self.redundant_experts) % ep:
            raise ValueError(
                f"routed + redundant experts = {shape.num_routed_experts + self.redundant_experts} "
                f"is not a multiple of ep = {ep}"
            )
        return self.model_copy(
            update=dict(
                npus=npus,
                dp=dp,
                tp=tp,
                ep=ep,
                nodes=nodes,
                max_num_seqs=self.max_num_seqs or d.max_num_seqs,
                max_num_batched_tokens=self.max_num_batched_tokens or max(d.max_num_batched_tokens, 1),
                link_gbps=self.link_gbps or self.profile.default_link_gbps,
                kv_host=self.kv_host or self.host,
            )
        )

    @property
    def slots_per_rank(self) -> int:
        """Expert slots per EP rank per MoE layer (needs a resolved config)."""
        assert self.ep is not None
        return (self.model_shape().num_routed_experts + self.redundant_experts) // self.ep
