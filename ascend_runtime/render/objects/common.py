"""Shared helpers of the object builders: labels, metadata, names, secrets, security contexts.

Every builder returns Kubernetes objects as plain dicts (``apiVersion``,
``kind``, ``metadata``, ...): the exact data Pulumi registers and ``render``
writes. Nothing here imports Pulumi.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from ascend_runtime.config.runtime_image import configured_reference
from ascend_runtime.config.secrets import SECRET_KEYS as CONFIG_SECRET_KEYS
from ascend_runtime.planner.plan import Plan
from ascend_runtime.render.environment import secret_env_references

K8sObject = dict[str, Any]

PART_OF = "ascend-deepseek"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_ROLE = "ascend-deepseek/role"
LABEL_RANK = "ascend-deepseek/rank"
LABEL_LEADER = "ascend-deepseek/leader"
LABEL_SERVING_ROLE = "ascend-deepseek/serving-role"
#: Key of the serving taint (``<key>=<role>:NoSchedule``) that keeps other pods off the serving nodes. Applied
#: with ``kubectl taint --overwrite`` (cluster.py ``serving_taint_commands``), never by the node patches:
#: Node ``spec.taints`` is an atomic list under server-side apply (docs/kubernetes.md, "Serving taint").
TAINT_KEY = "ascend-deepseek/serving"
TAINT_EFFECT = "NoSchedule"


def serving_toleration() -> dict[str, str]:
    """Toleration of the serving taint whatever its value (every engine pod and the device plugin)."""
    return {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT}

#: Secret keys of the Pulumi config (``pulumi config set --secret``); see :func:`secret_placeholder`.
IMAGE_PULL_SECRET = "image_pull_credentials"
MODEL_SOURCE_SECRET = "model_source_credentials"
#: Bearer token of the simulators' admin API on kind (the balancer reads load and applies maps with it).
SIM_ADMIN_SECRET = "simulator_admin_token"
SECRET_KEYS = CONFIG_SECRET_KEYS  # one list: the stack loader and the program read the same secrets
IMAGE_PULL_SECRET_NAME = "image-pull-credentials"
MODEL_SOURCE_SECRET_NAME = "model-source-credentials"
SIM_ADMIN_SECRET_NAME = "simulator-admin-token"
SIM_ADMIN_SECRET_KEY = "token"
#: Environment variable the kind simulators and the balancer read the simulator admin token from.
SIM_ADMIN_TOKEN_ENV = "ASCEND_SIM_ADMIN_TOKEN"

#: User and group of the kit's runtime image (Dockerfile: ``useradd --uid 10001``, ``USER 10001``).
RUNTIME_UID = 10001
RUNTIME_GID = 10001
TMP_VOLUME = "tmp"

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


_PLACEHOLDER = re.compile(r"\$\{pulumi-secret:([^}]+)\}\Z")

#: The kit's Secret of the engine variables that reference Pulumi secrets (``engine.extra_env: {secret: KEY}``);
#: one data key per referenced Pulumi config key.
ENGINE_ENV_SECRET_NAME = "engine-env"


def placeholder_key(value: str) -> str | None:
    """The Pulumi config key a :func:`secret_placeholder` string stands for (None for any other string)."""
    match = _PLACEHOLDER.match(value)
    return match.group(1) if match else None


def env_pulumi_secrets(plan: Plan) -> list[str]:
    """Pulumi config keys the engine variables reference (``{secret: KEY}``), sorted."""
    return sorted({ref["secret"] for ref in secret_env_references(plan).values() if "secret" in ref})


def engine_env_secret(ctx: Context) -> K8sObject | None:
    """The Secret of the Pulumi-secret-backed engine variables (placeholders here; values only in Pulumi)."""
    keys = env_pulumi_secrets(ctx.plan)
    if not keys:
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(ctx, ENGINE_ENV_SECRET_NAME, "cluster"),
        "type": "Opaque",
        "stringData": {key: secret_placeholder(key) for key in keys},
    }


def engine_secret_env(plan: Plan) -> list[dict[str, Any]]:
    """Container env entries of the Secret-backed engine variables: ``valueFrom.secretKeyRef``, never a value."""
    out = []
    for name, ref in secret_env_references(plan).items():
        if "secret" in ref:
            key_ref = {"name": ENGINE_ENV_SECRET_NAME, "key": ref["secret"]}
        else:
            key_ref = {"name": ref["secretKeyRef"]["name"], "key": ref["secretKeyRef"]["key"]}
        out.append({"name": name, "valueFrom": {"secretKeyRef": key_ref}})
    return out


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
    def runtime_image(self) -> str:
        """The kit's image as the stack names it; the Pulumi program pins a build's digest (deploy/image.py)."""
        return configured_reference(self.plan.config)

    @property
    def image_pull_secrets(self) -> list[dict[str, str]]:
        """``imagePullSecrets`` of every pod (empty unless the secret is configured)."""
        return [{"name": IMAGE_PULL_SECRET_NAME}] if IMAGE_PULL_SECRET in self.secrets else []

    @property
    def engine_secret_env(self) -> list[dict[str, Any]]:
        """Engine container env of ``engine.extra_env``'s Secret references (:func:`engine_secret_env`)."""
        return engine_secret_env(self.plan)


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


def balanced_instances(ctx: Context) -> list[Any]:
    """Instances the balancer serves: the decode stage (one EP shape), when it is expert-parallel."""
    return [i for i in ctx.plan.by_role("decode") if i.ep > 1]


def simulator_admin_token(ctx: Context) -> bool:
    """True when the kind simulators get an admin token: simulated, a balancer to use it, and the secret set.

    Without it the simulators' admin API stays closed (every /admin call is refused).
    """
    return ctx.simulated and bool(balanced_instances(ctx)) and SIM_ADMIN_SECRET in ctx.secrets


def simulator_admin_token_env() -> dict[str, Any]:
    """The container env entry carrying the simulator admin token (from its Secret, never inline)."""
    return {"name": SIM_ADMIN_TOKEN_ENV,
            "valueFrom": {"secretKeyRef": {"name": SIM_ADMIN_SECRET_NAME, "key": SIM_ADMIN_SECRET_KEY}}}


def simulator_admin_secret(ctx: Context) -> K8sObject | None:
    """The Secret holding the simulator admin token (value from Pulumi secret config only)."""
    if not simulator_admin_token(ctx):
        return None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata(ctx, SIM_ADMIN_SECRET_NAME, "balancer"),  # registered with the balancer, its one client
        "type": "Opaque",
        "stringData": {SIM_ADMIN_SECRET_KEY: secret_placeholder(SIM_ADMIN_SECRET)},
    }


def pod_security() -> dict[str, Any]:
    """Container securityContext of the kit's own pods (and the simulator on kind): PSS "restricted".

    The runtime image's non-root user, no privilege escalation, no capabilities, the runtime's
    default seccomp profile and a read-only root filesystem (``/tmp`` is an emptyDir, :func:`tmp_volume`).
    """
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": RUNTIME_UID,
        "runAsGroup": RUNTIME_GID,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def tmp_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, volumeMount) of a small writable ``/tmp`` for containers with a read-only root filesystem."""
    return ({"name": TMP_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": TMP_VOLUME, "mountPath": "/tmp"})
