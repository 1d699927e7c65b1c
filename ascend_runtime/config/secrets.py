"""Secrets of a stack: which keys are secret, how ``engine.extra_env`` references one, what is refused.

A secret value never enters the stack model, the Plan or a rendered file:

- the kit's own secrets (:data:`SECRET_KEYS`) and every secret an
  ``extra_env`` variable references are Pulumi secrets of the stack
  (``pulumi config set --secret``, a ``secure:`` value in the stack file);
- an ``engine.extra_env`` value is a plain string or a reference:
  ``{secret: <pulumi config key>}`` (a Pulumi secret of the stack, which the
  program copies into the kit's ``engine-env`` Secret) or
  ``{secretKeyRef: {name: <Secret>, key: <key>}}`` (an existing Kubernetes
  Secret of the namespace). Engine pods get a reference as
  ``valueFrom.secretKeyRef``; the Plan and the rendered files carry only the
  reference;
- a variable whose name looks secret (:func:`looks_secret`) with a plaintext
  value is refused, and so is a plaintext value of a secret stack key; the
  error gives the ``pulumi config set --secret`` command and never the value.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_core import PydanticCustomError

from ascend_runtime.config.runtime_image import REGISTRY_SECRETS

PROJECT = "ascend-deepseek"  # the project's Pulumi config namespace (config.stack.PROJECT)

#: Stack keys whose values are secrets: set with `pulumi config set --secret`; never read into the model.
SECRET_KEYS = (
    "image_pull_credentials", "model_source_credentials", "simulator_admin_token", "proxy_admin_token",
    *REGISTRY_SECRETS,  # the runtime image build's registry login (config/runtime_image.py)
)
#: A name containing one of these words (any case) is taken to hold a secret.
SECRET_WORDS = ("TOKEN", "KEY", "PASSWORD", "SECRET", "CREDENTIAL")
#: pydantic error type of extra_env problems; ``ctx["problems"]`` lists (variable, message, hint).
EXTRA_ENV_ERROR = "extra_env"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# a Pulumi config key that is also a valid Kubernetes Secret data key ([-._a-zA-Z0-9]+)
_CONFIG_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,252}\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_SECRET_DATA_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}\Z")
_REFERENCE_FORMS = "{secret: <pulumi config key>} or {secretKeyRef: {name: <Secret>, key: <key>}}"


def looks_secret(name: str) -> bool:
    """True when ``name`` contains TOKEN, KEY, PASSWORD, SECRET or CREDENTIAL (case-insensitive)."""
    upper = str(name).upper()
    return any(word in upper for word in SECRET_WORDS)


def secret_config_name(env_name: str) -> str:
    """The Pulumi config key suggested for a variable's secret (``HF_TOKEN`` -> ``hf_token``)."""
    return str(env_name).lower()


def set_secret_command(name: str) -> str:
    """The command that stores a secret of the stack; ``<value>`` is left for the operator to fill in."""
    return f"pulumi config set --secret {PROJECT}:{name} <value>"


def _check_reference(ref: dict[Any, Any], reserved: set[str]) -> tuple[dict[str, Any] | None, str, str]:
    """(normalized reference, message, hint); the reference is None when invalid."""
    if set(ref) == {"secret"}:
        name = ref["secret"]
        if not isinstance(name, str) or not _CONFIG_NAME.match(name):
            if isinstance(name, str) and name.startswith(f"{PROJECT}:"):
                return None, "the secret reference names a namespaced key", f"write the key without {PROJECT}:"
            return None, "the secret reference needs a Pulumi config key ([A-Za-z0-9_.-]+)", "e.g. {secret: hf_token}"
        if name in reserved:
            return None, f"{name!r} is a stack setting, not a secret", "name a key of its own, e.g. {secret: hf_token}"
        return {"secret": name}, "", ""
    if set(ref) == {"secretKeyRef"} and isinstance(ref["secretKeyRef"], dict):
        inner = ref["secretKeyRef"]
        if set(inner) != {"name", "key"}:
            return None, "secretKeyRef needs exactly `name` and `key`", "write {secretKeyRef: {name: <Secret>, key: <key>}}"
        name, key = inner["name"], inner["key"]
        if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            return None, "secretKeyRef.name is not a Kubernetes Secret name (DNS-1123 subdomain)", "e.g. hf-credentials"
        if not isinstance(key, str) or not _SECRET_DATA_KEY.match(key):
            return None, "secretKeyRef.key is not a Secret data key ([-._a-zA-Z0-9]+)", "e.g. token"
        return {"secretKeyRef": {"name": name, "key": key}}, "", ""
    if "secure" in ref:
        return None, "a Pulumi secret nested in engine.extra_env is not read", (
            "store it as a top-level secret (`pulumi config set --secret ascend-deepseek:<key> <value>`) "
            "and write {secret: <key>}")
    return None, "not a secret reference", f"write a string or {_REFERENCE_FORMS}"


def check_extra_env(raw: Any) -> Any:
    """Validate ``engine.extra_env`` (names, values, references); returns it normalized.

    Raises a pydantic error of type :data:`EXTRA_ENV_ERROR` whose ``problems``
    name each variable; no problem carries a value.
    """
    if not isinstance(raw, dict):
        return raw  # the field's type check reports it
    from ascend_runtime.config.stack import StackConfig

    reserved = set(StackConfig.model_fields)
    out: dict[str, Any] = {}
    problems: list[tuple[str, str, str]] = []
    for key, value in raw.items():
        name = str(key)
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            problems.append((name, "not an environment variable name",
                             "use letters, digits and _, not starting with a digit"))
            continue
        if isinstance(value, str):
            if looks_secret(key):
                config_name = secret_config_name(key)
                problems.append((
                    name,
                    "the name looks secret but the value is plaintext; secrets are never written into a stack",
                    f"store it as a Pulumi secret with `{set_secret_command(config_name)}` and write "
                    f"engine.extra_env.{key}: {{secret: {config_name}}} (or a {{secretKeyRef: ...}} to an existing Secret)",
                ))
                continue
            out[key] = value
        elif isinstance(value, dict):
            ref, message, hint = _check_reference(value, reserved)
            if ref is None:
                problems.append((name, message, hint))
                continue
            out[key] = ref
        else:
            problems.append((name, "the value must be a string (quote it in YAML) or a secret reference",
                             f"write \"...\" or {_REFERENCE_FORMS}"))
    if problems:
        raise PydanticCustomError(
            EXTRA_ENV_ERROR, "invalid engine.extra_env entries: {names}",
            {"names": ", ".join(p[0] for p in problems), "problems": problems},
        )
    return out


def plain_env(extra_env: dict[str, Any] | None) -> dict[str, str]:
    """The plain-string variables of ``engine.extra_env`` (Plan config data)."""
    return {k: v for k, v in (extra_env or {}).items() if isinstance(v, str)}


def env_references(extra_env: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The Secret-backed variables of ``engine.extra_env``: name -> reference (never a value)."""
    return {k: v for k, v in (extra_env or {}).items() if isinstance(v, dict)}


def referenced_pulumi_secrets(extra_env: dict[str, Any] | None) -> dict[str, str]:
    """Variable name -> Pulumi config key, for every ``{secret: ...}`` reference."""
    return {k: v["secret"] for k, v in env_references(extra_env).items() if "secret" in v}
