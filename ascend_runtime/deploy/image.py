"""The kit's runtime image in the Pulumi program: built from the repository's Dockerfile, pushed, pinned by digest.

With ``kubernetes.runtime_image: {build: ...}`` the program registers one ``docker-build:index:Image``
(pulumi-docker-build, the provider Pulumi maintains for BuildKit builds) before any Kubernetes object, and
every ``image`` of the objects that names the build's ``registry/repository:tag`` becomes
``registry/repository@<digest>`` of that push: a pod runs exactly what this update built, and a pod that
needs the image waits for the push (the reference is an Output of the Image resource). A prebuilt reference
is left as the stack names it. ``render`` has no Pulumi and writes the tag reference
(``config/runtime_image.py`` ``configured_reference``).

Argument and output names are those of pulumi-docker-build 0.0.22 (``pulumi_docker_build/image.py``:
``Image(context=, dockerfile=, tags=, push=, platforms=, registries=)``, output ``digest``, "a SHA256 digest of the
image if it was exported to a registry"; ``_inputs.py``: ``BuildContextArgs.location``, ``DockerfileArgs.location``,
``RegistryArgs(address, username, password)``).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_docker_build as docker_build

from ascend_runtime.config.errors import ConfigError, Problem
from ascend_runtime.config.runtime_image import (
    REGISTRY_PASSWORD_SECRET,
    REGISTRY_SECRETS,
    REGISTRY_USERNAME_SECRET,
    RUNTIME_IMAGE_KEY,
    build_spec,
    configured_reference,
    digest_warning,
    pinned_reference,
)
from ascend_runtime.config.secrets import set_secret_command
from ascend_runtime.planner.plan import Plan

#: Pulumi logical name of the build.
IMAGE_RESOURCE = "runtime-image"
#: Build context and Dockerfile, relative to the project directory Pulumi runs the program in (Pulumi.yaml's);
#: ``.dockerignore`` keeps the context to what the Dockerfile copies.
BUILD_CONTEXT = "."
DOCKERFILE = "Dockerfile"


def require_registry_secrets(plan: Plan) -> None:
    """A build on the kubernetes target logs in with the stack's Pulumi secrets, never the host's own docker login;
    raises ConfigError before any resource when one is missing, naming the command (never a value).

    kind pushes to its local registry, which needs no login (the secrets are used when set).
    """
    spec = build_spec(plan.config)
    if spec is None or plan.target != "kubernetes":
        return
    config = pulumi.Config()
    problems = [
        Problem(key, f"is not set; {RUNTIME_IMAGE_KEY}.build pushes to {spec['registry']} with it", None,
                f"run `{set_secret_command(key)}`")
        for key in REGISTRY_SECRETS if config.get_secret(key) is None
    ]
    if problems:
        raise ConfigError(problems, f"stack {plan.stack}")


def _registries(registry: str) -> list[dict[str, Any]] | None:
    """The registry login of the build from the Pulumi secrets (Outputs marked secret), or None when unset."""
    config = pulumi.Config()
    username, password = (config.get_secret(k) for k in (REGISTRY_USERNAME_SECRET, REGISTRY_PASSWORD_SECRET))
    if username is None or password is None:
        return None
    return [{"address": registry, "username": username, "password": password}]


def build_runtime_image(plan: Plan, opts: pulumi.ResourceOptions | None = None) -> docker_build.Image | None:
    """Register the build of a stack whose runtime image is ``{build: ...}`` (None otherwise)."""
    spec = build_spec(plan.config)
    if spec is None:
        return None
    return docker_build.Image(
        IMAGE_RESOURCE,
        context={"location": BUILD_CONTEXT},
        dockerfile={"location": DOCKERFILE},
        tags=[configured_reference(plan.config)],
        push=True,
        platforms=spec.get("platforms"),
        registries=_registries(spec["registry"]),
        opts=opts,
    )


def pinned_image(plan: Plan, image: docker_build.Image | None) -> pulumi.Input[str]:
    """What kit pods run: ``registry/repository@<digest>`` of the build, or the prebuilt reference as written."""
    if image is None:
        warning = digest_warning(plan.config)
        if warning:
            pulumi.log.warn(warning)
        return configured_reference(plan.config)
    spec = build_spec(plan.config)
    assert spec is not None
    return image.digest.apply(lambda digest: pinned_reference(spec, digest))


def with_image(value: Any, configured: str, pinned: pulumi.Input[str]) -> Any:
    """``value`` (object data) with every ``image: <configured>`` replaced by ``pinned``; other data as it is."""
    if isinstance(value, dict):
        return {k: pinned if k == "image" and v == configured else with_image(v, configured, pinned)
                for k, v in value.items()}
    if isinstance(value, list):
        return [with_image(v, configured, pinned) for v in value]
    return value
