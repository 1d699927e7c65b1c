"""Read a stack file and its inventory into typed models, with errors that name the key.

The CLI and the Pulumi program both call :func:`load_stack`, so they read the
same files the same way. Every way a file can be wrong is a
:class:`ConfigError` (exit 2), never a traceback: missing, a directory or
another non-regular file, unreadable, too large, not UTF-8, a YAML syntax
error (with its line), a key given twice, empty, or not a mapping. An error
never quotes the file: values are cut to ``VALUE_LIMIT`` characters and a
document that is not a mapping is described by its type only.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ascend_runtime.config.errors import (
    VALUE_ERROR,
    ConfigError,
    Problem,
    is_dns_label,
    shorten,
    suggest_label,
)
from ascend_runtime.config.inventory import Inventory
from ascend_runtime.config.pulumi_sentinels import sentinel_problems
from ascend_runtime.config.secrets import (
    EXTRA_ENV_ERROR,
    SECRET_KEYS,
    looks_secret,
    referenced_pulumi_secrets,
    set_secret_command,
)
from ascend_runtime.config.ssh_endpoints import ssh_endpoint_problems
from ascend_runtime.config.stack import ENV_NAME_ERROR, PROJECT, Stack, StackConfig
from ascend_runtime.config.yaml_rules import node_problems
from ascend_runtime.files import read as files

__all__ = ["SECRET_KEYS", "load_stack", "parse_inventory", "parse_stack_config", "read_inventory"]

DEFAULT_STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"
#: Top-level keys of a Pulumi stack file (``Pulumi.<stack>.yaml``).
STACK_FILE_KEYS = ("config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment")
#: Longest part of an unknown key compared with the valid ones for a "did you mean" (no key is longer).
KEY_MATCH_LIMIT = 100
#: A namespace this close to the project's (edits, case ignored) is taken for a misspelling of it.
NAMESPACE_DISTANCE = 2


def stacks_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The stacks directory: explicit, else $ASCEND_DEPLOY_STACKS, else the project's stacks/."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("ASCEND_DEPLOY_STACKS")
    return Path(env) if env else DEFAULT_STACKS_DIR


def available_stacks(directory: Path | None = None) -> list[str]:
    """Names of the stacks defined in ``directory``."""
    base = directory or stacks_dir()
    try:
        return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in base.glob("Pulumi.*.yaml"))
    except OSError:  # unreadable, a symlink loop, a name too long: no stack can be listed there
        return []


# --- reading files ------------------------------------------------------------------------------


#: The file kind (size cap, fix) of each document the loader reads, by the name its errors use.
_KINDS = {"stack": files.STACK_FILE, "inventory": files.INVENTORY, "playbook": files.PLAYBOOK, "--vars": files.VARS_FILE}


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of a regular file, through the kit's one reading door (:mod:`ascend_runtime.files.read`:
    no FIFO, device or directory, the size capped per kind before reading); ConfigError (path ``what``) for
    anything else."""
    try:
        return files.read_text(path, _KINDS.get(what, files.STACK_FILE))
    except files.FileRefused as exc:
        if exc.missing:
            raise ConfigError.single(what, f"file not found: {path}", hint="check the name and the stacks directory",
                                     source=str(path)) from None
        raise ConfigError.single(what, exc.message, hint=exc.hint, source=str(path)) from None


def _node_path(path: tuple[Any, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


#: libyaml's safe loader when PyYAML has it (same documents, marks and errors, ten times faster).
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: Deepest nesting of mappings and lists a stack, inventory or input file may have (the committed ones nest 5 deep).
MAX_YAML_DEPTH = 64


def _first_event_past(loader_class: type, text: str, limit: int) -> yaml.Mark | None:
    """Where the first mapping or list deeper than ``limit`` starts, read from ``loader_class``'s parser events
    (produced without recursion, before anything is composed); None when the document stays within it."""
    loader = loader_class(text)
    depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > limit:
                    return event.start_mark
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
        return None
    finally:
        loader.dispose()


def too_deep_at(text: str, limit: int = MAX_YAML_DEPTH) -> yaml.Mark | None:
    """The position (0-based line and column) where ``text`` first nests mappings and lists more than ``limit``
    deep, or None.

    The depth is the kit's rule, decided before anything is composed: the C composer recurses once per level
    without a bound and overflows the C stack (a crash, not an exception) on some 50,000 levels, which
    ``- - - - ...`` writes in 100 KB. libyaml's own scanner has a nesting limit of its own in some releases
    (PyYAML 6.0.4 stops flow collections at 1,000 levels, scanning ahead of the parser, with an error of its
    own wording); when the fast scan stops on any YAML error, PyYAML's pure-Python parser, which has no such
    limit, reads the events again, so the answer is the same whichever libyaml is installed. A document that is
    invalid for another reason returns None here and gets its syntax error from the composer."""
    try:
        return _first_event_past(_SAFE_LOADER, text, limit)
    except yaml.YAMLError:
        if _SAFE_LOADER is yaml.SafeLoader:
            return None
    try:
        return _first_event_past(yaml.SafeLoader, text, limit)
    except yaml.YAMLError:
        return None


def deep_nesting_message(mark: yaml.Mark, limit: int = MAX_YAML_DEPTH) -> str:
    """The kit's words for a document nested past ``limit`` at ``mark``."""
    return (f"nested too deeply at line {mark.line + 1}, column {mark.column + 1} "
            f"(more than {limit} levels of mappings and lists)")


def parse_yaml(text: str, what: str, source: str = "", key_path=_node_path) -> Any:
    """One YAML document; ConfigError for a syntax error (line, column), an empty document, nesting deeper than
    :data:`MAX_YAML_DEPTH`, and what :mod:`ascend_runtime.config.yaml_rules` refuses (a key given twice, YAML 1.1
    spellings such as ``0022`` or ``2:30:00``, a number too long to read), each with its key path and line."""
    deep = too_deep_at(text)
    if deep is not None:
        raise ConfigError.single(what, deep_nesting_message(deep), hint="fix the file's structure", source=source)
    loader = _SAFE_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ConfigError.single(what, "the file is empty", hint=f"write the {what} mapping", source=source)
        refused = node_problems(node)
        if refused:
            raise ConfigError([Problem(key_path(p.path) or what, p.message, hint=p.hint) for p in refused], source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        # the parser's own words and the position; never the snippet of the file a YAML error prints
        words = [str(w) for w in (getattr(exc, "context", None), getattr(exc, "problem", None)) if w]
        problem = shorten(", ".join(words) or type(exc).__name__, 100)
        raise ConfigError.single(what, f"not valid YAML: {problem}{where}", hint="fix the YAML syntax there",
                                 source=source) from None
    except RecursionError:
        raise ConfigError.single(what, f"nested too deeply (more than {MAX_YAML_DEPTH} levels of mappings and lists)",
                                 hint="fix the file's structure", source=source) from None
    finally:
        loader.dispose()


def _type_name(value: Any) -> str:
    return {str: "a string", list: "a list", int: "a number", float: "a number", bool: "a boolean", dict: "a mapping",
            type(None): "null"}.get(
        type(value), type(value).__name__)


# --- validation errors --------------------------------------------------------------------------


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
        nested = [a for arg in args for a in getattr(arg, "__args__", ())]  # list[Model] | None
        candidates = [annotation, *args, *nested]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    return list(getattr(current, "model_fields", {}))


_TYPE_HINTS = {
    "int_type": ("a whole number", "write a number without quotes, not true/false"),
    "int_from_float": ("a whole number", "write a whole number"),
    "float_type": ("a number", "write a number without quotes"),
    "bool_type": ("true or false", "write true or false without quotes"),
    "string_type": ("text", "quote it, e.g. \"1.30\""),
    "dict_type": ("a mapping", "write key: value lines"),
    "model_type": ("a mapping", "write key: value lines"),
    "model_attributes_type": ("a mapping", "write key: value lines"),
    "list_type": ("a list", "write a YAML list"),
}


def problems_from_validation(
    exc: ValidationError, model: type[BaseModel], prefix: str = "", where: str = "the stack"
) -> list[Problem]:
    """Translate pydantic errors into problems with dotted key paths, the value cut short, and fixes."""
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = prefix + ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc).replace(".[", "[")
        value = err.get("input")
        shown = value if isinstance(value, (int, float, str, bool)) else None
        ctx = err.get("ctx") or {}
        if err["type"] in (EXTRA_ENV_ERROR, ENV_NAME_ERROR):  # one problem per variable, never its value
            base = path if path.endswith("extra_env") else (f"{path}.extra_env" if path else "engine.extra_env")
            problems += [Problem(f"{base}.{name}", message, None, hint) for name, message, hint in ctx["problems"]]
        elif err["type"] == VALUE_ERROR:
            at = ctx.get("at") or ""
            full = f"{path}.{at}" if path and at else (path or at or prefix.rstrip("."))
            if at and isinstance(value, dict):
                shown = value.get(at) if isinstance(value.get(at), (int, float, str, bool)) else None
            problems.append(Problem(full, ctx["message"], shown, ctx.get("hint", "")))
        elif err["type"] == "extra_forbidden":
            valid = _field_names(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1])[:KEY_MATCH_LIMIT], valid, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
            problems.append(Problem(path, "unknown key", None, hint))
        elif err["type"] == "missing":
            problems.append(Problem(path, "required key is missing", None, f"add it to {where}"))
        elif err["type"] in _TYPE_HINTS:
            expected, hint = _TYPE_HINTS[err["type"]]
            if not loc:
                problems.append(Problem(prefix.rstrip(".") or "document",
                                        f"must be a mapping, got {_type_name(value)}", None, hint))
            else:
                if err["type"] == "string_type" and not isinstance(value, (int, float)):
                    hint = "write it as text"
                problems.append(Problem(path, f"must be {expected}, got {_type_name(value)}", shown, hint))
        else:
            problems.append(Problem(path or prefix.rstrip("."), err["msg"], shown, _constraint_hint(err["type"], ctx)))
    return problems


def _constraint_hint(kind: str, ctx: dict[str, Any]) -> str:
    """The fix of a failed pydantic constraint (bounds, pattern, choices)."""
    if kind == "greater_than_equal":
        return f"use {ctx['ge']} or more"
    if kind == "greater_than":
        return f"use more than {ctx['gt']}"
    if kind == "less_than_equal":
        return f"use {ctx['le']} or less"
    if kind == "less_than":
        return f"use less than {ctx['lt']}"
    if kind in ("string_pattern_mismatch", "string_too_short", "string_too_long"):
        return "see the key's description in Pulumi.yaml"
    if kind == "literal_error":
        return f"write one of {ctx.get('expected', 'the listed values')}"
    if kind == "finite_number":
        return "write a finite number (.inf and .nan are no value here)"
    if kind == "invalid_key":  # a mapping key that is not text
        return "write the key as text"
    return ""


# --- stack config -------------------------------------------------------------------------------


def _distance(a: str, b: str) -> int:
    """Levenshtein distance (insert, delete, substitute)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def misspelt_namespace(namespace: str) -> bool:
    """True when ``namespace`` is not the project's but within two edits of it (case ignored).

    A length that differs from the project's by more than two is more than two edits away, so the distance
    (quadratic in the lengths) is only computed for names of about the project's length."""
    if namespace == PROJECT or abs(len(namespace) - len(PROJECT)) > NAMESPACE_DISTANCE:
        return False
    return _distance(namespace.lower(), PROJECT) <= NAMESPACE_DISTANCE


def _is_secure(value: Any) -> bool:
    """A Pulumi secret in a stack file: ``{secure: <ciphertext>}``."""
    return isinstance(value, dict) and "secure" in value


def parse_stack_config(raw_config: dict[str, Any], source: str = "") -> tuple[StackConfig, tuple[str, ...]]:
    """Validate the ``config:`` map of a stack file; returns the model and the secret keys present.

    Keys of other namespaces (``kubernetes:context``) are left to their
    providers, except a namespace within two edits of the project's
    (``ascend-deepsek:``), which is refused as a misspelling: its keys would be
    silently ignored. Secret values are never read: a ``secure:`` key only
    counts as present. A plaintext value of a secret key (:data:`SECRET_KEYS`,
    or a name that looks secret and is no stack setting) is refused, and so are
    a value spelled like a Pulumi marker (``[secret]``, :mod:`.pulumi_sentinels`)
    and an ``engine.extra_env`` reference to a Pulumi secret the stack does not
    set; the problems give the ``pulumi config set --secret`` command, never
    the value.
    """
    ours: dict[str, Any] = {}
    secrets: list[str] = []
    problems: list[Problem] = []
    for key, value in raw_config.items():
        namespace, sep, name = str(key).partition(":")
        if not sep:
            problems.append(Problem(str(key), "config keys need a namespace", None, f"write {PROJECT}:{key}"))
            continue
        if namespace != PROJECT:
            if misspelt_namespace(namespace):
                problems.append(Problem(str(key), f"namespace {namespace!r} looks like a misspelling of {PROJECT!r}; "
                                        "its keys would be ignored", None, f"write {PROJECT}:{name}"))
            continue
        if _is_secure(value):
            secrets.append(name)
            continue
        if name in SECRET_KEYS or (looks_secret(name) and name not in StackConfig.model_fields):
            problems.append(Problem(name, "is a secret: a plaintext value is refused (it would reach the Plan)", None,
                                    f"remove it from the stack file and run `{set_secret_command(name)}`"))
            continue
        problems += sentinel_problems(value, name)
        ours[name] = value
    try:
        config = StackConfig.model_validate(ours)
    except ValidationError as exc:
        raise ConfigError(problems + problems_from_validation(exc, StackConfig), source) from None
    for env_name, secret in sorted(referenced_pulumi_secrets(config.engine.extra_env).items()):
        if secret not in secrets:
            problems.append(Problem(f"engine.extra_env.{env_name}",
                                    f"references the Pulumi secret {secret!r}, which the stack does not set", None,
                                    f"run `{set_secret_command(secret)}`"))
    if problems:
        raise ConfigError(problems, source)
    return config, tuple(sorted(secrets))


# --- inventory ----------------------------------------------------------------------------------


def parse_inventory(raw: Any, source: str = "") -> Inventory:
    """Validate an inventory document, its device networks and its SSH endpoints (one machine per node); a
    value spelled like a Pulumi marker is refused. Key paths start with ``inventory.``."""
    if not isinstance(raw, dict):
        raise ConfigError.single("inventory", f"the inventory must be a mapping with ssh: and nodes:, got {_type_name(raw)}",
                                 hint="name an inventory file (the facts playbook writes them)", source=source)
    sentinels = sentinel_problems(raw, "inventory")
    try:
        inventory = Inventory.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(sentinels + problems_from_validation(exc, Inventory, prefix="inventory.",
                                                               where="the inventory"), source) from None
    problems = sentinels + inventory.network_problems() + ssh_endpoint_problems(inventory)
    if problems:
        raise ConfigError(problems, source)
    return inventory


def _inventory_key_path(path: tuple[Any, ...]) -> str:
    return "inventory." + _node_path(path) if path else "inventory"


def read_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and validate one inventory file; raises ConfigError naming the key."""
    source = str(path)
    text = read_text(Path(path), "inventory")
    return parse_inventory(parse_yaml(text, "inventory", source, _inventory_key_path), source)


def _stack_key_path(path: tuple[Any, ...]) -> str:
    if len(path) >= 2 and path[0] == "config":
        namespace, _, name = str(path[1]).partition(":")
        rest = _node_path(path[2:])
        if namespace == PROJECT:
            return name + ("" if not rest else rest if rest.startswith("[") else "." + rest)
        return str(path[1])
    return _node_path(path) or "stack"


_STACK_NAME = re.compile(r"[A-Za-z0-9_.-]+\Z")


def _check_stack_name(name: str, base: Path) -> None:
    if not is_dns_label(name):
        known = ", ".join(available_stacks(base)) or "none"
        hint = f"known stacks: {known}" if _STACK_NAME.match(name) else f"e.g. {suggest_label(name)!r}; known stacks: {known}"
        raise ConfigError.single(
            "stack", "a stack name is a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters): "
            "it becomes the ascend-deepseek/stack label and engine ids", name, hint)


def resolve_inventory(base: Path, relative: str) -> Path:
    """The inventory file a stack names: inside the stacks directory once symlinks are resolved."""
    try:
        root = base.resolve()
        target = (root / relative).resolve()
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a symlink loop (pathlib, Python 3.11)
        raise ConfigError.single("inventory", f"the inventory path cannot be resolved ({shorten(str(exc), 80)})",
                                 relative, "name a regular file under stacks/inventories/, not a symlink loop") from None
    if not target.is_relative_to(root):
        raise ConfigError.single("inventory", "the inventory file must be inside the stacks directory "
                                 f"({root}) once symlinks are resolved", relative,
                                 "keep inventories under stacks/inventories/")
    return target


def load_stack(name: str, directory: str | os.PathLike[str] | None = None) -> Stack:
    """Load ``Pulumi.<name>.yaml`` and the inventory it names; raises :class:`ConfigError`."""
    base = stacks_dir(directory)
    _check_stack_name(name, base)
    stack_file = base / f"Pulumi.{name}.yaml"
    if not stack_file.exists() and not stack_file.is_symlink():
        if not base.is_dir():
            what = "does not exist" if not base.exists() else "is not a directory"
            raise ConfigError.single("stacks-dir", f"no stack named {name!r}: the stacks directory {base} {what} (from --stacks-dir, else "
                                     "$ASCEND_DEPLOY_STACKS, else the project's stacks/)",
                                     hint="name the directory that holds Pulumi.<stack>.yaml")
        known = ", ".join(available_stacks(base)) or "none"
        raise ConfigError.single("stack", f"no stack named {name!r} in {base}", hint=f"known stacks: {known}")
    source = str(stack_file)
    document = parse_yaml(read_text(stack_file, "stack"), "stack", source, _stack_key_path)
    if not isinstance(document, dict):
        raise ConfigError.single("stack", f"the stack file must be a mapping with a config: key, got {_type_name(document)}",
                                 hint="write `config:` and the ascend-deepseek: keys under it", source=source)
    unknown = [Problem(str(k), "unknown key of a Pulumi stack file", None,
                       f"valid keys: {', '.join(STACK_FILE_KEYS)}") for k in document if k not in STACK_FILE_KEYS]
    if unknown:
        raise ConfigError(unknown, source)
    if not isinstance(document.get("config"), dict):
        got = "none" if "config" not in document else _type_name(document["config"])
        raise ConfigError.single("config", f"the stack file needs a `config:` mapping (got {got})",
                                 hint="write `config:` and the ascend-deepseek: keys under it", source=source)
    config, secrets = parse_stack_config(document["config"], source)
    inventory_file = resolve_inventory(base, config.inventory)
    try:
        inventory = read_inventory(inventory_file)
    except ConfigError as exc:
        # the file problems name the stack key that chose the file
        problems = [Problem("inventory", p.message, config.inventory, p.hint) if p.path == "inventory" else p
                    for p in exc.problems]
        raise ConfigError(problems, exc.source) from None
    problems = inventory.target_problems(config.target)
    if problems:
        raise ConfigError(problems, str(inventory_file))
    return Stack(
        name=name,
        config=config,
        inventory=inventory,
        stack_file=str(stack_file),
        inventory_file=str(inventory_file),
        secret_keys=secrets,
    )
