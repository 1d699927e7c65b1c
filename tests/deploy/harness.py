"""Run the project's ``__main__.py`` under Pulumi's mock runtime and record registrations."""

from __future__ import annotations

import asyncio
import hashlib
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi.runtime.config as pulumi_config

from ascend_runtime.config.runtime_image import build_spec, configured_reference, pinned_reference
from ascend_runtime.deploy.image import IMAGE_RESOURCE, with_image
from ascend_runtime.planner.plan import Plan

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "__main__.py"
PROJECT = "ascend-deepseek"
#: Type token of pulumi-docker-build's Image (pulumi_docker_build/image.py, 0.0.22).
IMAGE_TYPE = "docker-build:index:Image"
#: Mock values of the runtime image build's registry login (Pulumi secrets); every run has them unless told not to.
REGISTRY_CREDENTIALS = {
    f"{PROJECT}:runtime_image_registry_username": "cn-north-4@MOCK-AK",
    f"{PROJECT}:runtime_image_registry_password": "MOCK-registry-login-key",
}


def mock_digest(name: str = IMAGE_RESOURCE) -> str:
    """The digest the mock registry gives the image built as resource ``name``."""
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def pinned_runtime_image(plan: Plan) -> str:
    """What kit pods run under the mocks: a build's ``registry/repository@<mock digest>``, else the reference."""
    spec = build_spec(plan.config)
    return configured_reference(plan.config) if spec is None else pinned_reference(spec, mock_digest())


def unpinned(objs: list[dict[str, Any]], plan: Plan) -> list[dict[str, Any]]:
    """Registered objects as ``render`` writes them: the pinned runtime image back to the stack's tag reference."""
    return with_image(objs, pinned_runtime_image(plan), configured_reference(plan.config))


@dataclass
class Registered:
    """One resource the program registered or read: Pulumi type token, logical name, inputs.

    ``custom``: a custom resource (a Kubernetes object the program manages); ``read_id``: the id of an
    existing resource the program only reads (``Resource.get``); remote components (``yaml.v2.ConfigFile``)
    are neither.
    """

    typ: str
    name: str
    inputs: dict[str, Any]
    custom: bool = True
    read_id: str | None = None

    @property
    def is_k8s(self) -> bool:
        """A Kubernetes object the program creates (not a read, not a provider-side component)."""
        return self.typ.startswith("kubernetes:") and self.custom and self.read_id is None


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that record every resource and echo its inputs as its state; a read (``Resource.get``) answers
    ``read_states[(type token, id)]`` when given (the live object), else nothing."""

    def __init__(self, read_states: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.resources: list[Registered] = []
        self.read_states = dict(read_states or {})

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        # the mock monitor passes a read's id (Resource.get) as resource_id, with custom unset
        read_id = args.resource_id if args.resource_id and not args.custom else None
        self.resources.append(Registered(args.typ, args.name, dict(args.inputs), bool(args.custom), read_id))
        if args.typ == IMAGE_TYPE:  # the provider's output after a push: the manifest's digest
            return args.name + "_id", {**args.inputs, "digest": mock_digest(args.name)}
        if read_id is not None and (args.typ, read_id) in self.read_states:
            return read_id, self.read_states[(args.typ, read_id)]
        return (read_id or args.name + "_id"), args.inputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        return {}, None


#: Marker of a secret value in Pulumi's wire format.
SECRET_SIG = "4dabf18193072939515e22adb298388d"


def normalize(value: Any) -> Any:
    """Integral floats back to ints (the Pulumi wire format has only doubles); secrets unwrapped."""
    if isinstance(value, dict) and SECRET_SIG in value:
        return normalize(value["value"])
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


@dataclass
class Run:
    """The outcome of one program run."""

    stack: str
    resources: list[Registered]
    error: BaseException | None = None
    exports: dict[str, Any] = field(default_factory=dict)

    @property
    def k8s_objects(self) -> list[dict[str, Any]]:
        """Registered Kubernetes objects as plain data."""
        return [normalize(r.inputs) for r in self.resources if r.is_k8s]

    @property
    def reads(self) -> list[Registered]:
        """Existing resources the program read (``Resource.get``)."""
        return [r for r in self.resources if r.read_id is not None]


def run_stack(stack: str, config: dict[str, str] | None = None, secret_keys: list[str] | None = None,
              registry_credentials: bool = True,
              read_states: dict[tuple[str, str], dict[str, Any]] | None = None) -> Run:
    """Run __main__.py for ``stack`` under mocks; returns what it registered (and any error).

    ``registry_credentials``: the stack's Pulumi config has :data:`REGISTRY_CREDENTIALS` (secrets) too;
    ``read_states``: what reads of existing objects answer (:class:`RecordingMocks`).
    """
    if registry_credentials:
        config = {**REGISTRY_CREDENTIALS, **(config or {})}
        secret_keys = [*REGISTRY_CREDENTIALS, *(secret_keys or [])]
    # pytest-asyncio tests close their loops; Pulumi's runtime needs a current one.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    mocks = RecordingMocks(read_states)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False)
    pulumi_config.set_all_config(dict(config or {}), list(secret_keys or []))
    exports: dict[str, Any] = {}
    original_export = pulumi.export
    result = Run(stack, mocks.resources, exports=exports)

    @pulumi.runtime.test
    def program() -> None:
        try:
            runpy.run_path(str(MAIN), run_name="__main__")
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            result.error = exc

    def export(name: str, value: Any) -> None:
        exports[name] = value
        if isinstance(value, pulumi.Output):  # resolved while the program runs (a build's pinned image)
            value.apply(lambda resolved: exports.__setitem__(name, resolved))

    pulumi.export = export  # type: ignore[assignment]
    try:
        program()
    except Exception as exc:  # noqa: BLE001 - a registration that failed after the program returned (an Output's check)
        result.error = result.error or exc
    finally:
        pulumi.export = original_export  # type: ignore[assignment]
        pulumi_config.set_all_config({}, [])
        asyncio.set_event_loop(None)
        loop.close()
    return result
