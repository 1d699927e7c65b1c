"""Shared helpers of the object builders: labels, metadata, names, secrets.

Every builder returns Kubernetes objects as plain dicts (``apiVersion``,
``kind``, ``metadata``, ...): the exact data Pulumi registers and ``render``
writes. Nothing here imports Pulumi.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ascend_runtime.planner.plan import Plan

K8sObject = dict[str, Any]

PART_OF = "ascend-deepseek"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_ROLE = "ascend-deepseek/role"
LABEL_RANK = "ascend-deepseek/rank"
LABEL_LEADER = "ascend-deepseek/leader"
LABEL_SERVING_ROLE = "ascend-deepseek/serving-role"
TAINT_KEY = "ascend-deepseek/serving"

#: Secret keys of the Pulumi config (``pulumi config set --secret``); see :func:`secret_placeholder`.
IMAGE_PULL_SECRET = "image_pull_credentials"
MODEL_SOURCE_SECRET = "model_source_credentials"
SECRET_KEYS = (IMAGE_PULL_SECRET, MODEL_SOURCE_SECRET)
IMAGE_PULL_SECRET_NAME = "image-pull-credentials"
MODEL_SOURCE_SECRET_NAME = "model-source-credentials"

PROXY_NAME = "pd-proxy"
BALANCER_NAME = "expert-balancer"
EXPERT_MAP_CONFIGMAP = "expert-map"
EXPERT_MAP_KEY = "expert_map.json"
CHECKS_JOB_NAME = "post-deploy-checks"


def secret_placeholder(key: str) -> str:
    """The string standing for a secret's value in object data.

    The Pulumi layer swaps it for ``pulumi.Config().require_secret(key)``;
    ``render`` writes the placeholder itself, never a value.
    """
    return f"${{pulumi-secret:{key}}}"


@dataclass(frozen=True)
class Context:
    """What every builder needs besides the Plan: namespace, target and present secrets."""

    plan: Plan
    secrets: frozenset[str] = field(default_factory=frozenset)

    @property
    def k8s(self) -> dict[str, Any]:
        """The stack's ``kubernetes`` config block."""
        return self.plan.config["kubernetes"]

    @property
    def namespace(self) -> str:
        """Namespace of every namespaced object."""
        return self.k8s["namespace"]

    @property
    def simulated(self) -> bool:
        """True on kind (and local): the engine is the simulator and no NPUs are requested."""
        return self.plan.target in ("kind", "local")

    @property
    def image_pull_secrets(self) -> list[dict[str, str]]:
        """``imagePullSecrets`` of every pod (empty unless the secret is configured)."""
        return [{"name": IMAGE_PULL_SECRET_NAME}] if IMAGE_PULL_SECRET in self.secrets else []


def base_labels(plan: Plan, component: str) -> dict[str, str]:
    """Labels every object of a component carries."""
    return {
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": "pulumi",
        LABEL_COMPONENT: component,
        "ascend-deepseek/stack": plan.stack,
    }


def metadata(ctx: Context, name: str, component: str, extra_labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, namespaced: bool = True) -> dict[str, Any]:
    """ObjectMeta with a fixed name (no Pulumi auto-naming), namespace and labels."""
    meta: dict[str, Any] = {"name": name}
    if namespaced:
        meta["namespace"] = ctx.namespace
    meta["labels"] = {**base_labels(ctx.plan, component), **(extra_labels or {})}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def digest(data: Any) -> str:
    """sha256 of canonical JSON (hex)."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def dns_label(text: str) -> str:
    """Lower-case ``text`` into a DNS-1123 label fragment."""
    out = "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")
    return out[:63].rstrip("-")


def configmap_key(text: str) -> str:
    """A valid ConfigMap key from a file name (``[-._a-zA-Z0-9]+``)."""
    return "".join(c if c.isalnum() or c in "-._" else "_" for c in text) or "_"


def pod_security() -> dict[str, Any]:
    """Container securityContext of the kit's own (non-engine) pods."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": False,
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
