"""Read a stack file and its inventory into typed models, with errors that name the key.

The CLI and the Pulumi program both call :func:`load_stack`, so they read the
same files the same way.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ascend_runtime.config.errors import ConfigError, Problem
from ascend_runtime.config.inventory import Inventory
from ascend_runtime.config.stack import PROJECT, Stack, StackConfig

#: Keys whose values are secrets: set them with `pulumi config set --secret`; never read here.
SECRET_KEYS = ("image_pull_credentials", "model_source_credentials")

DEFAULT_STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"


def stacks_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The stacks directory: explicit, else $ASCEND_DEPLOY_STACKS, else the project's stacks/."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("ASCEND_DEPLOY_STACKS")
    return Path(env) if env else DEFAULT_STACKS_DIR


def available_stacks(directory: Path | None = None) -> list[str]:
    """Names of the stacks defined in ``directory``."""
    base = directory or stacks_dir()
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in base.glob("Pulumi.*.yaml"))


def _read_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError.single(what, f"file not found: {path}", hint="check the name and the stacks directory") from None
    except yaml.YAMLError as exc:
        raise ConfigError.single(what, f"not valid YAML: {exc}", source=str(path)) from None


def _field_names(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names valid at ``loc`` (for 'did you mean' hints)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        fields = getattr(current, "model_fields", None)
        if not fields or part not in fields:
            return []
        annotation = fields[part].annotation
        args = getattr(annotation, "__args__", ())
        candidates = [annotation, *args]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


def problems_from_validation(
    exc: ValidationError, model: type[BaseModel], prefix: str = ""
) -> list[Problem]:
    """Translate pydantic errors into problems with dotted key paths and fixes."""
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = prefix + ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            valid = _field_names(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
            problems.append(Problem(path, "unknown key", None, hint))
        elif err["type"] == "missing":
            problems.append(Problem(path, "required key is missing", None, "add it to the stack"))
        else:
            shown = value if isinstance(value, (int, float, str, bool)) else None
            problems.append(Problem(path, err["msg"], shown))
    return problems


def parse_stack_config(raw_config: dict[str, Any], source: str = "") -> tuple[StackConfig, tuple[str, ...]]:
    """Validate the ``config:`` map of a stack file; returns the model and the secret keys present."""
    ours: dict[str, Any] = {}
    secrets: list[str] = []
    for key, value in raw_config.items():
        namespace, sep, name = str(key).partition(":")
        if not sep:
            raise ConfigError.single(str(key), "config keys need a namespace", hint=f"write {PROJECT}:{key}", source=source)
        if namespace != PROJECT:
            continue
        if name in SECRET_KEYS or (isinstance(value, dict) and "secure" in value):
            secrets.append(name)
            continue
        ours[name] = value
    try:
        return StackConfig.model_validate(ours), tuple(sorted(secrets))
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, StackConfig), source) from None


def parse_inventory(raw: Any, source: str = "") -> Inventory:
    """Validate an inventory document; key paths start with ``inventory.``."""
    try:
        return Inventory.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(problems_from_validation(exc, Inventory, prefix="inventory."), source) from None


def read_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and validate one inventory file; raises ConfigError naming the key."""
    return parse_inventory(_read_yaml(Path(path), "inventory"), str(path))


def load_stack(name: str, directory: str | os.PathLike[str] | None = None) -> Stack:
    """Load ``Pulumi.<name>.yaml`` and the inventory it names; raises :class:`ConfigError`."""
    base = stacks_dir(directory)
    stack_file = base / f"Pulumi.{name}.yaml"
    if not stack_file.exists():
        known = ", ".join(available_stacks(base)) or "none"
        raise ConfigError.single("stack", f"no stack named {name!r} in {base}", hint=f"known stacks: {known}")
    document = _read_yaml(stack_file, "stack")
    if not isinstance(document, dict) or not isinstance(document.get("config", {}), dict):
        raise ConfigError.single("config", "the stack file needs a `config:` mapping", source=str(stack_file))
    config, secrets = parse_stack_config(document.get("config", {}), str(stack_file))
    inventory_file = (base / config.inventory).resolve()
    inventory = read_inventory(inventory_file)
    return Stack(
        name=name,
        config=config,
        inventory=inventory,
        stack_file=str(stack_file),
        inventory_file=str(inventory_file),
        secret_keys=secrets,
    )
