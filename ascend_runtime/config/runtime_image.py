"""The kit's runtime image (proxy, balancer, fault watcher, P:D planner, checks, the simulator on kind).

``kubernetes.runtime_image`` is one of:

- a build, ``{build: {registry, repository, tag, platforms}}``: ``pulumi up`` builds the repository's
  Dockerfile, pushes it to ``registry/repository:tag`` (credentials from the stack's Pulumi secrets
  :data:`REGISTRY_SECRETS`) and every kit pod runs ``registry/repository@<digest>`` of that push
  (``ascend_runtime/deploy/image.py``). ``render`` has no build and writes ``registry/repository:tag``;
- a prebuilt reference, ``REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]``: on the ``kubernetes`` target it must
  name a registry host (a node cannot pull ``name:tag`` from nowhere) and should carry a digest;
- unset: refused on the ``kubernetes`` target; on ``kind`` :data:`KIND_LOADED_IMAGE`, an image
  ``kind load docker-image`` put on the nodes.

Functions here read the stack's config as the Plan holds it (``Plan.config``, plain JSON data).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidatorFunctionWrapHandler, WrapValidator, field_validator

from ascend_runtime.config.errors import ImageRef, invalid

#: Stack key of the runtime image (the path every refusal names).
RUNTIME_IMAGE_KEY = "kubernetes.runtime_image"
#: Pulumi secrets the build logs in to its registry with (``pulumi config set --secret``); never in the stack file.
REGISTRY_USERNAME_SECRET = "runtime_image_registry_username"
REGISTRY_PASSWORD_SECRET = "runtime_image_registry_password"
REGISTRY_SECRETS = (REGISTRY_USERNAME_SECRET, REGISTRY_PASSWORD_SECRET)
#: The image a kind stack without ``runtime_image`` runs: built and ``kind load``-ed by hand (docs/kubernetes.md).
KIND_LOADED_IMAGE = "ascend-deploy-runtime:dev"
#: Platforms the build may target: those of the Dockerfile's base image (python:3.11-slim) that Ascend hosts use
#: (Kunpeng servers are linux/arm64; x86 control or CPU nodes linux/amd64).
Platform = Literal["linux/amd64", "linux/arm64"]

# the distribution reference grammar's pieces (config/errors.py ImageRef holds the whole of it)
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?)*"
                   r"|\[[0-9A-Fa-f:]+\])(?::[0-9]{1,5})?\Z")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*\Z")
_TAG = re.compile(r"[\w][\w.-]{0,127}\Z")
_DIGEST = re.compile(r"@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}\Z")
#: How a runtime image names its registry, for hints.
EXAMPLE_REGISTRY = "swr.cn-north-4.myhuaweicloud.com"


def is_registry_host(text: str) -> bool:
    """A registry host as the distribution reference grammar tells one from a path component: a domain with a
    dot, a ``host:port`` or ``localhost`` (``myorg`` alone would mean Docker Hub's ``docker.io/myorg``)."""
    return bool(_HOST.match(text)) and ("." in text or ":" in text or text == "localhost")


def registry_of(reference: str) -> str | None:
    """The registry host a reference names (``swr.cn-north-4.myhuaweicloud.com/org/img:1`` -> the host), or None."""
    first, slash, _ = reference.partition("/")
    return first if slash and is_registry_host(first) else None


def has_digest(reference: str) -> bool:
    """True when the reference pins a digest (``...@sha256:<hex>``)."""
    return bool(_DIGEST.search(reference))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RuntimeImageBuildSpec(_Strict):
    """Where ``pulumi up`` pushes the image it builds from the repository's Dockerfile."""

    registry: str = Field(description=f"Registry host[:port] to push to, e.g. {EXAMPLE_REGISTRY} (Huawei Cloud SWR) "
                          "or localhost:5001 (kind's local registry).")
    repository: str = Field(description="Repository path in the registry (lowercase), e.g. "
                            "<organization>/ascend-deploy-runtime.")
    tag: str = Field("latest", description="Tag pushed with the image; pods run it by digest, never by tag.")
    platforms: list[Platform] | None = Field(
        None, description="Platforms to build (linux/amd64, linux/arm64); null: the build host's own. Kunpeng "
        "(Atlas 800I A2, CM384) nodes need linux/arm64.")

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str) -> str:
        if not is_registry_host(value):
            raise invalid("not a registry host (a domain with a dot, a host:port, or localhost)",
                          f"e.g. {EXAMPLE_REGISTRY!r}")
        return value

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        if len(value) > 200 or not _REPOSITORY.match(value):
            raise invalid("not a repository path (lowercase letters, digits, '.', '_', '-' in '/'-separated parts)",
                          "e.g. 'my-org/ascend-deploy-runtime'")
        return value

    @field_validator("tag")
    @classmethod
    def _tag(cls, value: str) -> str:
        if not _TAG.match(value):
            raise invalid("not an image tag (letters, digits, '_', '.', '-'; at most 128, not starting with '.' or '-')",
                          "e.g. '0.1.0'")
        return value

    @field_validator("platforms")
    @classmethod
    def _platforms(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or len(set(value)) != len(value)):
            raise invalid("list each platform once, at least one", "e.g. [linux/arm64, linux/amd64], or null")
        return value


class RuntimeImageBuild(_Strict):
    """``runtime_image: {build: {...}}``: built and pushed by ``pulumi up``, pinned by digest."""

    build: RuntimeImageBuildSpec = Field(description="Registry, repository, tag and platforms of the build.")


_REFERENCE: TypeAdapter[str] = TypeAdapter(ImageRef, config=ConfigDict(strict=True))


def _one_form(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Validate the mapping as a build and anything else as a reference, so an error's path is the key's own
    (``kubernetes.runtime_image.build.registry``), without the union's member names pydantic would add."""
    if value is None or isinstance(value, RuntimeImageBuild):
        return value
    if isinstance(value, dict):
        return RuntimeImageBuild.model_validate(value)
    return _REFERENCE.validate_python(value)


#: Type of ``kubernetes.runtime_image``.
RuntimeImage = Annotated[ImageRef | RuntimeImageBuild | None, WrapValidator(_one_form)]

_FIX = (f"build it from the repository: runtime_image: {{build: {{registry: {EXAMPLE_REGISTRY}, repository: "
        "<organization>/ascend-deploy-runtime}} (`pulumi up` pushes it and pins its digest), or name a prebuilt "
        "image with its registry, REGISTRY/REPOSITORY@sha256:<digest>")


def runtime_image_problem(target: str, image: str | RuntimeImageBuild | None) -> tuple[str, str] | None:
    """Why ``target`` cannot pull ``image`` (message, fix), or None.

    Only the ``kubernetes`` target is held to it: kind can run an image ``kind load`` put on its nodes, and the
    local target runs no image.
    """
    if target != "kubernetes" or isinstance(image, RuntimeImageBuild):
        return None
    if image is None:
        return "is not set: the kubernetes target pulls the kit's runtime image from a registry", _FIX
    if registry_of(image) is None:
        return (f"{image!r} names no registry, so no node can pull it (Kubernetes would look for it on Docker Hub)",
                _FIX)
    return None


def build_spec(config: dict[str, Any]) -> dict[str, Any] | None:
    """The ``build`` block of a stack config (``Plan.config``), or None for a prebuilt or unset image."""
    image = config["kubernetes"].get("runtime_image")
    return image["build"] if isinstance(image, dict) else None


def repository_of(spec: dict[str, Any]) -> str:
    """``registry/repository`` of a build."""
    return f"{spec['registry']}/{spec['repository']}"


def configured_reference(config: dict[str, Any]) -> str:
    """The image the objects carry: a build's ``registry/repository:tag`` (the Pulumi program pins its digest),
    a prebuilt reference as written, or :data:`KIND_LOADED_IMAGE` when unset."""
    spec = build_spec(config)
    if spec is not None:
        return f"{repository_of(spec)}:{spec['tag']}"
    return config["kubernetes"].get("runtime_image") or KIND_LOADED_IMAGE


def pinned_reference(spec: dict[str, Any], digest: str) -> str:
    """``registry/repository@digest``: what every kit pod runs once the build is pushed."""
    return f"{repository_of(spec)}@{digest}"


def simulator_image(config: dict[str, Any]) -> str:
    """The image of the simulated engines on kind: ``simulator.image``, by default the runtime image."""
    return config["simulator"].get("image") or configured_reference(config)


def digest_warning(config: dict[str, Any]) -> str | None:
    """A warning for a prebuilt runtime image without a digest on the kubernetes target, or None."""
    image = config["kubernetes"].get("runtime_image")
    if config.get("target") != "kubernetes" or not isinstance(image, str) or has_digest(image):
        return None
    return (f"{RUNTIME_IMAGE_KEY} {image!r} carries no digest: each node runs whatever the tag points to when it "
            f"pulls; pin it as {image}@sha256:<digest> (`docker buildx imagetools inspect {image}`)")
