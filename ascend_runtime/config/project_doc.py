"""Generate the documented ``config:`` block of Pulumi.yaml from the stack models.

Pulumi's project config accepts ``type`` only for string, integer, boolean and
array values; object-valued keys (``prefill``, ``engine``, ...) are therefore
documented by a description listing each nested key with its type and
default. A test keeps Pulumi.yaml equal to this output; regenerate with
``python -m ascend_runtime.config.project_doc > Pulumi.yaml``.
"""

from __future__ import annotations

import json
import sys
import typing
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from ascend_runtime.config.loader import SECRET_KEYS
from ascend_runtime.config.stack import PROJECT, StackConfig

HEADER = f"""name: {PROJECT}
runtime:
  name: python
  options:
    toolchain: pip
description: PD-separated DeepSeek-V3/R1 serving on Huawei Ascend (Atlas 800I A2, CloudMatrix 384) with vLLM-Ascend.
stackConfigDir: stacks
"""


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:  # a checked type (config/errors.py): documented by its base type
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in typing.get_args(annotation))}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: FieldInfo) -> Any:
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    return None


def _pulumi_type(annotation: Any) -> str | None:
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "integer"
    if annotation is str or typing.get_origin(annotation) is typing.Literal:
        return "string"
    return None


def _nested_description(model: type[BaseModel]) -> str:
    lines = []
    for name, field in model.model_fields.items():
        default = _default(field)
        shown = "required" if field.is_required() else f"default {json.dumps(default)}"
        lines.append(f"  {name} ({_type_name(field.annotation)}, {shown}): {field.description or ''}".rstrip())
    return "\n".join(lines)


def config_block() -> dict[str, Any]:
    """The ``config:`` mapping of Pulumi.yaml, one entry per stack key."""
    block: dict[str, Any] = {}
    for name, field in StackConfig.model_fields.items():
        entry: dict[str, Any] = {}
        annotation = field.annotation
        nested = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if nested is not None:
            entry["description"] = f"{field.description} Keys:\n{_nested_description(nested)}"
        else:
            ptype = _pulumi_type(annotation)
            if ptype:
                entry["type"] = ptype
            entry["description"] = f"{field.description} ({_type_name(annotation)})"
            if not field.is_required():
                entry["default"] = _default(field)
        block[f"{PROJECT}:{name}"] = entry
    for secret in SECRET_KEYS:
        block[f"{PROJECT}:{secret}"] = {
            "type": "string",
            "secret": True,
            "description": f"Secret ({secret.replace('_', ' ')}); set with `pulumi config set --secret {secret} ...`. Never rendered.",
        }
    return block


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks so the docs stay readable."""


def _str_representer(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str_representer)


def project_yaml() -> str:
    """The whole Pulumi.yaml text."""
    return HEADER + yaml.dump({"config": config_block()}, Dumper=_BlockDumper, sort_keys=False, width=120)


if __name__ == "__main__":
    sys.stdout.write(project_yaml())
